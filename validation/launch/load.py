"""How busy other work kept the machine while a point ran (``MachineLoad``): the CPU time the
cores the harness may run on spent busy, from the kernel's per-CPU counters, less the CPU time of
the harness and everything it started and waited for (``getrusage``), over the run's wall time.

A descendant that outlived its parent and was reaped by another process (a trainer's orphan)
counts as other work; so does the CPU time of a point run at the same time by another thread of
this harness until its processes are waited for (only untimed points run side by side). Under
Slurm the tasks are slurmd's, on the allocation's nodes: a Slurm point keeps no load
(validation/session/runs.py).
"""
from __future__ import annotations

import os
import resource
import time

import psutil

from validation.machine import MachineLoad


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(psutil.cpu_count() or 1))


#: set to 1, the harness reads no load (every point counts as run on a quiet machine): for a test
#: suite whose trainers make their speeds up, whose verdicts must not depend on what else runs
IGNORE_ENV = "NSA_VALIDATE_IGNORE_LOAD"

#: the counters of CPU time spent busy (guest time is inside user and nice already; steal is a
#: virtual machine's time taken by its neighbours)
BUSY = ("user", "nice", "system", "irq", "softirq", "steal")


def _busy_s(cores: list[int]) -> float:
    """CPU seconds the cores spent busy since boot."""
    per_cpu = psutil.cpu_times(percpu=True)
    picked = [per_cpu[i] for i in cores] if cores and max(cores) < len(per_cpu) else per_cpu
    return sum(getattr(t, name, 0.0) for t in picked for name in BUSY)


def _ours_s() -> float:
    """CPU seconds of the harness process and of the children it has waited for."""
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


class LoadMeter:
    """Started before a launch, read after its processes were waited for."""

    def __init__(self) -> None:
        self.cores = _cores()
        self._t, self._busy, self._ours = time.monotonic(), _busy_s(self.cores), _ours_s()

    def read(self) -> MachineLoad | None:
        """The load since the meter started; None over too short a run to say (the kernel's
        counters tick 100 times a second), or where ``IGNORE_ENV`` says to read none."""
        wall = time.monotonic() - self._t
        if wall < 1.0 or os.environ.get(IGNORE_ENV) == "1":
            return None
        busy = max(_busy_s(self.cores) - self._busy, 0.0) / wall
        ours = max(_ours_s() - self._ours, 0.0) / wall
        return MachineLoad(len(self.cores), round(busy, 2), round(max(busy - ours, 0.0), 2))
