"""Ranks inside an import when a run stalls (validation/contract/stacks.py ``import_under_way``,
validation/judge/diagnosis/stall.py): torch's own code running as a torch.distributed module is imported
waits for no peer, and where every rank found running was importing, none is blamed as hung and none as
waiting for it (Kind.IMPORTING). Frames from a two-rank torchrun start-up on a busy machine (py-spy,
trimmed): rank 0 importing torch.distributed.tensor._ops (its ops registered at import), rank 1 in
dataclasses' code under another torch module's import, both begun by the trainer's optimizer, whose
construction imports torch._dynamo."""
from __future__ import annotations

import json
from dataclasses import replace

from validation.contract.stacks import Frame, StackDump, TakenStack, import_under_way
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.collectives import in_collective
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status
from validation.judge.record import _dump as stored_dump
from validation.judge.record import _plain

_SITE = "/v/lib/python3.11/site-packages"
_BOOT, _EXT = "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"
_MACHINERY = [Frame(_BOOT, 241, "_call_with_frames_removed"), Frame(_EXT, 940, "_LoaderBasics.exec_module"),
              Frame(_BOOT, 690, "_load_unlocked"), Frame(_BOOT, 1147, "_find_and_load_unlocked"),
              Frame(_BOOT, 1176, "_find_and_load")]
_TRAINER_LINE = Frame("/u/train.py", 19, "<module>")
#: below the outermost import: torch.optim's lazy import of torch._dynamo, called from the trainer's line
_BEGUN = [Frame(f"{_SITE}/torch/_compile.py", 47, "_disable_dynamo.<locals>.inner"),
          Frame(f"{_SITE}/torch/optim/sgd.py", 63, "SGD.__init__"), _TRAINER_LINE]
_OPS = Frame(f"{_SITE}/torch/distributed/tensor/_ops/__init__.py", 13, "<module>")
RANK0 = [Frame(f"{_SITE}/torch/distributed/tensor/_ops/single_dim_strategy.py", 571, "_get_overload_packet"),
         Frame(f"{_SITE}/torch/distributed/tensor/_ops/autogen.py", 238, "_find_inplace_variant_overloads"),
         Frame(f"{_SITE}/torch/distributed/tensor/_ops/autogen.py", 527, "auto_register_op_variants"),
         _OPS, *_MACHINERY, Frame(f"{_SITE}/torch/distributed/tensor/__init__.py", 4, "<module>"), *_MACHINERY,
         *_BEGUN]
_API = Frame(f"{_SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_api.py", 13, "<module>")
RANK1 = [Frame("/py/lib/python3.11/dataclasses.py", 433, "_create_fn"),
         Frame("/py/lib/python3.11/dataclasses.py", 580, "_init_fn"),
         Frame("/py/lib/python3.11/dataclasses.py", 1027, "_process_class"),
         Frame("/py/lib/python3.11/dataclasses.py", 1220, "dataclass.<locals>.wrap"), _API, *_MACHINERY, *_BEGUN]
#: where a rank that reached its process group waits for the others
INIT = [Frame(f"{_SITE}/torch/distributed/distributed_c10d.py", 1600, "init_process_group"),
        Frame("/u/train.py", 12, "<module>")]


def _dump(rank: int, frames: list[Frame]) -> StackDump:
    """As the harness reads a py-spy dump: the innermost 8 frames kept, the import read from all."""
    return StackDump(f"harness_stacks/rank{rank}.txt", frames[:8], None, "py-spy", 100 + rank, import_under_way(frames))


def _stalled(stacks: dict[int, list[Frame]]) -> PhaseRecord:
    ev = Evidence(stackdumps={k: _dump(k, f) for k, f in stacks.items()},
                  taken_stacks=[TakenStack(100 + k, k, "RANK", "py-spy", f"harness_stacks/rank{k}.txt") for k in stacks])
    return PhaseRecord(PointKey("mine", "cpu", "train"), "mine/cpu/train/default", "train", Status.FAIL,
                       "stalled: no progress for 8s before its first step (start-up); stacks taken and the run killed "
                       "by the harness", steps=10, world_size=len(stacks), stalled_s=8.0, evidence=ev)


def test_the_import_a_stack_runs_is_read_from_all_its_frames():
    rank0 = import_under_way(RANK0)
    assert rank0.module == _OPS and rank0.origin == _TRAINER_LINE and rank0.torch_code
    rank1 = import_under_way(RANK1)
    assert rank1.module == _API and rank1.origin == _TRAINER_LINE and not rank1.torch_code  # the stdlib's frames
    # the machinery itself running (reading or compiling the module): no module body yet
    compiling = import_under_way([Frame(_EXT, 729, "_compile_bytecode"), *_MACHINERY, _TRAINER_LINE])
    assert compiling.module is None and compiling.origin == _TRAINER_LINE and not compiling.torch_code
    by_name = import_under_way([Frame("/u/plugin.py", 3, "<module>"), *_MACHINERY[:3],
                                Frame("/py/lib/python3.11/importlib/__init__.py", 126, "import_module"), _TRAINER_LINE])
    assert by_name.origin == _TRAINER_LINE  # importlib.import_module is the machinery's entry, not the origin
    assert import_under_way(INIT) is None


