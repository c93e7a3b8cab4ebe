"""The record the harness makes of a run it stopped (the stall watch's), from the run's files alone:
its readers over them, then the verdict. Shared by the tests that judge recorded evidence so."""
from __future__ import annotations

from pathlib import Path

from validation.judge.evidence import collect, read_ended, read_train
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Summary
from validation.judge.verdict import Outcome, verdict


def judged_stopped_run(out: Path, log: Path, *, world: int = 2, stalled_s: float, stacks_tried: int,
                       key: PointKey = PointKey("mine", "cpu", "ddp"), trainer: str = "myt",
                       out_dir: str = "") -> PhaseRecord:
    """``out``: the run's directory; ``log``: its torchrun log. The run asked for 8 steps."""
    run = RunData(out, world_size=world, exit_code=None, stalled_s=stalled_s, stacks_tried=stacks_tried,
                  steps_requested=8)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    run = read_ended(run, log).onto(run)
    status, reason = verdict(Outcome.of_run("train", run, errors), [])
    return PhaseRecord(key, f"{key.runbook}/{key.profile}/{key.phase}/default", "train", status, reason, steps=8,
                       world_size=world, stalled_s=stalled_s, metrics=Summary.of(run, None),
                       evidence=collect(run, log, errors), trainer=trainer, out_dir=out_dir)
