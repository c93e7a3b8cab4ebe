"""A rank waits for the others only where its innermost frames are a collective's
(validation/judge/diagnosis/collectives.py ``in_collective``), not wherever a torch/distributed frame lies in its
stack: torchrun users wrap their main in ``torch.distributed.elastic.multiprocessing.errors.record``,
whose frame is at the bottom of every rank's stack. A two-rank gloo run whose rank 1 slept in its own
code at step 3 (validation/tests/record_trainer.py) was read as two ranks waiting, 'rank 0 stalled in
all_reduce; rank 1 stalled in stuck_in_own_code', the hung rank named like the one waiting for it.

The stacks are py-spy's dumps of that run (the harness's harness_stacks/rank{R}.txt), read as the
harness reads them."""
from __future__ import annotations

import pytest

from validation.contract.stacks import StackDump, TakenStack, main_thread_frames, parse_pyspy
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.collectives import hung_ranks, in_collective
from validation.judge.findings import find
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

_SITE = "/v/lib/python3.11/site-packages"
_RECORD = f"    record.<locals>.wrap.<locals>.wrapper ({_SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py:367)"
_BOTTOM = f"""{_RECORD}
    <module> (/u/train.py:76)
    _run_code (<frozen runpy>:88)
    _run_module_as_main (<frozen runpy>:198)
"""


def _dump(rank: int, frames: str) -> StackDump:
    text = (f"Process {4200 + rank}: /v/bin/python3 -u -m train\nPython v3.11.7 (/v/bin/python3.11)\n\n"
            f'Thread {4200 + rank} (idle): "MainThread"\n' + frames + _BOTTOM)
    return StackDump(f"harness_stacks/rank{rank}.txt", main_thread_frames(parse_pyspy(text)), source="py-spy",
                     pid=4200 + rank)


ALL_REDUCE_FRAMES = f"""    all_reduce ({_SITE}/torch/distributed/distributed_c10d.py:3252)
    _exception_logger.<locals>.wrapper ({_SITE}/torch/distributed/c10d_logger.py:83)
    main (/u/train.py:65)
"""
#: rank 0: waiting in the step's all-reduce, which rank 1 never joined
ALL_REDUCE = _dump(0, ALL_REDUCE_FRAMES)
#: rank 1: asleep in a loop of its own (time.sleep is C: py-spy shows the Python frame calling it)
SLEEPING = _dump(1, """    stuck_in_own_code (/u/train.py:31)
    main (/u/train.py:64)
""")
#: a rank stuck in its data loader: waiting on its workers' queue, no peer
LOADER = _dump(1, f"""    wait (/usr/lib/python3.11/threading.py:331)
    get (/usr/lib/python3.11/queue.py:180)
    _try_get_data ({_SITE}/torch/utils/data/dataloader.py:1251)
    _get_data ({_SITE}/torch/utils/data/dataloader.py:1412)
    _next_data ({_SITE}/torch/utils/data/dataloader.py:1451)
    __next__ ({_SITE}/torch/utils/data/dataloader.py:733)
    main (/u/train.py:58)
""")
#: a functional collective's wait: the dispatcher's frame lies above the collective's own
FUNCTIONAL_WAIT = _dump(0, f"""    __call__ ({_SITE}/torch/_ops.py:1243)
    wait_tensor ({_SITE}/torch/distributed/_functional_collectives.py:144)
    main (/u/train.py:65)
""")
#: FSDP's forward calls the model: a rank inside the model's code waits for no one
IN_FSDP_MODEL = _dump(1, f"""    forward (/u/model.py:40)
    _call_impl ({_SITE}/torch/nn/modules/module.py:1784)
    forward ({_SITE}/torch/distributed/fsdp/fully_sharded_data_parallel.py:854)
    _call_impl ({_SITE}/torch/nn/modules/module.py:1784)
    main (/u/train.py:60)
""")


def _record(stacks: dict[int, StackDump], beats: dict[int, Beat]) -> PhaseRecord:
    ev = Evidence(stackdumps=stacks, last_heartbeat=beats,
                  taken_stacks=[TakenStack(d.pid, r, "RANK", "py-spy", d.path) for r, d in stacks.items()])
    return PhaseRecord(PointKey("rb", "cpu", "hang"), "rb/cpu/hang/default", "train", Status.FAIL, "stalled",
                       steps=40, world_size=2, stalled_s=8.0, evidence=ev)


@pytest.mark.parametrize("dump, waits", [(ALL_REDUCE, True), (FUNCTIONAL_WAIT, True), (SLEEPING, False),
                                         (LOADER, False), (IN_FSDP_MODEL, False)],
                         ids=["all_reduce", "functional-wait", "own-sleep", "data-loader", "fsdp-model-code"])
def test_a_rank_under_record_waits_only_where_its_innermost_frames_are_a_collectives(dump, waits):
    assert dump.frames[-4].file.endswith("errors/__init__.py")  # @record's frame at the bottom of each
    assert in_collective(dump) is waits


@pytest.mark.parametrize("hung", [SLEEPING, LOADER], ids=["own-sleep", "data-loader"])
def test_a_rank_hung_in_its_own_code_under_record_is_named_apart_from_the_rank_waiting_for_it(hung):
    """Both ranks' heartbeats end at step 3, stage backward (rank 1 hung after its record of the stage,
    before the all-reduce): only the stacks tell which rank is hung."""
    rec = _record({0: ALL_REDUCE, 1: hung}, {0: Beat(3, "backward"), 1: Beat(3, "backward")})
    assert hung_ranks(rec.evidence.stackdumps, rec.evidence.last_heartbeat) == [1]
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1], d
    [stall] = find([rec])
    assert stall.title.endswith(f": hung: rank 1 in {hung.frames[0].func}; waiting for it: rank 0 in all_reduce"), \
        stall.title


def test_ranks_all_waiting_in_the_collective_under_record_name_no_hung_rank():
    """Every rank in the all-reduce (under @record) and none behind: nothing tells which to blame."""
    other = _dump(1, ALL_REDUCE_FRAMES)
    assert hung_ranks({0: ALL_REDUCE, 1: other}, {0: Beat(3, "backward"), 1: Beat(3, "backward")}) == []