def test_torchs_code_at_import_is_no_collective_a_collective_called_at_import_is():
    """Rank 0's frames under torch/distributed/ are its import-time code: no wait for a peer. A collective
    that the trainer's own module calls as it is imported is one."""
    assert not in_collective(_dump(0, RANK0))
    barrier_at_import = [Frame(f"{_SITE}/torch/distributed/distributed_c10d.py", 4800, "barrier"),
                         Frame("/u/mypkg/__init__.py", 7, "<module>"), *_MACHINERY, _TRAINER_LINE]
    assert in_collective(_dump(0, barrier_at_import)) and in_collective(_dump(0, INIT))


def test_every_rank_importing_is_named_so_none_as_hung_or_waiting():
    rec = _stalled({0: RANK0, 1: RANK1})
    d = diagnose(rec)
    assert d.kind == Kind.IMPORTING and [at.rank for at in d.ranks] == [0, 1]
    assert [(at.importing.module, at.importing.origin) for at in d.ranks] == [(_OPS, _TRAINER_LINE),
                                                                              (_API, _TRAINER_LINE)]
    assert verdict_line(rec).startswith(
        "every rank found running was still importing, none waiting for another: rank 0 "
        "torch.distributed.tensor._ops (line 13; imported from u/train.py:19; no heartbeat written); rank 1 "
        "torch.distributed.fsdp._fully_shard._fsdp_api (line 13; imported from u/train.py:19; no heartbeat written) — "
        "stalled:"), verdict_line(rec)
    [stall] = [f for f in find([rec]) if f.phase == "train" and f.kind == "importing"]
    assert "still importing" in stall.title and "waiting for it" not in stall.title, stall.title


def test_a_rank_importing_while_the_other_waits_in_its_process_group_is_the_one_it_waits_for():
    """The hung rank's line and finding say it was still importing, and what."""
    rec = _stalled({0: INIT, 1: RANK1})
    d = diagnose(rec)
    assert d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1] and d.ranks[0].importing.module == _API
    said = ("rank 1 hung in _create_fn, still importing torch.distributed.fsdp._fully_shard._fsdp_api (line 13; "
            "imported from u/train.py:19)")
    assert verdict_line(rec).startswith(said), verdict_line(rec)
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert ": hung: rank 1 in _create_fn, still importing torch.distributed.fsdp._fully_shard._fsdp_api (line 13; " \
           "imported from u/train.py:19); waiting for it: rank 0 in init_process_group" in stall.title, stall.title


def test_the_import_is_kept_with_the_record_and_read_from_the_frames_of_an_older_one():
    dump = _dump(0, RANK0)
    stored = json.loads(json.dumps(_plain(dump)))
    assert stored_dump(stored) == dump
    # an older record kept its innermost frames only and no import: read from them where they reach it
    del stored["importing"]
    older = stored_dump(stored).importing
    assert older.module == _OPS and older.torch_code and older.origin is None  # its 8 frames end in the machinery



def test_the_advice_of_a_start_up_stall_whose_hung_rank_was_importing_sends_the_reader_to_startup_s():
    from validation.judge.findings import recommendations

    importing = "\n".join(recommendations(find([_stalled({0: INIT, 1: RANK1})])))
    assert "still importing" in importing and "startup_s" in importing and "rank-dependent branch" not in importing
    elsewhere = [Frame("/u/data.py", 40, "download_shards"), Frame("/u/train.py", 11, "<module>")]
    other = "\n".join(recommendations(find([_stalled({0: INIT, 1: elsewhere})])))
    assert "rank-dependent branch" in other and "startup_s" not in other


def test_processes_of_rank_unknown_all_importing_are_each_named_by_their_own_stack():
    """A trainer's own dumps that do not say their rank: each such process with its own import."""
    rec = _stalled({})
    plain = [Frame("/u/slow_plugin.py", 2, "<module>"), *_MACHINERY, _TRAINER_LINE]
    unranked = [StackDump(f"stackdump_unranked{i}.txt", f[:8], None, "trainer", None, import_under_way(f))
                for i, f in enumerate((RANK0, plain))]
    rec = replace(rec, world_size=2, evidence=replace(rec.evidence, unranked_stacks=unranked))
    d = diagnose(rec)
    assert d.kind == Kind.IMPORTING and [at.importing.module for at in d.ranks] == [_OPS, plain[0]]
