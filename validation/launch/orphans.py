"""Processes an earlier harness run of a results directory left running: found before a run
starts, named, and stopped.

The warden (validation/launch/warden.py) ends a dead harness's trees, but it can die with the
harness (the OOM killer, a kill of every process of the user), and a launch through srun leaves
its ranks to Slurm. What is left of such a tree holds the machine (GPUs, cores) and will never be
recorded: the harness that would have judged it is gone. So every launch of a point carries
in its environment (``RUN_OWNERS``) who launched it: the harness process, the results directory,
the point and the launch's token. A run of a results directory looks for live processes whose
entry names that directory and a harness process that no longer runs, and stops each such launch
by its token (validation/launch/tree.py). A point run by another live harness process is left
alone: a results directory shared by two harness processes keeps working (each marks the points
it runs, validation/session/point.py).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Mapping

import psutil

from validation.launch.tree import ProcessTree, alive

#: the environment variable naming who launched a process: a JSON list of ``Owner`` entries, one
#: for each harness above it (a harness launched by another's pytest phase keeps the outer one)
RUN_OWNERS = "VALIDATION_RUN_OWNERS"
#: seconds by which a process's start time, read again, may differ from the one recorded
_START_SLACK_S = 0.5


@dataclass(frozen=True)
class Owner:
    """Who launched a process: a harness process, for a point of a results directory."""

    harness_pid: int
    harness_started: float
    """The harness process's start time (psutil's create_time): a reused pid is not the harness."""
    results_dir: str
    """Resolved."""
    point: str
    """The point's test id."""
    token: str
    """The launch's token (validation/launch/tree.py): every process of the launch carries it."""

    def running(self) -> bool:
        """Whether the harness process that launched it still runs."""
        try:
            harness = psutil.Process(self.harness_pid)
            return alive(harness) and abs(harness.create_time() - self.harness_started) < _START_SLACK_S
        except psutil.NoSuchProcess:
            return False


@dataclass(frozen=True)
class LeftRunning:
    """One launch of a gone harness whose processes still run."""

    owner: Owner
    pids: list[int]
    commands: list[str]
    """Each process's command line, shortened, in the order of ``pids``."""

    def describe(self) -> str:
        return (f"point {self.owner.point} (harness pid {self.owner.harness_pid}, gone): "
                + "; ".join(f"pid {pid} {cmd}" for pid, cmd in zip(self.pids, self.commands)))


#: the point whose launches run in this context (``owned_by``): its results directory and test id
_POINT: contextvars.ContextVar[tuple[Path, str] | None] = contextvars.ContextVar("point", default=None)


@contextlib.contextmanager
def owned_by(results_dir: Path, point: str) -> Iterator[None]:
    """Within it (in this thread), every launch is marked as one of ``point`` of ``results_dir``."""
    token = _POINT.set((results_dir.resolve(), point))
    try:
        yield
    finally:
        _POINT.reset(token)


def with_owner(env: Mapping[str, str], token: str) -> dict[str, str]:
    """``env`` with this harness process as the owner of the launch ``token`` added to its
    RUN_OWNERS, where the launch is one of a point (``owned_by``); else ``env`` as it is."""
    point = _POINT.get()
    if point is None:
        return dict(env)
    me = psutil.Process()
    owner = Owner(me.pid, me.create_time(), str(point[0]), point[1], token)
    return {**env, RUN_OWNERS: json.dumps([*(asdict(o) for o in _owners(env)), asdict(owner)])}


def _owners(env: Mapping[str, str]) -> list[Owner]:
    """The owners an environment names (none where its RUN_OWNERS is missing or not readable)."""
    try:
        return [Owner(**entry) for entry in json.loads(env.get(RUN_OWNERS, "[]"))]
    except (ValueError, TypeError):
        return []


def left_running(results_dir: Path) -> list[LeftRunning]:
    """The launches of points of ``results_dir`` whose processes run while the harness process
    that launched them does not, each with its live processes (never this process or one above
    it)."""
    where = str(results_dir.resolve())
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found: dict[str, tuple[Owner, list[psutil.Process]]] = {}
    for proc in psutil.process_iter():
        if proc.pid in mine or not alive(proc):
            continue
        try:
            owners = _owners(proc.environ())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for owner in owners:
            if owner.results_dir == where and not owner.running():
                found.setdefault(owner.token, (owner, []))[1].append(proc)
    return [LeftRunning(owner, [p.pid for p in procs], [_command(p) for p in procs])
            for owner, procs in found.values()]


def stop(launch: LeftRunning) -> list[int]:
    """Kill every process of the launch (by its token: those it started since the scan too);
    returns the pids that still run after the kill's sweep gave up on them."""
    tree = ProcessTree(launch.owner.token)
    tree.kill()
    return sorted(p.pid for p in tree.members())


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
