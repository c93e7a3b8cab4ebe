"""One process of a point: launched into a directory of its own by its kind's runner, its files
read, judged against the point's gates, and made into a record (or into one of the sub-runs of a
record, for points that run several processes: repeats, resume); and the record of a point the
harness itself failed on.

A point of one process is ``record(point, judge(point, launch(point, out_dir, ...), hw), ...)``;
session/repeats.py and session/resume.py combine several.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from validation.judge.clock import step_clock
from validation.judge.evidence import collect, read_ended, read_train, with_log
from validation.judge.findings.headline import culprit_log
from validation.judge.gates import GateResult, GateVerdict, evaluate
from validation.judge.metrics import PROFILE_METRICS, RunData, unprovided_by_files
from validation.judge.provenance import trainer_commit
from validation.judge.record import (HARNESS_ERROR_FILE, OWN_TRAINER, TRAINER_KINDS, Evidence, NotRun, PhaseRecord,
                                     RunSigns, Status, SubRun, Summary, routes)
from validation.judge.resume import Breach
from validation.judge.stability import StabilityRule
from validation.judge.unprofiled import NoProfile
from validation.judge.verdict import Outcome, clean_verdict, process_verdict
from validation.excerpt import EXCERPT_CHARS
from validation.launch import kinds
from validation.launch.legs import Leg
from validation.launch.process import ProcResult
from validation.machine import Machine
from validation.runbook.plan import PhasePoint, unprovided_metrics
from validation.store import goldens

Progress = Callable[[str], None]


@dataclass
class Launched:
    """A process that ran, with its files read into ``run``."""

    run: RunData
    proc: ProcResult
    errors: list[str]


@dataclass
class Judged(Launched):
    gates: list[GateResult]
    status: Status
    reason: str
    window: int | None
    """The phase's window in steps (None: all steps), over which its summary numbers are taken."""
    evidence: Evidence
    """What its files and logs show (judge/evidence.py), collected once for its record."""
    ended: tuple[Status, str] | None = None
    """The verdict how its process ended decided before any gate (verdict.process_verdict: a crash,
    a stall, a .HALT, a broken file, a short run); None where it ran clean and its gates (or a
    non-finite loss it logged, verdict.clean_verdict) decided."""

    @property
    def metrics(self) -> Summary:
        return Summary.of(self.run, self.window)


def launch(point: PhasePoint, out_dir: Path, progress: Progress | None, leg: Leg | None = None) -> Launched:
    """Run the point's kind into ``out_dir`` (``leg``: one process of a resume point) and read
    what it left. A KeyboardInterrupt reaches the caller with the process dead."""
    kind = point.phase.kind
    steps = leg.steps_expected if leg is not None else point.phase.steps
    run = RunData(out_dir=out_dir, world_size=point.nproc, steps_requested=steps if kind in TRAINER_KINDS else None,
                  peak_flops=point.profile.hardware.peak_flops, stability=StabilityRule.of(point.profile.thresholds))
    errors: list[str] = []
    if leg is not None:
        proc = kinds.train(point, out_dir, run, errors, progress, leg)
    else:
        proc = kinds.KINDS[kind](point, out_dir, run, errors, progress)
    if point.slurm:  # its tasks ran on the allocation's nodes: this host's load says nothing of them
        proc = replace(proc, load=None)
    stopped = proc.stalled_s is not None or proc.timed_out
    run = replace(run, exit_code=proc.exit_code, timed_out=proc.timed_out, stalled_s=proc.stalled_s,
                  processes=proc.processes, stacks_tried=len(proc.stacks) if stopped else run.stacks_tried,
                  silent_ranks=list(proc.silent_ranks))
    if kind in TRAINER_KINDS and run.launched:  # a process that never started left no file to miss
        files = read_train(run)
        run = files.onto(run)
        errors += files.problems
    run = read_ended(run, proc.stderr_path).onto(run)
    return Launched(run, proc, errors)


def judge(point: PhasePoint, done: Launched, hw: Machine, results_dir: Path,
          extra: list[GateResult] | None = None, resume_breach: Breach | None = None) -> Judged:
    """The point's gates (and its golden gate, and ``extra``) over the run, and its verdict
    (``resume_breach``: of a half of a resume point, what it did that it was not asked)."""
    run, kind = done.run, point.phase.kind
    asked = point.gates()
    # a metric is unprovided when its runbook entry says so, or the trainer's files lack what it reads
    declared = unprovided_metrics(point)
    unprovided = {**unprovided_by_files(run), **declared}
    # a profile.json it wrote malformed is an error (read_profile_evidence), not one it did not write
    no_profile = (NoProfile.of(point.phase.profile_steps, run.env)
                  if kind == "profile" and "profiled_steps" not in run.counts else None)
    if no_profile is not None:
        unprovided.update({m: no_profile.text() for m in PROFILE_METRICS})
    golden = goldens.gate(point, run.csv, hw, results_dir)
    clock = step_clock(run, done.proc.wall_s)  # the trainer's step times against its heartbeats' and the wall's
    gates = evaluate(asked, run, unprovided, done.proc.load, clock) + ([golden] if golden else []) + list(extra or [])
    # how the process ended decides first; its gates (and a non-finite loss logged) decide a run that ended clean
    outcome = Outcome.of_run(kind, run, done.errors, resume_breach, no_profile)
    ended = process_verdict(outcome)
    status, reason = ended or clean_verdict(outcome, gates)
    if ended is None and outcome.csv_behind:  # it logs every N steps: said, not judged a short run
        reason += f"; {outcome.csv_behind}"
    # the report's numbers are over the phase's window: the first gate that names one ('last 50
    # steps' for the bucket sweep); gates keep their own windowed values
    window = next((g.window.last for g in asked if g.window.last), None)
    # the missing profile is kept where the run ended clean: a process that failed explains it
    evidence = replace(collect(run, done.proc.stderr_path, done.errors, clock), resume_breach=resume_breach,
                       no_profile=no_profile if ended is None else None)
    return Judged(run, done.proc, done.errors, gates, status, reason, window, evidence, ended)


