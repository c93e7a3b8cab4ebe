"""The attempts of a torchrun agent's workers (under ``--max-restarts`` it starts them again
after a failure, into the same log): how each ended (``attempt_ends``), whether the agent started
them again, and the log's last attempt (``last_attempt``), with what the harness saw of the agent
beside its log (``AgentSeen``)."""
from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from validation.contract.torchrun_log.exceptions import short_exception
from validation.contract.torchrun_log.patterns import (AGENT_SIGNALLED, AGENT_TOLD, ATTEMPT_FAILED, EXC, GAVE_UP,
                                                       RANK_LINE, TR_EXIT, TR_RANK, VICTIM, signal_name)
from validation.contract.torchrun_log.whose import agent_lines, agent_message, signalled_in


@dataclass(frozen=True)
class AgentSeen:
    """What the harness saw of one torchrun agent beside its log, where the log cannot say it: how
    the agent ended, which of its workers were running when the harness stopped the run, and the
    global ranks its node's workers had."""

    exit_code: int | None = None
    """Its exit status; None where the harness killed it (its stall watch, the timeout) or it is not
    known. An agent that gives up on its workers exits 1 after its summary: one that exits 0 after a
    failure line had started its workers again, and they succeeded."""
    running: frozenset[int] = frozenset()
    """The process ids of its workers the harness found running as it stopped the run (the stacks it
    took, or tried to)."""
    first_rank: int | None = None
    """The global rank of its local rank 0: torchrun gives a node's workers consecutive ranks from
    its node rank times its processes per node. 0 for a launch of one agent; None where not known."""
    node: int | None = None
    """Its node's index in a launch of several nodes; None for a launch of one agent."""
    nproc: int | None = None
    """How many workers it starts in each attempt (its processes per node); None where not known."""


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt of a torchrun agent's workers failed, by its agent's word (``attempt_ends``):
    the process that failed first, and the exception it printed in that attempt."""

    attempt: int
    """Which attempt of the launch's workers: 1 the first, 2 the first restart's. Of a launch of several
    nodes it is the same attempt on every node (their agents meet in one rendezvous round per attempt),
    not the count of its own agent's restarts: an agent whose workers another node's restart stopped
    (``for_peer``) starts them again without counting a restart."""
    local_rank: int | None
    """None of an attempt its agent stopped for another node's restart, of a node of several processes
    (its agent's line names the process id only)."""
    pid: int
    exit_code: int
    """Negative: killed by that signal."""
    exception: str | None = None
    """The last exception that worker printed with its rank's prefix in that attempt ('[rank1]: ...',
    the prefix naming its global rank, ``rank``); None where it printed none, or its global rank is
    not known."""
    restarted: bool = False
    """torchrun started the workers again after it (``_restarted``): an earlier attempt's end, not
    the run's. False also of a record stored before it was read: nothing is then said of it as an
    earlier attempt."""
    rank: int | None = None
    """Its global rank: the agent's summary names it as it gives up ('rank : 1 (local_rank: 0)'), and
    otherwise it is its local rank counted from the first rank of its agent's node (AgentSeen,
    else that summary's). None where nothing says it, and in records stored before it was read
    (whose ``exception`` took the local rank for the global one)."""
    node: int | None = None
    """Of a launch of several nodes, the node whose agent's log says it; None of a launch of one."""
    for_peer: bool = False
    """Its workers did not fail: its agent stopped them (SIGTERM, no failure line) to join the
    rendezvous round that another node's restart opened (torchrun's agent restarts its workers when
    it sees a node waiting), which counts as no restart of this agent's ``--max-restarts``. ``pid`` is
    the first it stopped."""

    @property
    def who(self) -> str:
        """'rank 1 (pid 702)'; of a node of several, 'rank 1 (local rank 0, pid 4888)'; 'local rank 0
        (pid 4888)' where its global rank is not known."""
        if self.rank is None:
            return f"local rank {self.local_rank} (pid {self.pid})" if self.local_rank is not None else f"pid {self.pid}"
        local = f"local rank {self.local_rank}, " if self.node is not None else ""
        return f"rank {self.rank} ({local}pid {self.pid})"

    def cause(self) -> str:
        """'rank 0 (pid 703) was killed by SIGKILL', 'rank 1 (pid 702) failed: RuntimeError: ...'; of an
        attempt stopped for another node's restart, 'its agent stopped rank 0 (...) for another node's
        restart (no restart counted on node 0)'."""
        if self.for_peer:
            others = " and the node's other workers" * (self.local_rank is None)
            return (f"its agent stopped {self.who}{others}, which had not failed, for another node's restart "
                    f"(no restart counted against node {self.node}'s --max-restarts)")
        if self.exception:
            return f"{self.who} failed: {short_exception(self.exception)}"
        if self.exit_code < 0:
            return f"{self.who} was killed by {signal_name(-self.exit_code)}"
        return f"{self.who} exited with code {self.exit_code}"

    @property
    def own(self) -> bool:
        """Failed in its own right, not on a peer's failure breaking its collective (``VICTIM``), nor
        stopped for another node's restart."""
        return not (self.for_peer or self.exception and VICTIM.search(self.exception))

    def text(self) -> str:
        """'attempt 1 ended as rank 1 (pid 702) failed: ...'; of a launch of several nodes, whose agent
        counts it: 'attempt 1 of node 1 ended as rank 1 (local rank 0, pid 4888) failed: ...'."""
        of = f" of node {self.node}" if self.node is not None else ""
        return f"attempt {self.attempt}{of} ended as {self.cause()}"


def attempt_ends(stderr_path: Path, seen: AgentSeen | None = None) -> list[AttemptEnd]:
    """Each attempt of the workers torchrun's log (its stderr, all of it: the attempts are counted
    from its first) shows ended before the next, in order: its agent's failure line ends a failed
    attempt, and the exception the failed worker printed in that attempt is that attempt's; of a
    node of several, its agent's stopping its workers for another node's restart
    (``_peer_stops``) ends an attempt too (``AttemptEnd.for_peer``), so that a node's attempt N is
    every node's round N of the rendezvous. A worker's exception is matched to the attempt it came
    in, never to the run as a whole: of a run restarted after a crash, the last attempt's is not the
    first's. The agent names the worker by its local rank and its pid; its global rank (the rank
    its exception's prefix names) is the summary's where the agent gave up with one, else its local
    rank counted from its node's first rank (``seen``, what the harness saw of the agent; else the
    summary's rank less its local rank: torchrun's c10d rendezvous orders the same agents the same
    way in every round, so a node keeps its node rank across restarts). Where neither says it, no
    exception is taken: another node's rank of the same local rank is not this worker."""
    seen = seen or AgentSeen()
    try:
        with open(stderr_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    parts, rounds = _attempt_parts(text), _rounds(text, seen)
    restarted = _restarted(parts, seen)
    summary = _summary(parts[-1])  # of the attempt whose failure line it follows: none once restarted
    first = seen.first_rank if seen.first_rank is not None else next(
        (rank - local for rank, local in summary.values() if local is not None), None)
    ends: list[AttemptEnd] = []
    for i, (part, stopped) in enumerate(rounds[:-1], start=1):
        later = i < len(rounds) - 1 or restarted  # torchrun started the workers again after it
        if stopped:
            local = 0 if seen.nproc == 1 else None
            rank = first + local if first is not None and local is not None else None
            ends.append(AttemptEnd(i, local, stopped[0], -int(signal.SIGTERM), restarted=True, rank=rank, node=seen.node,
                                   for_peer=True))
            continue
        said: dict[int, str] = {}  # each rank's last exception in the attempt
        for ln in part.splitlines():
            if (m := RANK_LINE.match(ln)) and EXC.match(m.group(2)):
                said[int(m.group(1))] = m.group(2).strip()
        f = ATTEMPT_FAILED.search(part.splitlines()[-1])
        local, pid = int(f["local"]), int(f["pid"])
        rank = summary[pid][0] if pid in summary else first + local if first is not None else None
        ends.append(AttemptEnd(i, local, pid, int(f["code"]), said.get(rank) if rank is not None else None,
                               restarted=later, rank=rank, node=seen.node))
    return ends


def _rounds(text: str, seen: AgentSeen) -> list[tuple[str, tuple[int, ...]]]:
    """``text`` cut where an attempt of the agent's workers ended: after each failure line
    (``_attempt_parts``) and, of a node of several, after each stop of its workers for another
    node's restart (``_peer_stops``, whose process ids come with its part; () with a failed
    part's); the last part is what follows the last (as ``_attempt_parts``'s)."""
    cuts = sorted([(end, ()) for end in _failure_ends(text)] + _peer_stops(text, seen))
    out, start = [], 0
    for end, stopped in cuts:
        out.append((text[start:end], stopped))
        start = end
    return out + [(text[start:], ())]


def _failure_ends(text: str) -> list[int]:
    """Where each failure line of torchrun's agent ends in ``text`` (after its newline)."""
    ends = []
    for m in ATTEMPT_FAILED.finditer(text):
        end = text.find("\n", m.end())
        ends.append(len(text) if end < 0 else end + 1)
    return ends


def _peer_stops(text: str, seen: AgentSeen) -> list[tuple[int, tuple[int, ...]]]:
    """Of a node of a launch of several, each time its agent stopped its workers although none had
    failed: where in ``text`` that ended, and the process ids it signalled. torchrun's agent, its
    workers healthy, restarts them as soon as it sees another node waiting at the rendezvous (one
    whose workers failed and were restarted by its agent): it signals every worker
    ('Sending process P closing signal SIGTERM', ``AGENT_SIGNALLED``) and writes no failure line,
    counting no restart. On a failure it signals only the workers still running, fewer than it
    started (the failed one has exited), and writes its failure line next; told to stop itself
    (``AGENT_TOLD``) it signals them as it ends. So a run of such lines is a stop for another node's
    restart where nothing of the agent's follows it but a failure line of a later attempt (it
    signalled as many workers as it starts, ``AgentSeen.nproc``), another line of its own, or the
    log's end."""
    if seen.node is None:  # a launch of one agent has no other node to restart for
        return []
    out: list[tuple[int, tuple[int, ...]]] = []
    batch: list[int] = []
    batch_end = 0
    pos = 0
    for ln in text.splitlines(keepends=True):
        pos += len(ln)
        msg = agent_message(ln.rstrip("\n"))
        if msg is None:
            continue
        if AGENT_TOLD.match(msg):
            return out  # what it signals from here on, it signals as it ends
        if (m := AGENT_SIGNALLED.match(msg)) is not None:
            if not m.group(1).startswith("Unable"):  # that one repeats a process it signalled already
                batch.append(int(m.group(2)))
            batch_end = pos
            continue
        if batch and (not ATTEMPT_FAILED.search(msg) or seen.nproc is not None and len(batch) >= seen.nproc):
            out.append((batch_end, tuple(batch)))
        batch = []
    if batch:
        out.append((batch_end, tuple(batch)))
    return out


def _summary(text: str) -> dict[int, tuple[int, int | None]]:
    """Per process id, its global and local rank, from torchrun's summary in ``text`` (each entry's
    'rank : 1 (local_rank: 0)', then its 'exitcode : 1 (pid: 4888)')."""
    out: dict[int, tuple[int, int | None]] = {}
    rank = None
    for ln in text.splitlines():
        if t := TR_RANK.match(ln):
            rank = (int(t.group(1)), int(t["local"]) if t["local"] is not None else None)
        elif (e := TR_EXIT.match(ln)) and rank is not None:
            if e.group(2) is not None:
                out[int(e.group(2))] = rank
            rank = None
    return out


def last_attempt(text: str, seen: AgentSeen | None = None) -> str:
    """The part of a torchrun log that is its last attempt of the workers (under ``--max-restarts``
    the agent starts them again after a failure, into the same log): from after the failure line of
    the attempt before it, to the log's end (torchrun's summary, as it gave up, is of the attempt
    whose failure line it follows). A log of one attempt is all of it. ``seen``: what the harness
    saw of the agent (``_restarted``)."""
    seen = seen or AgentSeen()
    rounds = _rounds(text, seen)
    if len(rounds) == 1:
        return text
    if rounds[-2][1] or _restarted(_attempt_parts(text), seen):  # [-2][1]: stopped for another node's restart
        return rounds[-1][0]
    return rounds[-2][0] + rounds[-1][0]


def _attempt_parts(text: str) -> list[str]:
    """``text`` cut after each failure line of torchrun's agent (``ATTEMPT_FAILED``): a part per
    failed attempt, each ending in its failure line, then what follows the last (torchrun's summary,
    or an attempt that did not fail by its agent's word: one that succeeded, or one still running
    when the agent was stopped)."""
    parts, start = [], 0
    for end in _failure_ends(text):
        parts.append(text[start:end])
        start = end
    return parts + [text[start:]]


def _restarted(parts: list[str], seen: AgentSeen) -> bool:
    """Whether torchrun started the workers again after the last failed attempt of ``_attempt_parts``:
    no summary of torchrun's (the exit codes it reports as it gives up) follows its failure line, and
    something shows workers ran after it. The agent ends every worker still running before it writes
    its failure line, so a worker after it is a later attempt's: one the agent signals after it (as it
    is stopped itself), or one the harness found running as it stopped the run that the log names
    nowhere up to that line. An earlier failure line shows that this launch restarts its workers, and
    an agent that exits 0 (``seen``) had restarted them: one that gives up exits 1. Otherwise a log
    of one failed attempt and no summary is one whose agent was stopped between its failure line and
    its summary. An agent whose only word after its failure line is its own rendezvous error
    (``GAVE_UP``: it went to start its workers again and could not rejoin, as where the store's node
    had given up first) started none: the failed attempt was its workers' last."""
    if len(parts) < 2 or any(TR_EXIT.match(ln) for ln in parts[-1].splitlines()):
        return False
    before = "".join(parts[:-1])
    named = {int(m["pid"]) for m in ATTEMPT_FAILED.finditer(before)} | signalled_in(before)
    if (seen.exit_code != 0 and not signalled_in(parts[-1]) and not seen.running - named
            and any(GAVE_UP.search(ln) for ln in agent_lines(parts[-1]))):
        return False
    if len(parts) >= 3 or seen.exit_code == 0 or signalled_in(parts[-1]):
        return True
    return bool(seen.running - named)
