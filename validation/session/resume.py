"""A resume point: the uninterrupted reference run, the first half (stopped after ``resume_after``
steps) and the resumed second half, each launched like any train point (process tree, stall
watch, timeout) into a directory of its own inside the point's run directory, one after another.

A process that fails (a crash, a stall, a timeout, a .HALT, broken files, a run that stops short,
a half that did not do what it was asked: a first half that ran past its stop, a second half that
did not resume, judge/resume.py ``Breach``) decides the point on its own, named in the reason
('first half (steps 1-3, stopped): trainer crashed (exit code 1)'), and the processes after it are
not started. When all three ran, the point is judged on the resumed run (the first half's steps
and the second's) with the phase's gates and the resume gates against the reference
(validation/judge/resume.py); its record's exit code, command and evidence are the second half's,
its sub-runs all three.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from validation.judge import resume as equivalence
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, Status
from validation.launch.legs import Leg, legs, resume_source
from validation.machine import Machine, MachineLoad
from validation.runbook.plan import PhasePoint
from validation.runbook.types import Phase
from validation.session import runs
from validation.session.runs import Judged, Progress


def execute(point: PhasePoint, run_dir: Path, hw: Machine, results_dir: Path, run_id: str, started: str,
            progress: Progress | None) -> PhaseRecord:
    done: dict[str, Judged] = {}
    sub_runs = []
    for leg in legs(point.phase):
        if leg.name == "second":
            leg = leg.resuming(resume_source(point, done["first"].run.out_dir))
        out_dir = run_dir / leg.name
        out_dir.mkdir()
        launched = runs.launch(point, out_dir, progress, leg)
        j = runs.judge(point, launched, hw, results_dir, resume_breach=_breach(leg, launched.run, done, point.phase))
        done[leg.name] = j
        # a process is judged by how it ended; the phase's gates read the resumed run as a whole
        status, reason = j.ended or (Status.PASS, f"exit 0 after step {j.run.csv['step'].max()}")
        sub_runs.append(runs.sub_run(j, leg.name, leg.label, results_dir, status, reason))
        if j.ended is not None:
            return runs.record(point, j, hw, results_dir, run_id, started, status=status,
                               reason=f"{leg.label}: {reason}", steps=leg.steps_expected, runs=sub_runs,
                               wall_s=_wall(done), load=_load(done))
    reference, first, second = done["reference"], done["first"], done["second"]
    resumed = equivalence.resumed_run(first.run, second.run, point.phase.resume_after, point.phase.steps)
    rtol = point.profile.thresholds[equivalence.RTOL_KEY]  # present: PhasePoint.gates checked it
    clue = equivalence.clue(reference.run.csv, resumed.csv, point.phase.resume_after, rtol or 0.0)
    extra = equivalence.gates(reference.run, first.run, second.run, point.phase.resume_after, rtol)
    j = runs.judge(point, runs.Launched(resumed, second.proc, second.errors), hw, results_dir, extra)
    rec = runs.record(point, j, hw, results_dir, run_id, started, runs=sub_runs, wall_s=_wall(done), load=_load(done))
    return dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, resume_clue=clue))


def _breach(leg: Leg, run: RunData, done: dict[str, Judged], phase: Phase) -> equivalence.Breach | None:
    """What a half did that it was not asked: the first went on past its stop, the second trained
    steps its checkpoint held."""
    if leg.stop_after is not None:
        return equivalence.ran_past(run, leg.stop_after)
    if leg.resume_from is not None:
        return equivalence.not_resumed(done["first"].run, run, phase.resume_after)
    return None


def _wall(done: dict[str, Judged]) -> float:
    return round(sum(j.proc.wall_s for j in done.values()), 2)


def _load(done: dict[str, Judged]) -> MachineLoad | None:
    return MachineLoad.busiest([j.proc.load for j in done.values()])
