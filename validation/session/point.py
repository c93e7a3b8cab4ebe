"""One phase point, run and stored: its kind's runner (validation/launch/kinds.py) in a fresh
directory, then the evidence, the gates and the verdict (validation/judge), into one PhaseRecord
(session/runs.py; a repeated or resume point runs several processes, session/repeats.py and
session/resume.py).

Order of a point: it is checked launchable before anything is touched (a trainer root not set
is no record at all); the store is checked readable; the point runs into a directory of its own,
``runs/<runbook>/<profile>/<phase>/<point>/<run id>``; its record is stored (which removes the
pair's report, ResultStore: it names the older runs), and only then are the point's older run
directories removed (``prune``). A point this machine skips leaves a SKIP
record only where no run of it is stored: a record is replaced only by a run of that point that
ran. After an interrupt at any moment the stored record and the artifacts it names agree.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

from validation.errors import HarnessError, StoreError
from validation.judge.record import TRAINER_KINDS, PhaseRecord, Status, utc_now
from validation.launch import foreign, slurm
from validation.machine import Machine
from validation.runbook.hardware import mismatches, shortfalls
from validation.runbook.plan import PhasePoint
from validation.session import repeats, resume, runs
from validation.session.runs import Progress
from validation.store.results import ResultStore


def cannot_launch(point: PhasePoint) -> str | None:
    """Why the point's trainer cannot start here at all (its root not set or not a directory, its
    script, module or config template not there, a package it requires not installed, this
    project's trainer module not importable, a Slurm allocation too small), or None. Such a point is no record: it says nothing about the
    trainer, and must not replace one that does."""
    if point.slurm and (problem := slurm.allocation_problem(point.phase.launcher)):
        return problem
    spec = point.runbook.trainer
    if spec is not None:
        if point.phase.kind not in TRAINER_KINDS or not spec.supports_phase(point.phase.kind):
            return None
        root, why = spec.root.resolve()
        why = why or foreign.missing_file(spec, root) or foreign.missing_package(spec, root)
        # the runbook's trainer entry is at fault: its file is named, as a bad key's is on loading
        return None if why is None else f"{point.runbook.path}: {why}"
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
    trainer does not support, no Slurm to submit a Slurm point to, too few or too small GPUs, or
    a GPU-model mismatch under --hardware-mismatch=skip; None when it runs."""
    spec = point.runbook.trainer
    if spec is not None and not spec.supports_phase(point.phase.kind):
        how = ("; its runbook entry says how it stops after N steps and resumes under trainer.resume"
               if point.phase.kind == "resume" else "")
        return (f"trainer {spec.name} does not support {point.phase.kind} phases "
                f"(it supports: {', '.join(spec.phases)}{how})")
    if point.slurm and slurm.missing_tools():
        return f"Slurm is not installed here ({', '.join(slurm.missing_tools())} not on PATH): the point runs as srun"
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
        try:
            store.put(record)  # and the pair's report with it: that names the runs prune removes
            prune(results_dir, point, keep=record.out_dir)
        except KeyboardInterrupt as exc:
            # a stop while the record was stored: the store decides what stands, and the run
            # directories are made to agree with it before the stop goes on
            stored = _holds(store, record)
            if stored:
                prune(results_dir, point, keep=record.out_dir)
            else:
                shutil.rmtree(point_dir(results_dir, point) / record.run_id[:12], ignore_errors=True)
            raise StoppedWhileStoring(point.test_id, record if stored else None,
                                      getattr(exc, "signum", signal.SIGINT)) from exc
        except StoreError as exc:
            # a full disk or a read-only folder: the session ends with the bad-input status, and
            # the run that finished is named, not dropped; its directory stays for a look (the next
            # run of the point removes it, as it removes any run no record names)
            raise StoreError(f"{exc}; {point.test_id} ran to its end ({record.status}) but its record was not "
                             f"stored (the store holds what it held before); its run is in "
                             f"{results_dir / record.out_dir}") from None
    return record


class StoppedWhileStoring(KeyboardInterrupt):
    """A stop signal that came after the point's run had ended, while its record was stored.
    ``record``: the new record where the store holds it (its run kept, the point's earlier run
    directories removed); None where it did not get in (the new run's directory removed, the
    earlier record and its artifacts kept)."""

    def __init__(self, test_id: str, record: PhaseRecord | None, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.test_id, self.record, self.signum = test_id, record, signum


def _holds(store: ResultStore, record: PhaseRecord) -> bool:
    """Whether the store's record of ``record``'s point is ``record`` (by its run id)."""
    stored = {r.test_id: r for r in store.records(record.key.runbook, record.key.profile)}.get(record.test_id)
    return stored is not None and stored.run_id == record.run_id


@contextlib.contextmanager
def _point_lock(point: PhasePoint, results_dir: Path):
    """Hold an exclusive lock on the point's run directory; yields None when acquired, or a
    description of the holder when another process has it."""
    out_dir = point_dir(results_dir, point)
    lock_path = out_dir.with_name(out_dir.name + ".lock")
    try:  # a folder of runs/ made read-only after the store's check: one line, not a traceback
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        open(lock_path, "a+").close()
    except OSError as exc:
        raise StoreError(f"results directory {results_dir}: cannot write the point's run directory "
                         f"{lock_path.parent} ({exc.strerror or exc})") from None
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
    """Run the point into a fresh run directory and judge it: one process, or several (the
    repeats of a repeated point, the three processes of a resume point) in directories of their
    own inside it."""
    run_id, started, clock = uuid.uuid4().hex, utc_now(), time.monotonic()
    out_dir = point_dir(results_dir, point) / run_id[:12]
    try:  # from the directory's creation on: an interrupt between the two would leave it behind
        out_dir.mkdir(parents=True)
        if point.phase.kind == "resume":
            return resume.execute(point, out_dir, hw, results_dir, run_id, started, progress)
        if point.phase.repeats > 1:
            return repeats.execute(point, out_dir, hw, results_dir, run_id, started, progress)
        return runs.record(point, runs.judge(point, runs.launch(point, out_dir, progress), hw, results_dir), hw, results_dir,
                           run_id, started)
    except KeyboardInterrupt:  # its trainer is dead (launch/process.py); nothing will record this run
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            out_dir.parent.rmdir()  # the point's directory, when this was its only run
        raise
    except HarnessError:
        raise  # a bad input (the store, a runbook): the session stops with its message
    except Exception as exc:  # noqa: BLE001 - a defect of the harness, not of this point's run
        return runs.harness_failed(point, out_dir, results_dir, hw, run_id, started,
                                   round(time.monotonic() - clock, 2), exc)


def prune(results_dir: Path, point: PhasePoint, keep: str) -> None:
    """Remove the point's run directories other than the one holding ``keep`` (the stored record's
    out_dir: the run directory itself, or the directory of one of its processes inside it):
    earlier runs, and runs an interrupt cut short before their record was written."""
    base = point_dir(results_dir, point)
    if not base.is_dir():
        return
    keep_path = (results_dir / keep).resolve() if keep else None
    for entry in base.iterdir():
        if keep_path is not None and (entry.resolve() == keep_path or entry.resolve() in keep_path.parents):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:  # files of a run from before runs had directories of their own
            entry.unlink(missing_ok=True)
