"""The diagnosis of a failed run as data (validation/judge/diagnosis/): what happened (its kind),
which rank, at which step and stage, its cause, and the files that show it, computed once from the
recorded evidence of real runs (validation/tests/evidence/); the crash and stall findings and the
verdict line render the same object. The words are asserted by a few renderings here; the blame
of each fault is asserted in the test_diagnosis_*.py files named by the fault."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from validation.contract.files import read_heartbeats
from validation.contract.torchrun_log import RankFailure, rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.crash import crash
from validation.judge.diagnosis.stall import stall
from validation.judge.evidence import Ended, TrainFiles, read_ended, read_train
from validation.judge.findings import find
from validation.judge.findings.culprit import text
from validation.judge.findings.headline import verdict_line
from validation.judge.metrics import RunData
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.tests.stopped_run import judged_stopped_run

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: rank 1 sends itself SIGTERM as step 3 starts; the others fail in their all_reduce after it
OUTSIDE = EVIDENCE / "sigterm3_rank1_outside"
#: rank 1 sleeps after its 8th step; rank 0 exited 0; the harness's stall watch stopped the run
ALONE = EVIDENCE / "alone2_rank1_hung_after_steps"


def _crashed(run: Path, world: int = 3) -> PhaseRecord:
    ev = Evidence(rank_failures=rank_failures(run / "trainer.stderr.log"), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(run).items()},
                  files=sorted(p.name for p in run.iterdir()))
    return PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=world, exit_code=1, evidence=ev,
                       trainer="myt", out_dir="runs/ddp")


def test_a_rank_killed_by_a_signal_of_its_own_is_the_diagnosis_with_its_step_stage_cause_and_files():
    rec = _crashed(OUTSIDE)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.KILLED and d.rank == 1 and not d.undecided, d
    assert (d.step, d.stage) == (3, "data"), d
    assert d.cause.startswith("killed by SIGTERM, not torchrun's"), d.cause
    assert d.logs == ("runs/ddp/trainer.stderr.log",), d.logs
    assert d.files == ("runs/ddp/heartbeat_rank1.jsonl",), d.files
    assert crash(rec) == d and stall(rec) is None  # the crash is what happened; no stall
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.kind = Kind.HUNG  # type: ignore[misc]


def test_the_crash_finding_and_the_verdict_line_render_the_one_diagnosis():
    rec = _crashed(OUTSIDE)
    d = diagnose(rec)
    [finding] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert finding.diagnosis == d and finding.kind == "crash", finding
    assert text(d) == ("rank 1 crashed (last heartbeat step 3, stage data): killed by SIGTERM, not torchrun's (its "
                       "agent signalled only ranks still running after it had ended)"), text(d)
    assert verdict_line(rec) == f"{text(d)} — trainer crashed (exit code 1)", verdict_line(rec)
    assert f"stderr: {d.logs[0]}" in finding.detail, finding.detail


def test_the_one_rank_left_running_is_diagnosed_hung_at_its_frame():
    rec = judged_stopped_run(ALONE, ALONE / "trainer.stderr.log", stalled_s=12.0, stacks_tried=1)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1], d
    assert (d.step, d.stage, d.ranks[0].frame, d.cause) == (8, "step", "<module>", None), d
    assert crash(rec) is None and stall(rec) == d


def test_a_diagnosis_names_no_rank_where_nothing_tells_and_the_verdict_line_is_the_reason():
    """Two ranks that exited 1 silently and nothing else: which failed first cannot be told, and the
    crash's cause is what the log says last; no rank leads the verdict line."""
    rec = dataclasses.replace(_crashed(OUTSIDE), evidence=Evidence(
        rank_failures={0: RankFailure(exit_code=1), 1: RankFailure(exit_code=1)}, stderr_log="trainer.stderr.log",
        stderr_tail="RuntimeError: boom\n"), world_size=2)
    d = crash(rec)
    assert d is not None and d.kind == Kind.CRASHED and d.ranks == () and d.from_log and d.cause == "RuntimeError: boom"
    assert diagnose(rec) is None and verdict_line(rec) == "trainer crashed (exit code 1)"


def test_the_collectors_return_frozen_records_and_leave_the_run_they_read_as_it_was(tmp_path):
    run = RunData(ALONE, world_size=2, exit_code=None, stalled_s=12.0, steps_requested=8)
    files = read_train(run)
    assert isinstance(files, TrainFiles) and files.world_size == 2 and not files.problems, files.problems
    assert run.csv is None and run.heartbeats == {}  # read into the record, not into the run
    ended = read_ended(files.onto(run), ALONE / "trainer.stderr.log")
    assert isinstance(ended, Ended) and ended.halt is None and run.rank_failures == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ended.halt = None  # type: ignore[misc]
    after = ended.onto(files.onto(run))
    assert after is not run and sorted(after.heartbeats) == [0, 1] and dict(after.rank_failures) == dict(
        ended.rank_failures)

