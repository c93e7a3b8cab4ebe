"""Run one phase point: its kind's runner (validation/kinds.py) in a fresh directory, then the
evidence (evidence.py), the gates and the verdict (verdict.py), into one PhaseRecord.

Each run writes into a directory of its own, ``runs/<runbook>/<profile>/<phase>/<point>/<run id>``;
the orchestrator stores the record and only then removes the point's older runs (``prune``), so
an interrupt at any moment leaves the stored record beside the artifacts it describes.
"""
from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path
from typing import Callable

from validation.contract.files import read_halt
from validation.errors import StoreError
from validation.judge.evidence import collect, collect_train
from validation.judge.metrics import RunData, compute
from validation.judge.record import OWN_TRAINER, PhaseRecord, routes
from validation.judge.verdict import evaluate, unprovided_metrics, verdict
from validation.launch import kinds
from validation.machine import Machine
from validation.runbook.plan import PhasePoint
from validation.store import goldens

Progress = Callable[[str], None]


def point_dir(results_dir: Path, point: PhasePoint) -> Path:
    """runs/<runbook>/<profile>/<phase>/<point>: every part was validated as a safe name."""
    root = (results_dir / "runs").resolve()
    d = (root / point.runbook.name / point.profile.name / point.phase.name / point.slug).resolve()
    if root not in d.parents:
        raise StoreError(f"run directory {d} would leave {root}")
    return d


def execute(point: PhasePoint, results_dir: Path, hw: Machine, progress: Progress | None = None) -> PhaseRecord:
    run_id = uuid.uuid4().hex
    out_dir = point_dir(results_dir, point) / run_id[:12]
    out_dir.mkdir(parents=True)
    kind = point.phase.kind
    run = RunData(out_dir=out_dir, world_size=point.nproc)
    errors: list[str] = []
    try:
        proc = kinds.KINDS[kind](point, out_dir, run, errors, progress)
    except KeyboardInterrupt:  # its trainer is dead (launch/process.py); nothing will record this run
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            out_dir.parent.rmdir()  # the point's directory, when this was its only run
        raise
    run.exit_code, run.timed_out, run.stalled_s = proc.exit_code, proc.timed_out, proc.stalled_s
    if kind == "train":
        collect_train(run, errors)
    unmeasurable = unprovided_metrics(point)
    golden = goldens.gate(point, run.csv, hw)
    gates = evaluate(point, run, unmeasurable) + ([golden] if golden else [])
    status, reason = verdict(kind, run, read_halt(out_dir) if run.halted else None, errors, gates, unmeasurable)
    window = next((g.window.last for g in point.gates() if g.window.last), None)
    env = run.env or {}
    return PhaseRecord.for_point(
        point, status, reason, run_id=run_id, hardware=hw, wall_s=round(proc.wall_s, 2), command=proc.argv,
        steps=point.phase.steps if kind == "train" else None, out_dir=str(out_dir.relative_to(results_dir.resolve())),
        exit_code=proc.exit_code, timed_out=proc.timed_out, stalled_s=proc.stalled_s, world_size=run.world_size,
        gates=gates,
        window=f"last {window} steps" if window else "all steps",
        metrics={n: compute(n, run, window) for n in SUMMARY_METRICS}, evidence=collect(run, proc.stderr_path, errors),
        git_sha=run.info.get("git_sha") or env.get("git_sha"),
        git_sha_source=run.info.get("git_sha_source") or env.get("git_sha_source"),
        backends=routes(env.get("attention_backends")), env_seen=dict(env.get("env") or {}),
        noop_toggles=dict(env.get("noop_toggles") or {}), trainer=run.info.get("trainer") or OWN_TRAINER,
        trainer_sha=run.info.get("trainer_sha"), trainer_sha_source=run.info.get("trainer_sha_source"),
        env=run.info.get("env") or dict(point.env), cwd=run.info.get("cwd") or "")


#: numbers kept for the report's tables, over the phase's gate window (the first gate that names
#: one: 'last 50 steps' for the bucket sweep); gates keep their own windowed values
SUMMARY_METRICS = ("toks_per_s_mean", "toks_per_s_stdev", "step_time_s_mean", "mem_reserved_gb_max",
                   "steps_completed", "loss_mean", "rank_step_time_ratio", "idle_ranks", "fallbacks_total",
                   "tests_failed", "tests_passed", "profiled_steps", "nsa_ranges_found", "python_overhead_frac",
                   "gpu_busy_frac", "cuda_graphs", "tokens_per_step")


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
