"""When each process of a launch ended, against the steps the run's files showed: what tells a rank
that exited early from one that trained on without writing its heartbeats, which its files alone
cannot (judge/short_ranks.py).

At every poll the supervisor reads the run's files first (watch.py ``StepWatch``: the highest step
any heartbeat or training.csv row showed), then hands this the processes of the tree it sees
running. A process seen running ran after the files showed that step (``alive_at``). A process
seen gone had ended before the next read of the files, so the step that read shows bounds how far
the run had got when it ended (``gone_at``). Both bounds hold whatever the poll interval; only a
process that lived and died between two polls is never seen.

Only the launched processes' descendants are followed (torchrun's workers and whatever they
start; a python launcher's children), never a launched process itself: a torchrun agent or srun is
no rank, and the one process of a python launcher is a world of one, which no heartbeat check
here concerns. A pid seen for two processes (reused within the run) names neither.
"""
from __future__ import annotations

import psutil

from validation.judge.seen import ProcessSeen


class Lives:
    """The processes of one launch, each as last seen (``ProcessSeen``), keyed by pid."""

    def __init__(self, launched: set[int]):
        self._launched = launched
        self._seen: dict[int, ProcessSeen] = {}
        self._born: dict[int, float] = {}
        """pid -> the process's creation time, to tell a reused pid."""
        self._reused: set[int] = set()
        self._pending: set[int] = set()
        """Seen gone at the last poll; ``gone_at`` is the next read of the files."""

    def poll(self, running: list[psutil.Process], highest: int | None) -> None:
        """``running``: the tree's processes running now, looked at after a read of the files that
        showed ``highest`` (None: no step yet)."""
        step = highest or 0
        for pid in self._pending:
            self._seen[pid] = ProcessSeen(pid, self._seen[pid].alive_at, step)
        self._pending = set()
        now = set()
        for p in running:
            if p.pid in self._launched:
                continue
            try:
                born = p.create_time()
            except psutil.Error:
                continue
            if self._born.setdefault(p.pid, born) != born:
                self._reused.add(p.pid)
            now.add(p.pid)
            self._seen[p.pid] = ProcessSeen(p.pid, step)
        self._pending = {pid for pid, life in self._seen.items() if pid not in now and life.gone_at is None}

    def ended(self) -> set[int]:
        """The processes seen running at a poll and gone at a later one."""
        return {pid for pid, life in self._seen.items() if life.gone_at is not None} | self._pending

    def seen(self) -> dict[int, ProcessSeen]:
        """Each process as last seen, by pid (a reused pid left out)."""
        return {pid: life for pid, life in self._seen.items() if pid not in self._reused}
