"""Ranks whose collectives went apart (validation/judge/diagnosis/collectives.py ``apart``): every rank waits in a
collective, not all in the same one. A user's two-rank gloo run whose rank 1 called an all-reduce of
its own at step 3 (on a side group rank 0 never joins) left rank 1 waiting there and rank 0 waiting
in the step's regular all-reduce; the verdict read 'rank 0 stalled in all_reduce (...); rank 1 stalled
in all_reduce (...)', the two call sites nowhere but in the stack lines. Where a majority of the
ranks waits at one place, the others are named as off the common path; where none does (two ranks),
every rank is named at its call site and nothing is guessed."""
from __future__ import annotations

import pytest

from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.collectives import call_site
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

_TORCH = "/v/lib/python3.11/site-packages/torch"
_C10D = [Frame(f"{_TORCH}/distributed/distributed_c10d.py", 3252, "all_reduce"),
         Frame(f"{_TORCH}/distributed/c10d_logger.py", 83, "_exception_logger.<locals>.wrapper")]
_MODULE = Frame("/u/train.py", 64, "<module>")
#: the step's own all-reduce, which every rank calls
REGULAR = [*_C10D, Frame("/u/train.py", 48, "main"), _MODULE]
#: an all-reduce of one rank's own, the others never call
EXTRA = [*_C10D, Frame("/u/train.py", 19, "sync_metrics"), Frame("/u/train.py", 46, "main"), _MODULE]


def _dump(rank: int, frames: list[Frame]) -> StackDump:
    return StackDump(f"harness_stacks/rank{rank}.txt", frames, None, "py-spy", 100 + rank)


def _record(frames: dict[int, list[Frame]], beats: dict[int, Beat] | None = None) -> PhaseRecord:
    stacks = {k: _dump(k, f) for k, f in frames.items()}
    beats = beats if beats is not None else {k: Beat(3, "backward", every=1) for k in frames}
    ev = Evidence(stackdumps=stacks, last_heartbeat=beats,
                  taken_stacks=[TakenStack(d.pid, k, "RANK", "py-spy", d.path) for k, d in stacks.items()])
    return PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL,
                       "stalled: no progress for 10s after step 2; stacks taken and the run killed by the harness",
                       steps=8, world_size=len(frames), stalled_s=10.0, evidence=ev)


def _stall(rec: PhaseRecord):
    [f] = [f for f in find([rec]) if f.title.startswith("stall in")]
    return f


def test_the_call_site_is_the_innermost_frame_outside_torch():
    assert call_site(_dump(1, EXTRA)) == Frame("/u/train.py", 19, "sync_metrics")
    assert call_site(_dump(0, REGULAR)) == Frame("/u/train.py", 48, "main")
    assert call_site(_dump(0, _C10D)) is None


@pytest.mark.parametrize("off", [0, 1, 2])
def test_of_three_ranks_the_one_in_a_collective_of_its_own_is_named_off_the_common_path(off):
    """Whichever rank it is: rank 0 too, never the lowest or the highest rank by rule."""
    rec = _record({k: EXTRA if k == off else REGULAR for k in range(3)})
    d = diagnose(rec)
    common = [k for k in range(3) if k != off]
    assert d is not None and d.kind == Kind.DIVERGED, d
    assert [at.rank for at in d.ranks] == [off] and [at.rank for at in d.common] == common, d
    assert d.ranks[0].site == Frame("/u/train.py", 19, "sync_metrics") and d.ranks[0].frame == "all_reduce"
    assert {at.site for at in d.common} == {Frame("/u/train.py", 48, "main")}
    said = (f"rank {off} is in a collective the other ranks never reached: all_reduce at u/train.py:19 (sync_metrics; "
            f"last heartbeat step 3, stage backward); ranks {', '.join(map(str, common))} wait in all_reduce at "
            "u/train.py:48 (main; last heartbeat step 3, stage backward)")
    assert verdict_line(rec) == f"{said} — {rec.reason}", verdict_line(rec)
    stall = _stall(rec)
    assert stall.kind == "diverged" and stall.diagnosis == d
    assert stall.title == f"stall in ddp [default] (no progress for 10s, stopped by the harness): {said}", stall.title
    # the stacks that show it: the rank off the path first, then those it left
    assert [f.rsplit("/", 1)[-1] for f in d.files] == [f"rank{k}.txt" for k in [off, *common]], d.files


