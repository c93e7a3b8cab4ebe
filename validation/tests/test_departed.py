"""A rank that exited 0 early is named only where the evidence says so (judge/findings/departed.py):
torchrun listed the others' failures and not it, or the harness found no process of it when it
stopped the run while another rank ran or had failed; never a rank that finished its steps, never
beside a process of unknown rank, never when a rank failed in its own right."""
from __future__ import annotations

from validation.contract.stacks import TakenStack
from validation.contract.torchrun_log import RankFailure
from validation.judge.findings.departed import departed, departure
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.judge.verdict import Outcome, verdict

PEER = RankFailure(exception="RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1", exit_code=1)


def _record(failures: dict[int, RankFailure], beats: dict[int, int], *, stalled: bool = False,
            taken: tuple[TakenStack, ...] = ()) -> PhaseRecord:
    ev = Evidence(rank_failures=failures, taken_stacks=list(taken),
                  last_heartbeat={k: Beat(step, "forward") for k, step in beats.items()})
    return PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL, "x", steps=8,
                       world_size=2, exit_code=None if stalled else 1, stalled_s=10.0 if stalled else None,
                       evidence=ev)


def _taken(rank: int | None, pid: int = 7) -> TakenStack:
    return TakenStack(pid, rank, "RANK" if rank is not None else "", "py-spy")


def test_a_rank_torchrun_lists_no_failure_of_beside_a_peers_broken_collective_left_early():
    rec = _record({0: PEER}, {0: 3, 1: 2})
    assert departed(rec) == [1]
    assert departure(rec, [1]) == "rank 1 exited 0 early (last heartbeat step 2 of 8, stage forward)"


def test_no_rank_left_early_where_a_rank_failed_in_its_own_right_or_torchrun_stopped_each():
    assert departed(_record({1: RankFailure(exception="ValueError: bad batch")}, {0: 3, 1: 3})) == []
    assert departed(_record({0: PEER, 1: RankFailure(signal="SIGTERM", exit_code=-15)}, {0: 3, 1: 3})) == []


def test_a_stopped_run_names_the_rank_it_found_no_process_of():
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0),))) == [1]
    assert departed(_record({0: PEER}, {0: 3, 1: 2}, stalled=True)) == [1]  # its peer failed, then nothing ran


def test_a_rank_that_finished_its_steps_or_may_be_a_process_of_unknown_rank_did_not_leave_early():
    assert departed(_record({}, {0: 8, 1: 8}, stalled=True, taken=(_taken(0),))) == []  # rank 0 hung after
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0), _taken(None, 9)))) == []
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True)) == []  # nothing ran and nothing failed: no contrast


def test_a_stall_with_no_rank_left_running_does_not_say_stacks_were_taken():
    """Node 1's rank exited 0 and node 0's failed after it; node 1's agent waited at torchrun's
    exit barrier until the stall watch stopped the run: no rank's stack to take, and the verdict
    had said 'stacks taken'."""
    gone = Outcome("train", stalled_s=16.0, steps_requested=8, steps_completed=3, stacks_tried=0)
    assert verdict(gone, []) == (Status.FAIL, "stalled: no progress for 16s after step 3; no rank was left running "
                                              "to take a stack of and the run killed by the harness")
    hung = Outcome("train", stalled_s=16.0, steps_requested=8, steps_completed=3, stacks_tried=2)
    assert "; stacks taken and the run killed by the harness" in verdict(hung, [])[1]
    rec = _record({0: PEER}, {0: 3, 1: 2}, stalled=True)
    assert Outcome.of_record(rec).stacks_tried == 0
    assert Outcome.of_record(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0),))).stacks_tried == 1