def relative(path: Path, results_dir: Path) -> str:
    return str(path.relative_to(results_dir.resolve()))


def sub_run(j: Judged, name: str, label: str, results_dir: Path, status: Status | None = None,
            reason: str = "") -> SubRun:
    """One process of a point of several, as its record keeps it; with its own verdict, or the one
    given (how a resume point's process ended, its gates being the whole point's)."""
    csv = j.run.csv
    logged = csv is not None and not csv.empty
    failed = [g.metric for g in j.gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]
    return SubRun(name, label, relative(j.run.out_dir, results_dir), status or j.status, reason or j.reason,
                  j.proc.exit_code, j.metrics,
                  int(csv["step"].min()) if logged else None, int(csv["step"].max()) if logged else None,
                  float(csv["loss"].iloc[0]) if logged else None, float(csv["loss"].iloc[-1]) if logged else None,
                  list(j.proc.argv), list(j.evidence.files),
                  RunSigns.of(j.evidence, failed),
                  list(j.gates), j.proc.timed_out, j.proc.stalled_s, j.proc.timeout_quiet_s, round(j.proc.wall_s, 2),
                  j.evidence)


def record(point: PhasePoint, j: Judged, hw: Machine, results_dir: Path, run_id: str, started: str,
           **over) -> PhaseRecord:
    """The point's record from the process that decides it; ``over``: fields a point of several
    processes sets itself (its sub-runs, summed wall time, mean numbers, a reason naming the one)."""
    run, proc = j.run, j.proc
    env = run.env or {}
    trainer_sha, trainer_sha_source = trainer_commit(env, run.info.get("trainer_sha"), run.info.get("trainer_sha_source"))
    fields = dict(
        run_id=run_id, started=started, hardware=hw, wall_s=round(proc.wall_s, 2), command=proc.argv,
        steps=point.phase.steps if point.phase.kind in TRAINER_KINDS else None,
        out_dir=relative(run.out_dir, results_dir), exit_code=proc.exit_code, timed_out=proc.timed_out,
        stalled_s=proc.stalled_s, timeout_quiet_s=proc.timeout_quiet_s, world_size=run.world_size, gates=j.gates,
        window=f"last {j.window} steps" if j.window else "all steps",
        metrics=j.metrics, evidence=j.evidence,
        git_sha=run.info.get("git_sha") or env.get("git_sha"),
        git_sha_source=run.info.get("git_sha_source") or env.get("git_sha_source"),
        backends=routes(env.get("attention_backends")), env_seen=dict(env.get("env") or {}),
        noop_toggles=dict(env.get("noop_toggles") or {}), trainer=run.info.get("trainer") or OWN_TRAINER,
        trainer_sha=trainer_sha, trainer_sha_source=trainer_sha_source,
        env=run.info.get("env") or dict(point.env), cwd=run.info.get("cwd") or "", slurm_job_id=proc.slurm_job_id,
        load=proc.load)
    fields.update(over)
    status, reason = fields.pop("status", j.status), fields.pop("reason", j.reason)
    rec = PhaseRecord.for_point(point, status, reason, **fields)
    log = culprit_log(rec)
    if log in (None, rec.evidence.stderr_log):
        return rec
    # the log of the node it names
    return replace(rec, evidence=with_log(rec.evidence, run.out_dir / log, run.exit_code))


def harness_failed(point: PhasePoint, out_dir: Path, results_dir: Path, hw: Machine, run_id: str, started: str,
                   wall_s: float, exc: Exception) -> PhaseRecord:
    """The point's record when the harness itself failed launching or judging it (its trainer's
    processes were killed with the tree, launch/process.py): ERROR, never a verdict on the
    trainer, with the traceback beside the run's files; the session goes on to the next point
    rather than ending with a traceback and no report. ``wall_s``: how long the point ran until
    then (its trainer's processes may have run their course: the timing findings read when each
    timed point ran)."""
    text = "".join(traceback.format_exception(exc))
    (out_dir / HARNESS_ERROR_FILE).write_text(text)
    rel = relative(out_dir, results_dir)
    print(f"nsa-validate: the harness failed on {point.test_id}: {type(exc).__name__}: {exc} "
          f"(traceback in {rel}/{HARNESS_ERROR_FILE})", file=sys.stderr)
    return PhaseRecord.for_point(
        point, Status.ERROR, f"the harness failed on this point, a defect of the harness: {type(exc).__name__}: "
        f"{str(exc)[:EXCERPT_CHARS]} (traceback: {rel}/{HARNESS_ERROR_FILE})", hardware=hw, run_id=run_id, started=started,
        wall_s=wall_s, out_dir=rel, evidence=Evidence(not_run=NotRun.HARNESS,
                                    files=sorted(p.name for p in out_dir.iterdir() if p.is_file())))
