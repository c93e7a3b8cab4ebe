"""One phase point, run and stored: its kind's runner (validation/launch/kinds.py) in a fresh
directory, then the evidence, the gates and the verdict (validation/judge), into one PhaseRecord.

Order of a point: it is checked launchable before anything is touched (a trainer root not set
is no record at all); the store is checked readable; the point runs into a directory of its own,
``runs/<runbook>/<profile>/<phase>/<point>/<run id>``; its record is stored, and only then are the
point's older run directories removed (``prune``). A point this machine skips leaves a SKIP
record only where no run of it is stored: a record is replaced only by a run of that point that
ran. After an interrupt at any moment the stored record and the artifacts it names agree.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from nsa.contract import PROFILE_JSON, PROFILE_STEPS_ENV
from validation.errors import StoreError
from validation.judge.evidence import collect, collect_halt, collect_train
from validation.judge.metrics import PROFILE_METRICS, RunData, unprovided_by_files
from validation.judge.provenance import trainer_commit
from validation.judge.stability import StabilityRule
from validation.judge.record import OWN_TRAINER, TRAINER_KINDS, PhaseRecord, Status, Summary, routes, utc_now
from validation.judge.verdict import Outcome, evaluate, verdict
from validation.launch import kinds
from validation.machine import Machine
from validation.runbook.hardware import mismatches, shortfalls
from validation.runbook.plan import PhasePoint, unprovided_metrics
from validation.store import goldens
from validation.store.results import ResultStore

Progress = Callable[[str], None]


def cannot_launch(point: PhasePoint) -> str | None:
    """Why the point's trainer cannot start here at all (its root not set or not a directory,
    this project's trainer module not importable), or None. Such a point is no record: it says
    nothing about the trainer, and must not replace one that does."""
    spec = point.runbook.trainer
    if spec is not None:
        runs = point.phase.kind in TRAINER_KINDS and spec.supports_phase(point.phase.kind)
        return spec.root.resolve()[1] or None if runs else None
    if point.phase.kind not in TRAINER_KINDS:
        return None
    name = point.phase.launcher.module
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"trainer module {name!r} is not importable"


def why_skip(point: PhasePoint, hw: Machine, mismatch: str = "run") -> str | None:
    """Why this machine (or the runbook's trainer) does not run the point: a phase kind the
    trainer does not support, too few or too small GPUs, or a GPU-model mismatch under
    --hardware-mismatch=skip; None when it runs."""
    spec = point.runbook.trainer
    if spec is not None and not spec.supports_phase(point.phase.kind):
        return (f"trainer {spec.name} does not support {point.phase.kind} phases "
                f"(it supports: {', '.join(spec.phases)})")
    short = shortfalls(point.profile, hw, point.min_gpus)
    if short:
        return "; ".join(short)
    if mismatch == "skip":
        diff = mismatches(point.profile, hw)
        if diff:
            return "hardware mismatch (--hardware-mismatch=skip): " + "; ".join(diff)
    return None


def run_point(point: PhasePoint, results_dir: Path, hw: Machine, skip: str | None,
              progress: Progress | None = None) -> PhaseRecord:
    """Run the point (or, with ``skip``, record why not) and store its record."""
    store = ResultStore(results_dir)
    store.check()
    with _point_lock(point, results_dir) as holder:
        if holder is not None:
            # another harness process is running this very point in this results directory:
            # leave it alone and keep the store as it is (that run stores its own record)
            return PhaseRecord.for_point(point, Status.SKIP,
                                         f"this point is being run by another harness process ({holder})", hardware=hw)
        if skip:
            record = PhaseRecord.for_point(point, Status.SKIP, skip, hardware=hw)
            store.put_skip(record)
            return record
        record = execute(point, results_dir, hw, progress)
        store.put(record)
        prune(results_dir, point, keep=record.out_dir)
    return record


@contextlib.contextmanager
def _point_lock(point: PhasePoint, results_dir: Path):
    """Hold an exclusive lock on the point's run directory; yields None when acquired, or a
    description of the holder when another process has it."""
    out_dir = point_dir(results_dir, point)
    lock_path = out_dir.with_name(out_dir.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            yield f"pid {fh.read().strip() or '?'}"
            return
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield None
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def point_dir(results_dir: Path, point: PhasePoint) -> Path:
    """runs/<runbook>/<profile>/<phase>/<point>: every part was validated as a safe name."""
    root = (results_dir / "runs").resolve()
    d = (root / point.runbook.name / point.profile.name / point.phase.name / point.slug).resolve()
    if root not in d.parents:
        raise StoreError(f"run directory {d} would leave {root}")
    return d


def execute(point: PhasePoint, results_dir: Path, hw: Machine, progress: Progress | None = None) -> PhaseRecord:
    run_id, started = uuid.uuid4().hex, utc_now()
    out_dir = point_dir(results_dir, point) / run_id[:12]
    out_dir.mkdir(parents=True)
    kind = point.phase.kind
    run = RunData(out_dir=out_dir, world_size=point.nproc,
                  steps_requested=point.phase.steps if kind in TRAINER_KINDS else None,
                  stability=StabilityRule.of(point.profile.thresholds))
    errors: list[str] = []
    try:
        proc = kinds.KINDS[kind](point, out_dir, run, errors, progress)
    except KeyboardInterrupt:  # its trainer is dead (launch/process.py); nothing will record this run
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            out_dir.parent.rmdir()  # the point's directory, when this was its only run
        raise
    run.exit_code, run.timed_out, run.stalled_s = proc.exit_code, proc.timed_out, proc.stalled_s
    if kind in TRAINER_KINDS:
        collect_train(run, errors)
    collect_halt(run)
    golden = goldens.gate(point, run.csv, hw)
    # a metric is unprovided when the trainer's files lack what it reads, or its runbook entry says so
    unprovided = {**unprovided_by_files(run), **unprovided_metrics(point)}
    if kind == "profile" and "profiled_steps" not in run.counts:
        unprovided.update({m: f"the trainer wrote no {PROFILE_JSON} (it does not honour {PROFILE_STEPS_ENV})"
                           for m in PROFILE_METRICS})
    gates = evaluate(point.gates(), run, unprovided) + ([golden] if golden else [])
    status, reason = verdict(Outcome.of_run(kind, run, errors), gates)
    # the report's numbers are over the phase's window: the first gate that names one ('last 50
    # steps' for the bucket sweep); gates keep their own windowed values
    window = next((g.window.last for g in point.gates() if g.window.last), None)
    env = run.env or {}
    trainer_sha, trainer_sha_source = trainer_commit(env, run.info.get("trainer_sha"), run.info.get("trainer_sha_source"))
    return PhaseRecord.for_point(
        point, status, reason, run_id=run_id, started=started, hardware=hw, wall_s=round(proc.wall_s, 2),
        command=proc.argv, steps=point.phase.steps if kind in TRAINER_KINDS else None,
        out_dir=str(out_dir.relative_to(results_dir.resolve())), exit_code=proc.exit_code, timed_out=proc.timed_out,
        stalled_s=proc.stalled_s, world_size=run.world_size, gates=gates,
        window=f"last {window} steps" if window else "all steps",
        metrics=Summary.of(run, window), evidence=collect(run, proc.stderr_path, errors),
        git_sha=run.info.get("git_sha") or env.get("git_sha"),
        git_sha_source=run.info.get("git_sha_source") or env.get("git_sha_source"),
        backends=routes(env.get("attention_backends")), env_seen=dict(env.get("env") or {}),
        noop_toggles=dict(env.get("noop_toggles") or {}), trainer=run.info.get("trainer") or OWN_TRAINER,
        trainer_sha=trainer_sha, trainer_sha_source=trainer_sha_source,
        env=run.info.get("env") or dict(point.env), cwd=run.info.get("cwd") or "")


def prune(results_dir: Path, point: PhasePoint, keep: str) -> None:
    """Remove the point's run directories other than ``keep`` (the stored record's out_dir):
    earlier runs, and runs an interrupt cut short before their record was written."""
    base = point_dir(results_dir, point)
    if not base.is_dir():
        return
    keep_path = (results_dir / keep).resolve() if keep else None
    for entry in base.iterdir():
        if entry.resolve() == keep_path:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:  # files of a run from before runs had directories of their own
            entry.unlink(missing_ok=True)
