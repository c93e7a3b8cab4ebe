"""The record the harness makes of a run it stopped (the stall watch's), or of one that ended with an exit code,
from the run's files alone: its readers over them, then the verdict. Shared by the tests that judge recorded
evidence so."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from validation.judge.evidence import collect, read_ended, read_train, with_log
from validation.judge.findings.headline import culprit_log
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Summary
from validation.judge.verdict import Outcome, verdict


def judged_stopped_run(out: Path, log: Path, *, world: int = 2, stalled_s: float, stacks_tried: int,
                       key: PointKey = PointKey("mine", "cpu", "ddp"), trainer: str = "myt",
                       out_dir: str = "", steps: int = 8) -> PhaseRecord:
    """``out``: the run's directory; ``log``: its torchrun log. The run asked for ``steps`` steps."""
    run = RunData(out, world_size=world, exit_code=None, stalled_s=stalled_s, stacks_tried=stacks_tried,
                  steps_requested=steps)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    run = read_ended(run, log).onto(run)
    status, reason = verdict(Outcome.of_run("train", run, errors), [])
    return PhaseRecord(key, f"{key.runbook}/{key.profile}/{key.phase}/default", "train", status, reason, steps=steps,
                       world_size=world, stalled_s=stalled_s, metrics=Summary.of(run, None),
                       evidence=collect(run, log, errors), trainer=trainer, out_dir=out_dir)


def judged_run(out: Path, log: str, exit_code: int | None, *, steps: int = 8) -> PhaseRecord:
    """The record the session makes of a run that ended with ``exit_code`` (session/runs.py ``launch``, ``judge``,
    ``record``): its files and logs read, its verdict, its evidence, and the log of the node its verdict names.
    ``out``: the run's directory; ``log``: its torchrun log's name there; the run asked for ``steps`` steps."""
    run = RunData(out, world_size=2, exit_code=exit_code, steps_requested=steps)
    files = read_train(run)
    run = files.onto(run)
    run = read_ended(run, out / log).onto(run)
    status, reason = verdict(Outcome.of_run("train", run, list(files.problems)), [])
    rec = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", status, reason, steps=steps,
                      world_size=2, exit_code=exit_code, evidence=collect(run, out / log, list(files.problems)),
                      trainer="myt", out_dir=str(out))
    named = culprit_log(rec)
    return rec if named in (None, log) else replace(rec, evidence=with_log(rec.evidence, out / named, exit_code))
