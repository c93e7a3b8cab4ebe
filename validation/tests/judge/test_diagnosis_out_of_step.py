"""Ranks whose collectives went out of step (validation/judge/diagnosis/outofstep.py). A user's two-rank gloo run
(12 steps) whose rank 1 all-reduced one float of its own at step 3 (``log_metrics``), where both ranks all-reduce
one float of 'gradients' every step: of the same size, it paired silently with rank 0's all-reduce of step 3, and
each of rank 1's after it with rank 0's of the next step. Rank 0 completed step 12 and exited 0; rank 1 failed in
its all-reduce of step 12 ('Connection closed by peer'). The verdict read 'rank 0 exited 0 (...) — the other ranks
failed without it' and its advice spoke of collectives after the training loop, where the ranks' collectives had
gone out of step inside it: rank 1 failed within a step rank 0 had completed.

Judged from the files a real torchrun run of that trainer left (validation/tests/evidence/gloo2_outofstep_rank1_failed:
torchrun's log trimmed of its own traceback's frames, the heartbeats), and from them cut short where the same ends
mean a rank that exited 0 early or one that exited 0 after the loop; nothing runs here."""
from __future__ import annotations

import json
from pathlib import Path

from validation.contract.files import read_heartbeats
from validation.contract.stacks import Frame
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

RUN = Path(__file__).parents[1] / "evidence" / "gloo2_outofstep_rank1_failed"
#: the step's all-reduce of the gradients, which rank 1 failed in
REGULAR = Frame("/tmp/s16_user/mytrain.py", 30, "main")
PEER = "RuntimeError: Connection closed by peer [127.0.0.1]:24235"


def _beats(until: dict[int, tuple[int, str]] | None = None) -> dict[int, Beat]:
    """Each rank's last heartbeat of the recorded run, its records cut after ``until``'s (step, stage) where given."""
    recs = read_heartbeats(RUN)
    if until is not None:
        recs = {k: rs[:next(i for i, x in enumerate(rs) if (x["step"], x["stage"]) == until[k]) + 1]
                for k, rs in recs.items()}
    return {k: Beat.of(rs) for k, rs in recs.items()}


def _record(beats: dict[int, Beat]) -> PhaseRecord:
    ev = Evidence(rank_failures=rank_failures(RUN / "trainer.stderr.log"), stderr_log="trainer.stderr.log",
                  last_heartbeat=beats)
    return PhaseRecord(PointKey("gloo_mismatch", "cpu", "two_ranks"), "gloo_mismatch/cpu/two_ranks/default", "train",
                       Status.FAIL, "trainer crashed (exit code 1)", steps=12, world_size=2, exit_code=1, evidence=ev,
                       trainer="mytrain")


def _crash(rec: PhaseRecord):
    [f] = [f for f in find([rec]) if f.kind in ("out_of_step", "departed", "left_after")]
    return f


def test_a_rank_that_failed_within_a_step_its_peer_had_completed_before_exiting_0_says_the_collectives_went_out_of_step():
    rec = _record(_beats())
    assert rec.evidence.last_heartbeat == {0: Beat(12, "step", every=1, pid=22510), 1: Beat(12, "backward", every=1,
                                                                                              pid=22511)}
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.step == 12, d
    assert [(at.rank, at.frame, at.site, at.cause) for at in d.ranks] == [(1, "all_reduce", REGULAR, PEER)], d
    assert [(at.rank, at.step, at.stage) for at in d.ended] == [(0, 12, "step")], d
    said = (f"rank 1 failed in all_reduce at s16_user/mytrain.py:30 (main) during step 12 ({PEER}), a step rank 0 had "
            "completed before it exited 0 (last heartbeat step 12, stage step): the ranks' collectives were out of "
            "step: rank 1 had called more collectives than rank 0 by then, one of its own that rank 0 never called or "
            "one rank 0 skipped, earlier in the run; which, and at which step, these files do not tell")
    assert verdict_line(rec) == f"{said} — trainer crashed (exit code 1)", verdict_line(rec)
    crash = _crash(rec)
    assert crash.kind == "out_of_step" and crash.title == (
        f"collectives out of step in two_ranks [default]: exit code 1: {said}"), crash.title
    assert "rank 0: last heartbeat step 12, stage step; exited 0 (torchrun reports no failure of it)" in crash.detail
    [advice] = recommendations([crash])
    assert "collective called on some ranks only" in advice and "TORCH_DISTRIBUTED_DEBUG: DETAIL" in advice, advice
    assert "does not catch an extra collective of the same op and shape" in advice, advice
    assert "after the training loop" not in advice, advice


def test_a_rank_that_exited_0_before_the_step_its_peer_failed_in_left_early():
    """Rank 0 exited 0 at step 4 of 12, rank 1 failed in step 5's all-reduce without it: rank 0 never completed the
    step rank 1 failed in, so nothing says the collectives went out of step: an early exit, in its own words."""
    rec = _record(_beats({0: (4, "step"), 1: (5, "backward")}))
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and [at.rank for at in d.ranks] == [0] and not d.ended, d
    assert verdict_line(rec) == ("rank 0 exited 0 early (last heartbeat step 4, stage step) — the other ranks failed "
                                 "without it (exit code 1)"), verdict_line(rec)
    assert _crash(rec).kind == "departed"


def test_a_rank_that_failed_after_its_last_step_failed_in_a_collective_after_the_loop():
    """Both ranks completed step 12 and rank 1 then failed in a collective (a final barrier that rank 0, exited 0,
    never called): the collectives went apart after the loop, as the words for an exit before the others say."""
    rec = _record(_beats({0: (12, "step"), 1: (11, "step")}))
    rec.evidence.last_heartbeat[1] = Beat(12, "step", every=1, pid=22511)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.ENDED and [at.rank for at in d.ranks] == [0], d
    assert verdict_line(rec) == ("rank 0 exited 0 (last heartbeat step 12, stage step) — the other ranks failed "
                                 "without it (exit code 1)"), verdict_line(rec)
    crash = _crash(rec)
    assert crash.kind == "left_after"
    [advice] = recommendations([crash])
    assert "same collectives after the training loop" in advice, advice


def test_a_rank_whose_records_mark_no_steps_end_says_nothing_of_being_within_the_step(tmp_path):
    """The seed's format (rank 1 beats only as each step starts): its last record of step 12 does not say it had
    not completed the step, so it may have failed after the loop: the words of an exit before the others."""
    for k, recs in read_heartbeats(RUN).items():
        kept = [x for x in recs if k == 0 or x["stage"] == "forward"]
        (tmp_path / f"heartbeat_rank{k}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in kept))
    beats = {k: Beat.of(recs) for k, recs in read_heartbeats(tmp_path).items()}
    assert not beats[1].ends_steps and beats[1].step == 12, beats
    d = diagnose(_record(beats))
    assert d is not None and d.kind == Kind.ENDED and [at.rank for at in d.ranks] == [0], d
