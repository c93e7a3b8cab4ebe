"""A rank that waits for its DataLoader's worker processes (validation/contract/stacks.py ``loader_wait``):
blamed as hung, it is named with the stacks the harness took of its helpers (Evidence.helper_stacks), or
said to have none; the helpers' stacks are kept with the record."""
from __future__ import annotations

import json

from validation.contract.stacks import Frame, StackDump, TakenStack, import_under_way, loader_wait
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status, _plain

_SITE = "/v/lib/python3.11/site-packages"
_LOADER = f"{_SITE}/torch/utils/data/dataloader.py"
#: rank 1 under a Hugging Face Trainer's loop: the wait is deeper than the frames a dump keeps
WAITING = [Frame("/py/lib/python3.11/selectors.py", 415, "_PollLikeSelector.select"),
           Frame("/py/lib/python3.11/multiprocessing/connection.py", 947, "wait"),
           Frame("/py/lib/python3.11/multiprocessing/connection.py", 440, "Connection._poll"),
           Frame("/py/lib/python3.11/multiprocessing/connection.py", 257, "_ConnectionBase.poll"),
           Frame("/py/lib/python3.11/multiprocessing/queues.py", 113, "Queue.get"),
           Frame(f"{_SITE}/accelerate/data_loader.py", 560, "DataLoaderShard.__iter__"),
           Frame(f"{_SITE}/accelerate/data_loader.py", 550, "DataLoaderShard._fetch"),
           Frame(f"{_SITE}/accelerate/data_loader.py", 540, "DataLoaderShard._next"),
           Frame(_LOADER, 1291, "_MultiProcessingDataLoaderIter._try_get_data"),
           Frame(_LOADER, 725, "_BaseDataLoaderIter.__next__"), Frame("/u/train.py", 54, "main")]
WORKER = [Frame("/py/lib/python3.11/socket.py", 718, "SocketIO.readinto"),
          Frame("/u/shards.py", 31, "Shards.__getitem__"),
          Frame(f"{_SITE}/torch/utils/data/_utils/fetch.py", 54, "_MapDatasetFetcher.fetch"),
          Frame(f"{_SITE}/torch/utils/data/_utils/worker.py", 374, "_worker_loop")]
ALL_REDUCE = [Frame(f"{_SITE}/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
              Frame("/u/train.py", 62, "main")]


def _dump(path: str, frames: list[Frame], pid: int) -> StackDump:
    return StackDump(path, frames[:8], None, "py-spy", pid, import_under_way(frames), loader_wait(frames))


def _record(helpers: dict[int, list[StackDump]]) -> PhaseRecord:
    ev = Evidence(stackdumps={0: _dump("harness_stacks/rank0.txt", ALL_REDUCE, 10),
                              1: _dump("harness_stacks/rank1.txt", WAITING, 11)}, helper_stacks=helpers,
                  taken_stacks=[TakenStack(10, 0, "RANK", "py-spy", "harness_stacks/rank0.txt"),
                                TakenStack(11, 1, "RANK", "py-spy", "harness_stacks/rank1.txt")])
    return PhaseRecord(PointKey("mine", "cpu", "train"), "mine/cpu/train/default", "train", Status.FAIL,
                       "stalled: no progress for 8s after step 3; stacks taken and the run killed by the harness",
                       steps=10, world_size=2, stalled_s=8.0, evidence=ev)


def test_a_rank_waiting_for_its_data_loader_is_named_with_its_workers_stacks():
    worker = _dump("harness_stacks/rank1_helper44.txt", WORKER, 44)
    rec = _record({1: [worker]})
    assert rec.evidence.stackdumps[1].loader.func == "_MultiProcessingDataLoaderIter._try_get_data"
    d = diagnose(rec)
    assert d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1] and d.ranks[0].workers == (worker,)
    assert verdict_line(rec).startswith(
        "rank 1 hung in _PollLikeSelector.select, waiting for its data loader's workers: pid 44 in "
        "SocketIO.readinto (python3.11/socket.py:718), under Shards.__getitem__ (u/shards.py:31)"), verdict_line(rec)
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert any(line.startswith("rank 1's helper pid 44 (a process below it): stack (harness_stacks/rank1_helper44.txt")
               for line in stall.detail), stall.detail
    stored = Evidence.from_json(json.loads(json.dumps(_plain(rec.evidence))))
    assert stored.helper_stacks == {1: [worker]} and stored.stackdumps[1].loader == rec.evidence.stackdumps[1].loader


def test_without_a_stack_of_its_workers_the_wait_is_said():
    assert ", waiting for its data loader's workers (no stack of them was taken)" in verdict_line(_record({}))


def test_the_helpers_of_a_rank_that_waits_for_no_data_loader_are_not_listed():
    """A compiler's workers idle in their pool below rank 0 (waiting in all_reduce): nothing to say."""
    idle = _dump("harness_stacks/rank0_helper45.txt", WAITING[:5], 45)
    [stall] = [f for f in find([_record({0: [idle]})]) if f.kind == "stall"]
    assert not any("rank 0's helper" in line for line in stall.detail), stall.detail


def test_the_advice_of_a_rank_waiting_for_its_data_loader_sends_the_reader_to_its_worker():
    from validation.judge.findings import recommendations

    advice = "\n".join(recommendations(find([_record({1: [_dump("harness_stacks/rank1_helper44.txt", WORKER, 44)]})])))
    assert "DataLoader's worker processes" in advice and "`timeout`" in advice and "rank-dependent" not in advice
