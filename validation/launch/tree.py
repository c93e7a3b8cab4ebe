"""The whole process tree of one launched trainer, tracked while it runs and killed without a
survivor.

A tree cannot be killed race-free from its shape alone: torchrun starts each worker in a session
of its own, a worker forked between a scan and the kill is missed, and once its parent is dead it
is reparented (to PID 1), no longer a descendant of anything the harness knows. So every launch
carries a token in its environment (``RUN_TOKENS``), which every descendant inherits, reparented
or not; the kill sweeps the known tree and every process carrying the token, and repeats until a
scan finds none alive. Descendants are also recorded at every poll, for a process that replaced
its environment (exec with an environment of its own) and so lost the token.
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Mapping

import psutil

#: the environment variable holding the launch tokens of a process: comma-separated, so that a
#: harness launched by another harness (a pytest phase running the harness's tests) keeps the
#: outer token beside its own and the outer sweep still finds its trainers
RUN_TOKENS = "VALIDATION_RUN_TOKENS"
#: how long one kill may keep sweeping before it gives up on a process it cannot kill
SWEEP_LIMIT_S = 10.0
#: after a scan that finds nothing, one more scan this much later: a child forked but not yet
#: exec'd shows its parent's environment, without the token
SETTLE_S = 0.1


def with_token(env: Mapping[str, str], token: str) -> dict[str, str]:
    """``env`` with ``token`` added to its RUN_TOKENS."""
    tokens = [t for t in env.get(RUN_TOKENS, "").split(",") if t]
    return {**env, RUN_TOKENS: ",".join([*tokens, token])}


def carries(proc: psutil.Process, token: str) -> bool:
    """Whether a live process's environment holds ``token`` (False for one that is gone, a
    zombie, or not readable)."""
    try:
        return token in proc.environ().get(RUN_TOKENS, "").split(",")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def token_carriers(token: str) -> list[psutil.Process]:
    """Every live process on this machine (except this one) whose environment holds ``token``."""
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and carries(p, token)]


def alive(proc: psutil.Process) -> bool:
    """Running or sleeping; not gone and not a zombie (dead, awaiting its reaper). psutil checks
    the process's start time, so a reused PID is not mistaken for it."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


class ProcessTree:
    """The processes of one launch: its roots (one process, or one torchrun agent per node),
    every descendant seen at a poll, and every process carrying its token."""

    def __init__(self, token: str | None = None) -> None:
        """A new launch's tree (a fresh token), or with ``token`` the processes that carry the
        token of a launch already made (one an earlier harness left running)."""
        self.token = token or uuid.uuid4().hex
        self.roots: list[psutil.Process] = []
        self._seen: dict[int, psutil.Process] = {}

    @property
    def root(self) -> psutil.Process | None:
        """The first process launched."""
        return self.roots[0] if self.roots else None

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment to launch the root with: ``env`` plus this tree's token."""
        return with_token(env, self.token)

    def adopt(self, pid: int) -> None:
        """A launched process (a root of the tree)."""
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:  # already gone: its descendants still carry the token
            return
        self.roots.append(root)
        self._seen[pid] = root

    def poll(self) -> None:
        """Record the live descendants of the processes seen so far: of the root, and of any
        seen process that was reparented (the top of a subtree of its own); usually one scan."""
        live = {pid: p for pid, p in self._seen.items() if alive(p)}
        for top in live.values():
            try:
                if top.ppid() in live:
                    continue
                below = top.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in below:
                known = self._seen.get(child.pid)
                if known is None or not alive(known):  # new, or a dead one's PID reused
                    self._seen[child.pid] = child

    def known(self) -> list[psutil.Process]:
        """The live processes seen at polls (the roots' descendants), without the machine-wide
        token scan that ``members`` adds."""
        return [p for p in self._seen.values() if alive(p)]

    def members(self) -> list[psutil.Process]:
        """The tree's live processes: those seen at polls and those carrying the token."""
        self.poll()
        found = {p.pid: p for p in self._seen.values() if alive(p)}
        for p in token_carriers(self.token):
            found.setdefault(p.pid, p)
        return list(found.values())

    def kill(self) -> list[int]:
        """SIGKILL every member, repeating until a scan (and one more a moment later) finds none
        alive; returns the PIDs killed. Gives up on a process that outlives SWEEP_LIMIT_S (one it
        may not signal) rather than hang the harness."""
        killed: set[int] = set()
        deadline = time.monotonic() + SWEEP_LIMIT_S
        settled = False
        while time.monotonic() < deadline:
            targets = self.members()
            if not targets:
                if settled:
                    break
                settled = True
                time.sleep(SETTLE_S)
                continue
            settled = False
            for p in targets:
                try:
                    p.kill()
                    killed.add(p.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            _wait_dead(targets, 1.0)
        return sorted(killed)


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> None:
    """Until none of ``procs`` is alive. Not psutil.wait_procs: it waits out its whole timeout
    for a zombie whose parent is not this process (a zombie is dead enough here)."""
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
