"""A rank whose heartbeats stopped while the other ranks went on (validation/judge/seen.py
``RankSilence``, as the harness's watch recorded it) is named hung, by its rank, its last step, how
long it was silent and how far the others went: by the stall finding, the verdict and the verdict
line, and by the finding of a run the phase's timeout stopped, which otherwise read 'timed out ...
while still progressing' (the others' steps still came). The run through the real launcher:
validation/tests/launch/test_launch_stall.py."""
from __future__ import annotations

import dataclasses

from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status, Summary
from validation.judge.seen import RankSilence
from validation.judge.verdict import Outcome, verdict

#: rank 1 silent within its first step for 40 s (no stall: start-up), rank 0 on to step 800
WITHIN_FIRST = RankSilence(1, 1, 40.0, {0: 800}, left_behind=False)


def _timed_out(*silent: RankSilence) -> PhaseRecord:
    """Two ranks the 90 s timeout stopped, rank 0's last new step 0.1 s before it; rank 1 in
    ``wait_here``, both stacks taken."""
    frames = [Frame("/x/train.py", 7, "wait_here"), Frame("/x/train.py", 20, "main")]
    dump = StackDump("harness_stacks/rank1.txt", frames, source="py-spy", pid=12)
    ev = Evidence(last_heartbeat={0: Beat(800, "step"), 1: Beat(1, "forward")}, stderr_log="trainer.stderr.log",
                  stackdumps={1: dump}, taken_stacks=[TakenStack(11, 0, "RANK", "py-spy"),
                                                      TakenStack(12, 1, "RANK", "py-spy", dump.path)],
                  files=["heartbeat_rank0.jsonl", "heartbeat_rank1.jsonl", "training.csv"],
                  silent_ranks=list(silent))
    rec = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL, "", steps=2000,
                      world_size=2, timed_out=True, timeout_quiet_s=0.1, timeout_s=90.0, out_dir="runs/ddp",
                      metrics=Summary(steps_completed=800, step_time_s_mean=0.05), evidence=ev)
    status, reason = verdict(Outcome.of_record(rec), [])
    return dataclasses.replace(rec, status=status, reason=reason)


def test_a_timeout_that_found_a_rank_silent_names_it_hung_not_the_run_still_progressing():
    rec = _timed_out(WITHIN_FIRST)
    assert not rec.progressing_at_timeout
    assert rec.reason == ("timed out: killed by the harness at the phase timeout; rank 1 hung at step 1: its heartbeats "
                          "showed no new step for 40s while rank 0 went on to step 800"), rec.reason
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.SILENT and d.rank == 1 and d.step == 1 and d.silences == (WITHIN_FIRST,)
    assert d.ranks[0].frame == "wait_here", d
    [finding] = [f for f in find([rec]) if f.severity == "critical"]
    assert finding.title == ("stall in ddp [default] (killed at the 90s timeout): rank 1 hung at step 1 in wait_here: "
                             "its heartbeats showed no new step for 40s while rank 0 went on to step 800"), finding.title
    assert finding.kind == "silent_rank" and finding.diagnosis == d
    assert verdict_line(rec).startswith("rank 1 hung in wait_here (last heartbeat step 1, stage forward): its "
                                        "heartbeats showed no new step for 40s while rank 0 went on to step 800 — "
                                        "timed out"), verdict_line(rec)
    # the same timeout with no rank silent: the others' steps came to the end, and it reads so
    progressing = _timed_out()
    assert progressing.progressing_at_timeout
    [slow] = [f for f in find([progressing]) if f.severity == "critical"]
    assert "while still progressing" in slow.title and slow.kind == "timeout", slow.title


def test_a_stall_of_ranks_left_behind_names_each_and_how_far_each_other_went():
    """Two ranks hung while two went on; the record read back from the store says the same."""
    one, two = RankSilence(1, 3, 8.1, {0: 40, 3: 38}, True), RankSilence(2, 5, 9.0, {0: 40, 3: 38}, True)
    rec = dataclasses.replace(_timed_out(), timed_out=False, timeout_quiet_s=None, stalled_s=8.1, world_size=4)
    rec = dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, silent_ranks=[one, two]))
    status, reason = verdict(Outcome.of_record(rec), [])
    assert (status, reason) == (Status.FAIL, (
        "stalled: rank 1 hung at step 3: its heartbeats showed no new step for 8s while rank 0 went on to step 40 "
        "and rank 3 to step 38; rank 2 hung at step 5: its heartbeats showed no new step for 9s while rank 0 went on "
        "to step 40 and rank 3 to step 38; stacks taken and the run killed by the harness")), reason
    stored = PhaseRecord.from_json(rec.to_json(), "test")
    assert stored.evidence.silent_ranks == [one, two]
    [finding] = [f for f in find([stored]) if f.severity == "critical" and f.title.startswith("stall")]
    assert finding.title == ("stall in ddp [default] (stopped by the harness): rank 1 hung at step 3 in wait_here: its "
                             "heartbeats showed no new step for 8s while rank 0 went on to step 40 and rank 3 to step "
                             "38; rank 2 hung at step 5: its heartbeats showed no new step for 9s while rank 0 went on "
                             "to step 40 and rank 3 to step 38"), finding.title