def test_the_advice_of_ranks_apart_says_where_to_look_and_how_torch_can_check_it():
    [advice] = recommendations([_stall(_record({0: REGULAR, 1: EXTRA, 2: REGULAR}))])
    assert "start at its call site" in advice and "TORCH_DISTRIBUTED_DEBUG: DETAIL" in advice, advice


def test_of_two_ranks_at_different_call_sites_both_are_named_and_neither_is_blamed():
    """An extra collective on rank 1 reads the same as one missing on rank 0: no rank is singled out."""
    rec = _record({0: REGULAR, 1: EXTRA})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.APART and [at.rank for at in d.ranks] == [0, 1] and not d.common, d
    assert [at.site.line for at in d.ranks] == [48, 19]
    said = ("ranks 0, 1 wait in different collectives: rank 0 in all_reduce at u/train.py:48 (main; last heartbeat "
            "step 3, stage backward); rank 1 in all_reduce at u/train.py:19 (sync_metrics; last heartbeat step 3, "
            "stage backward): nothing tells which of the two left the common path (a collective extra on one reads "
            "the same as one missing on the other)")
    assert verdict_line(rec) == f"{said} — {rec.reason}", verdict_line(rec)
    assert _stall(rec).kind == "diverged"


def test_with_no_majority_at_one_place_no_rank_is_blamed():
    rec = _record({0: REGULAR, 1: EXTRA, 2: EXTRA, 3: REGULAR})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.APART and [at.rank for at in d.ranks] == [0, 1, 2, 3], d
    assert "no majority of the ranks waits at one place" in verdict_line(rec), verdict_line(rec)


def test_ranks_all_at_one_call_site_and_step_keep_the_stalled_wording():
    rec = _record({0: REGULAR, 1: REGULAR})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.STALLED and [at.rank for at in d.ranks] == [0, 1], d
    assert verdict_line(rec).startswith("rank 0 stalled in all_reduce (last heartbeat step 3, stage backward); rank 1 "
                                        "stalled in all_reduce (last heartbeat step 3, stage backward) — "), \
        verdict_line(rec)
    assert _stall(rec).kind == "stall"


def test_of_three_ranks_at_one_call_site_the_one_a_step_ahead_is_off_the_common_path():
    """It went past the step's collectives the others wait in: it did not call them."""
    rec = _record({k: REGULAR for k in range(3)},
                  {0: Beat(3, "backward", every=1), 1: Beat(4, "backward", every=1), 2: Beat(3, "backward", every=1)})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.DIVERGED and [at.rank for at in d.ranks] == [1], d
    assert verdict_line(rec).startswith("rank 1 is in a collective at another step than the other ranks: all_reduce at "
                                        "u/train.py:48 (main; last heartbeat step 4, stage backward); ranks 0, 2 wait"), \
        verdict_line(rec)


def test_steps_of_ranks_that_beat_every_few_steps_tell_nothing():
    """A last record two steps apart in records written every 5 steps: the ranks may be at one step."""
    rec = _record({k: REGULAR for k in range(3)},
                  {0: Beat(10, "step", every=5), 1: Beat(5, "step", every=5), 2: Beat(10, "step", every=5)})
    d = diagnose(rec)
    assert d is None or d.kind != Kind.DIVERGED, d


def test_a_rank_outside_the_collectives_is_still_the_hung_one():
    own = [Frame("/u/train.py", 30, "load_batch"), Frame("/u/train.py", 40, "main"), _MODULE]
    rec = _record({0: REGULAR, 1: own, 2: EXTRA})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1], d


def test_over_two_nodes_no_node_is_said_to_hang_where_a_rank_went_a_step_ahead():
    """The node finding read the ranks a step behind as hung and the rank ahead as waiting for them."""
    from validation.judge.nodes import NodeEvidence, NodesEvidence

    rec = _record({k: REGULAR for k in range(3)},
                  {0: Beat(3, "backward", every=1), 1: Beat(3, "backward", every=1), 2: Beat(4, "backward", every=1)})
    rec.evidence.nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0, 1]),
        NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [2])])
    found = find([rec])
    assert not [f for f in found if f.kind.startswith("node_hung")], [f.title for f in found]
    assert _stall(rec).title.endswith(": node 1's rank 2 is in a collective at another step than the other ranks: "
                                      "all_reduce at u/train.py:48 (main; last heartbeat step 4, stage backward); "
                                      "node 0's rank 0, node 0's rank 1 wait in all_reduce at u/train.py:48 (main; last heartbeat step 3, "
                                      "stage backward)"), _stall(rec).title
