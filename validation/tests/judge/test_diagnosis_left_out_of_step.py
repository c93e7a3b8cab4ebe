"""A rank that exited 0 early, and ranks whose collectives were out of step as well: rank 1 all-reduced a copy of its
loss once more at step 3 (``log_loss``), which paired silently with rank 0's all-reduce of step 3, and each of rank 1's
after it with rank 0's of the next step; rank 0 then stopped after step 5 of 8 (a stop condition of its own) and
exited 0. Rank 1 failed in its all-reduce of step 5 ('Connection closed by peer'), or, where the ended rank's
connections stay open as under NCCL, waited in it until the harness's stall watch stopped the run: a step rank 0 had
completed. Without the extra collective rank 1 would have failed in step 6, left by the early exit alone; without the
early exit, in step 8, left by the extra collective. The verdict read 'rank 0 exited 0 early (...) — the other ranks
failed without it', and nothing in the report named the extra collective: both faults are named, each with its
finding and advice.

Judged from the files real two-rank torchrun runs of validation/tests/record_trainer.py left
(validation/tests/evidence/gloo2_left_outofstep_rank1_*: NSA_RECORD_TWICE=1@3 and NSA_RECORD_QUIT=0@5, 8 steps;
``waited`` with NSA_RECORD_HOLD=1 and stall_s 8); nothing runs here."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from validation.contract.stacks import Frame
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord
from validation.tests.stopped_run import judged_run, judged_stopped_run

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: the step's all-reduce of the loss, which rank 1 failed or waited in
REGULAR = Frame("/tmp/s17_verdicts/validation/tests/record_trainer.py", 140, "main")
OUT_OF_STEP = (r"rank 1 (failed|waited) in all_reduce at tests/record_trainer.py:140 \(main\) during step 5 \(.*\), a step "
               r"rank 0 had completed before it exited 0 \(last heartbeat step 5, stage step\): the ranks' collectives "
               r"were out of step: rank 1 had called more collectives than rank 0 by then, .*")


def _failed(run: Path = EVIDENCE / "gloo2_left_outofstep_rank1_failed") -> PhaseRecord:
    return judged_run(run, "trainer.stderr.log", 1)


def _waited() -> PhaseRecord:
    run = EVIDENCE / "gloo2_left_outofstep_rank1_waited"
    return judged_stopped_run(run, run / "trainer.stderr.log", stalled_s=8.0, stacks_tried=1)


def _advice(rec: PhaseRecord) -> list[str]:
    return recommendations([f for f in find([rec]) if f.kind in ("departed", "out_of_step")])


def test_a_rank_that_exited_0_early_with_the_others_failing_in_a_step_it_completed_is_both():
    rec = _failed()
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and [(at.rank, at.step, at.stage) for at in d.ranks] == [
        (0, 5, "step")], d
    off = d.beside
    assert off is not None and off.kind == Kind.OUT_OF_STEP and not off.waiting, d
    assert [(at.rank, at.step, at.stage, at.site) for at in off.ranks] == [(1, 5, "backward", REGULAR)], off
    assert [(at.rank, at.step, at.stage) for at in off.ended] == [(0, 5, "step")], off
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 0 exited 0 early \(last heartbeat step 5, stage step\); besides, " + OUT_OF_STEP
                        + r" — the other ranks failed without it \(exit code 1\)", line), line
    found = {f.kind: f.title for f in find([rec]) if f.kind in ("departed", "out_of_step")}
    assert found["departed"].startswith("early exit in ddp [default]: exit code 1: rank 0 exited 0 early (last "
                                        "heartbeat step 5 of 8, stage step)"), found
    assert re.fullmatch(r"collectives out of step in ddp \[default\]: exit code 1: " + OUT_OF_STEP,
                        found["out_of_step"]), found
    advice = _advice(rec)
    assert any("stop condition that holds on that rank only" in a for a in advice), advice
    assert any("collective called on some ranks only" in a for a in advice), advice


def test_a_rank_that_exited_0_early_with_the_others_waiting_in_a_step_it_completed_is_both():
    rec = _waited()
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and [at.rank for at in d.ranks] == [0], d
    off = d.beside
    assert off is not None and off.kind == Kind.OUT_OF_STEP and off.waiting, d
    assert [(at.rank, at.step, at.stage, at.frame, at.site) for at in off.ranks] == [
        (1, 5, "backward", "all_reduce", REGULAR)], off
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 0 exited 0 early \(last heartbeat step 5, stage step\); besides, " + OUT_OF_STEP
                        + r" — stalled: no progress for 8s after step 5; .*", line), line
    assert {f.kind for f in find([rec])} >= {"departed", "out_of_step"}, find([rec])
    advice = _advice(rec)
    assert any("stop condition that holds on that rank only" in a for a in advice), advice
    assert any(a.startswith("ddp: A rank waited in a collective, with no partner left") for a in advice), advice


def test_a_rank_that_exited_0_early_before_the_step_the_others_failed_in_left_early_alone(tmp_path):
    """Rank 1 failed in step 6, which rank 0 never started: the early exit alone, nothing out of step."""
    run = tmp_path / "run"
    shutil.copytree(EVIDENCE / "gloo2_left_outofstep_rank1_failed", run)
    beats = run / "heartbeat_rank1.jsonl"
    beats.write_text(beats.read_text().replace('"step": 5', '"step": 6').replace('"step": 4', '"step": 5'))
    d = diagnose(_failed(run))
    assert d is not None and d.kind == Kind.LEFT and d.beside is None, d
