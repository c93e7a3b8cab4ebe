"""Run phase points against this machine and store their records: the one loop the CLI and the
pytest plugin share. Hardware that cannot run a point gives a SKIP record; a profile/hardware
mismatch (an H100 running the a100 profile) runs and is reported, or skips under policy 'skip'.

Order of a point: the store is checked readable (a corrupt results.json stops the run before
anything runs), the point runs into a directory of its own, its record is stored, and only then
are the point's older run directories removed; after an interrupt at any moment the stored
record and the artifacts it names agree."""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
from pathlib import Path
from typing import Callable

from validation.judge.record import PhaseRecord, Status
from validation.machine import Machine, detect
from validation.runbook.hardware import mismatches, shortfalls
from validation.runbook.plan import PhasePoint
from validation.session.point import execute, point_dir, prune
from validation.store.results import ResultStore

MISMATCH_POLICIES = ("run", "skip")


def why_not(point: PhasePoint, hw: Machine, mismatch: str = "run") -> str | None:
    """The reason this machine (or the runbook's trainer) does not run the point, or None."""
    unsupported = trainer_lacks(point)
    if unsupported:
        return unsupported
    short = shortfalls(point.profile, hw, point.min_gpus)
    if short:
        return "; ".join(short)
    if mismatch == "skip":
        diff = mismatches(point.profile, hw)
        if diff:
            return "hardware mismatch (--hardware-mismatch=skip): " + "; ".join(diff)
    return None


def trainer_lacks(point: PhasePoint) -> str | None:
    """Why the runbook's own trainer cannot run this point: a phase kind it does not support, or
    a root that is not set; None for this project's trainer."""
    spec = point.runbook.trainer
    if spec is None:
        return None
    if not spec.supports_phase(point.phase.kind):
        return (f"trainer {spec.name} does not support {point.phase.kind} phases "
                f"(it supports: {', '.join(spec.phases)})")
    if point.phase.kind == "train":
        return spec.root.resolve()[1] or None
    return None


def module_missing(point: PhasePoint) -> str | None:
    """The trainer module this point launches, when it cannot be imported here."""
    if point.phase.kind != "train" or point.runbook.trainer is not None:
        return None
    name = point.phase.launcher.module
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"trainer module {name!r} is not importable"


def run_point(point: PhasePoint, results_dir: Path, *, mismatch: str = "run",
              progress: Callable[[str], None] | None = None) -> PhaseRecord:
    store = ResultStore(results_dir)
    store.check()
    hw = detect()
    reason = why_not(point, hw, mismatch)
    with _point_lock(point, results_dir) as holder:
        if holder is not None:
            # another harness process is running this very point in this results directory:
            # leave it alone and keep the store as it is (that run stores its own record)
            return PhaseRecord.for_point(point, Status.SKIP,
                                         f"this point is being run by another harness process ({holder})", hardware=hw)
        if reason:
            record = PhaseRecord.for_point(point, Status.SKIP, reason, hardware=hw)
        else:
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
