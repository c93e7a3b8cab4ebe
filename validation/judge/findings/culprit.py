"""Who a crash or stall finding blames, as typed data: which rank (on which node, where a launch
spans several), at which step, and what it did (crashed, hung, stalled, exited 0 early). The
crash and stall detectors (failures.py) attach it to their finding; the verdict line of the
point (headline.py) and of the report say it from the same object, so that neither re-reads
the finding's text."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from validation.judge.record import PhaseRecord


class Did(enum.StrEnum):
    CRASHED = "crashed"
    HUNG = "hung"
    """Named as the rank the others waited for (findings/hung.py), or the one process of its run."""
    STALLED = "stalled"
    """Made no progress with the others, where nothing tells which of them hung first."""
    LEFT = "exited 0 early"
    ENDED = "exited 0"
    """Exited 0 (its steps may all be done) while the others still had a collective with it."""
    NONFINITE = "had a non-finite loss"
    """Its own loss was non-finite where the others' were not (the trainer's .HALT, per rank)."""
    HALTED = "halted on a non-finite loss"
    """Its heartbeats end in a halt record at the step of the trainer's non-finite .HALT where the
    others' do not, and the .HALT holds no loss per rank: it stopped on a non-finite loss (its own,
    or one it alone checks) while the others went on into their next collective."""


class NoStack(enum.StrEnum):
    """Why a rank blamed as hung has no stack: the verdict line says so beside its heartbeat."""

    UNTAKEN = "no stack"
    """Neither the harness (py-spy, SIGUSR1) nor the trainer's own handler left one."""
    STOPPED = "stopped, no stack"
    """Its process was stopped (SIGSTOP, or a debugger) when the harness came for it: it runs
    nothing, its own dump handler included, and py-spy cannot read it (TakenStack.state)."""


@dataclass(frozen=True)
class RankAt:
    """One rank a finding blames, and where it was."""

    rank: int | None
    """None: a process whose rank cannot be told (named by its pid)."""
    node: str | None = None
    """The node it ran on ('node 1'), of a launch of several nodes; None otherwise."""
    step: int | None = None
    """Its last heartbeat's step (None: it wrote none)."""
    stage: str | None = None
    frame: str | None = None
    """Of a hung or stalled rank: the innermost function of its stack; None where none was taken."""
    cause: str = ""
    """Of a crashed rank: 'RuntimeError: boom', 'killed by SIGKILL', 'exit code 1'."""
    pid: int | None = None
    no_stack: NoStack | None = None
    """Of a hung rank named by its heartbeat alone: why it has no stack (None: it has one, or it is
    not blamed as hung)."""

    @classmethod
    def of(cls, rec: PhaseRecord, rank: int, *, frame: str | None = None, cause: str = "",
           no_stack: NoStack | None = None) -> RankAt:
        beat = rec.evidence.last_heartbeat.get(rank)
        nodes = rec.evidence.nodes
        node = nodes.of_rank(rank) if nodes is not None else None
        return cls(rank, node.name if node is not None else None, beat.step if beat else None,
                   beat.stage if beat else None, frame, cause, no_stack=no_stack)

    @property
    def who(self) -> str:
        """'rank 1', "node 1's rank 3", 'rank unknown (pid 42)'."""
        if self.rank is None:
            return "rank unknown" + (f" (pid {self.pid})" if self.pid is not None else "")
        return (f"{self.node}'s " if self.node else "") + f"rank {self.rank}"

    @property
    def beat(self) -> str:
        """'last heartbeat step 3, stage forward' (the stall and crash findings' words)."""
        if self.rank is None:
            return ""
        if self.step is None:
            return "no heartbeat written"
        return f"last heartbeat step {self.step}" + (f", stage {self.stage}" if self.stage else "")


@dataclass(frozen=True)
class Culprit:
    did: Did
    ranks: tuple[RankAt, ...]
    or_else: Culprit | None = None
    """Another account the evidence fits as well, which the verdict names beside this one: the ranks
    that may instead have ended first (findings/departed.py ``maybe_departed``); None where none does."""

    def text(self) -> str:
        """'rank 1 crashed (last heartbeat step 2, stage forward): RuntimeError: boom', 'rank 1 hung in
        wait (last heartbeat step 3, stage backward)', 'rank 1 hung (stopped, no stack; last heartbeat
        step 3, stage forward)'; several ranks joined by '; '; with ``or_else``, 'rank 0 crashed (...): exit
        code 1, or rank 2 exited 0 early (...) and the others failed after it: which came first cannot be told'."""
        own = "; ".join(f"{r.who} {self.did}" + (f" in {r.frame}" if r.frame else "") + _said(r)
                        + (f": {r.cause}" if r.cause else "") for r in self.ranks)
        if self.or_else is None:
            return own
        return f"{own}, or {self.or_else.text()} and the others failed after it: which came first cannot be told"


def _said(r: RankAt) -> str:
    """' (stopped, no stack; last heartbeat step 3, stage forward)': why it has no stack, and its heartbeat."""
    parts = [p for p in (r.no_stack, r.beat) if p]
    return f" ({'; '.join(parts)})" if parts else ""
