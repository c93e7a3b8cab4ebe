"""A repeated point (a train phase's ``repeats: K``): K runs of the same point, one after another,
each in a directory of its own (``repeat1`` .. ``repeatK``) inside the point's run directory,
each judged against the phase's gates as a run of its own; a golden point's repeats are each also
judged on how far the repeats' losses are apart (goldens.repeat_gate).

The record keeps every repeat's verdict and numbers (its sub-runs); its own numbers are the
means over the repeats (the report adds a t-interval, validation/judge/interval.py), but for the
last step logged, which is a step of the repeat that decides the record (a mean of 8, 2 and 8 is
no step any repeat stopped at); its verdict, exit code, gates and evidence are that repeat's (the
reason names it): the most severe failure, as one run's verdict orders them (how its process ended
decides before any gate, validation/judge/verdict.py): the first repeat whose process failed (a
crash, a stall, a .HALT, a broken file), else the first that failed a gate, else the first still to
be measured, else the last.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Callable

from validation.judge.record import PhaseRecord, Status, Summary
from validation.machine import Machine, MachineLoad
from validation.runbook.plan import PhasePoint
from validation.session import runs
from validation.session.runs import Judged, Progress
from validation.store import goldens

#: which repeat decides the record, the most severe first: its process failed, a gate failed, a gate unmeasured
_DECIDES: tuple[Callable[[Judged], bool], ...] = (
    lambda j: j.ended is not None, lambda j: j.status == Status.FAIL, lambda j: j.status == Status.UNMEASURED)


def execute(point: PhasePoint, run_dir: Path, hw: Machine, results_dir: Path, run_id: str, started: str,
            progress: Progress | None) -> PhaseRecord:
    n = point.phase.repeats
    launched = []
    for k in range(1, n + 1):
        out_dir = run_dir / f"repeat{k}"
        out_dir.mkdir()
        launched.append(runs.launch(point, out_dir, progress))
    agree = goldens.repeat_gate(point, [d.run.csv for d in launched])
    # each repeat carries the repeats' own gate, whichever of them decides the record
    done: list[Judged] = [runs.judge(point, d, hw, results_dir, extra=[agree] if agree else None) for d in launched]
    sub_runs = [runs.sub_run(j, f"repeat{k}", f"repeat {k} of {n}", results_dir) for k, j in enumerate(done, 1)]
    k, decides = next(((i, j) for worse in _DECIDES for i, j in enumerate(done, 1) if worse(j)), (n, done[-1]))
    return runs.record(point, decides, hw, results_dir, run_id, started, runs=sub_runs,
                       reason=f"repeat {k} of {n}: {decides.reason}" if decides.status != Status.PASS
                       else f"{n} repeats: {decides.reason}",
                       metrics=dataclasses.replace(mean([j.metrics for j in done]),
                                                   steps_completed=decides.metrics.steps_completed),
                       wall_s=round(sum(j.proc.wall_s for j in done), 2),
                       load=MachineLoad.busiest([j.proc.load for j in done]))


def mean(summaries: list[Summary]) -> Summary:
    """Each number's mean over the repeats that have it."""
    out = {}
    for f in dataclasses.fields(Summary):
        values = [v for s in summaries if (v := getattr(s, f.name)) is not None]
        out[f.name] = statistics.fmean(values) if values else None
    return Summary(**out)
