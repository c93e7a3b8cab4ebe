"""What a diagnosis is, as typed data: what happened (``Kind``), each rank it blames and where that
rank was (``RankAt``), why a rank blamed as hung has no stack (``NoStack``), the check that found the
ranks' collectives not matching and the ranks it ended (``Check``, ``Detected``), the collectives that
broke on a rank that left early and was still ending (``Broken``), the ``Diagnosis`` itself, and the
files and stderr logs that show it."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from validation.contract.stacks import Frame, Import, StackDump
from validation.contract.torchrun_log.failure import PeerGone
from validation.judge.record import Evidence, PhaseRecord
from validation.judge.seen import RankSilence


class Kind(enum.StrEnum):
    """What happened to the run, as the blame reads it."""

    CRASHED = "crashed"
    """A rank raised, or exited non-zero of its own choosing."""
    KILLED = "killed"
    """A rank was ended by a signal that was not torchrun's agent ending it, and raised nothing."""
    ABORTED = "aborted"
    """A rank aborted itself (SIGABRT after the C++ runtime's last word, RankFailure.aborted), and
    raised nothing: no signal came from elsewhere."""
    QUIT = "exited early"
    """A rank's code ended before the steps asked for (its heartbeats stop short) and its
    interpreter's exit then aborted (RankFailure.at_exit): the early exit is what happened."""
    HUNG = "hung"
    """Named as the rank the others waited for, or the one process of its run still running."""
    STALLED = "stalled"
    """Made no progress with the others, where nothing tells which of them hung first."""
    DIVERGED = "diverged"
    """Waited in a collective at a place (its call site, or its step) where no other rank came, while a
    strict majority of the ranks waited together at another (``Diagnosis.common``): its collectives went
    off the ranks' common path (one of its own, one it skipped, a step ahead or behind)."""
    APART = "apart"
    """Every rank waited in a collective, not all at one place, and no majority waited together at one:
    the ranks' collectives went apart, and nothing tells which rank left the common path (of two ranks,
    a collective extra on one reads the same as one missing on the other). Every rank is listed."""
    MISMATCHED = "mismatched"
    """A check of the collectives found a rank's not matching the others' and ended the run: gloo's check of a
    message's size, which aborts the rank that received one of another size than its own collective's, or
    torch's under TORCH_DISTRIBUTED_DEBUG=DETAIL (``Diagnosis.detected``). The ranks' collectives did not
    match (one rank called a collective the others did not, or with another size or type); the rank the
    check ended is where it was detected, no culprit. ``ranks``: those off the common path, where a strict
    majority of the ranks was at one call site (``Diagnosis.common``); else every rank whose collective the
    log shows, and nothing tells which left the common path."""
    OUT_OF_STEP = "out of step"
    """Failed in a collective (its traceback ends in the collective), or waited in one until the harness stopped
    the run (its stack, ``Diagnosis.waiting``: a backend whose collective without its partner waits, NCCL's),
    within a step (its last heartbeat is of a stage within that step) that a rank which then exited 0 had
    completed (its heartbeats say so, ``Diagnosis.ended``): the exited rank had called every collective of that
    step, so the blamed rank's was left without it because its earlier collectives had taken the exited rank's
    later ones. The ranks' collectives were out of step: by then the blamed rank had called more collectives than
    the exited one (one of its own that the other never called, or one the other skipped, earlier in the run; a
    collective of the same size pairs silently with the other's next one). Which of the two, and at which step,
    the evidence does not tell. ``ranks``: those that failed or waited so, at the collective's call site
    (RankFailure.raised_at, or the stack's ``call_site``). A rank the harness found running of which no stack
    was taken (``RankAt.no_stack``) is named by its heartbeat alone, within a step the exited rank had completed:
    out of step is then suspected, not shown (``Diagnosis.suspected``)."""
    SILENT = "silent"
    """Hung while the others went on without it: its heartbeats showed no new step for stall_s, its
    process still running, while another rank's showed new steps (``Diagnosis.silences``)."""
    LEFT = "left early"
    """Exited 0 before the steps asked for while the others still needed it. Where the others failed or waited in
    a collective of a step it had completed, their collectives were out of step as well (``Diagnosis.beside``).
    Or left its loop so and was still ending when the others' collective broke on its closed connections, and
    torchrun's agent ended it (SIGTERM) as it ends a rank still running (``Diagnosis.broken``)."""
    ENDED = "ended"
    """Exited 0 (its steps may all be done) while the others still had a collective with it."""
    NONFINITE = "non-finite loss"
    """The trainer stopped on a non-finite loss; the ranks blamed are those whose own loss was."""
    HALTED = "halted"
    """Its heartbeats end in a halt record at the step of the trainer's non-finite .HALT where the
    others' do not, and the .HALT holds no loss per rank: it stopped on a non-finite loss (its own,
    or one it alone checks) while the others went on into their next collective."""
    HALT_STALL = "halt stall"
    """The trainer halted on a non-finite loss and the run did not end after it."""
    IMPORTING = "importing"
    """Every process the harness found running was inside an import (its stack in Python's import
    machinery, ``Import``), none in a collective: still starting up when the stall watch came (a start-up
    longer than the phase allows, as on a busy machine or a cold file cache), or an import that does not
    return. No rank waited for another; each is listed with its import (``RankAt.importing``)."""
    TIMED_OUT = "timed out"
    """The phase timeout stopped a run whose steps still came at their pace: slow, not hung."""
    SHORT = "fewer steps"
    """Exit 0, no .HALT, fewer steps logged than asked for."""
    SHORT_RANK = "rank fewer steps"
    """Exit 0 and every step logged, but a rank's heartbeats say it left before the last step."""
    NONFINITE_EXIT = "non-finite exit"
    """No .HALT, and the trainer (the ranks blamed, or its one process) exited with the contract's code
    for a non-finite loss (``NonfiniteExit``): it stopped on one and did not say where (the .HALT the
    contract asks for with that code). Not a crash: the code is the trainer's word."""


#: the kinds whose blamed ranks failed first in their own right
FAILED = (Kind.CRASHED, Kind.KILLED, Kind.ABORTED, Kind.QUIT)


class NoStack(enum.StrEnum):
    """Why a rank blamed as hung, or as left within a step out of step (Kind.OUT_OF_STEP), has no stack: the verdict
    line says so beside its heartbeat."""

    UNTAKEN = "no stack"
    """Neither the harness (py-spy, SIGUSR1) nor the trainer's own handler left one."""
    STOPPED = "stopped, no stack"
    """Its process was stopped (SIGSTOP, or a debugger) when the harness came for it: it runs
    nothing, its own dump handler included, and py-spy cannot read it (TakenStack.state)."""


class Check(enum.StrEnum):
    """The check that found the ranks' collectives not matching (Kind.MISMATCHED)."""

    GLOO_SIZE = "gloo's check of a message's size"
    """Its enforce, thrown in gloo's own thread of the rank that received the message: it aborts (SIGABRT)."""
    TORCH_DETAIL = "torch's check of the collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)"
    """It raises in each rank before the collective runs."""


@dataclass(frozen=True)
class Detected:
    """Where a check found the ranks' collectives not matching (Kind.MISMATCHED): the ranks it ended."""

    check: Check
    ranks: tuple[int, ...]
    said: str
    """The check's words in the first of them (RankFailure.mismatch)."""
    unknown: tuple[int, ...] = ()
    """The ranks whose collective the log does not show (no traceback or report of theirs ends in one: torchrun's
    SIGTERM ended them first)."""


@dataclass(frozen=True)
class RankAt:
    """One rank a diagnosis blames, and where it was."""

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
    """Of a failed rank: 'RuntimeError: boom', 'killed by SIGKILL', 'exit code 1'."""
    pid: int | None = None
    no_stack: NoStack | None = None
    """Of a hung rank named by its heartbeat alone, or of Kind.OUT_OF_STEP one left within a step the exited
    rank had completed: why it has no stack (None: it has one, or it is blamed otherwise)."""
    beats: bool = True
    """Whether its trainer's format has heartbeats at all (Evidence.no_heartbeats): without them
    step None says nothing."""
    beat_pid: int | None = None
    """Where its last heartbeat is an earlier process's than the one blamed (torchrun started the
    workers again, and the process the harness found or torchrun reported wrote none): that earlier
    process's pid, and ``step``/``stage`` are its; None otherwise."""
    now_pid: int | None = None
    """With ``beat_pid``: the blamed process's pid (its stack's, else torchrun's report of it)."""
    site: Frame | None = None
    """Of Kind.DIVERGED and Kind.APART: the frame of the code that called the collective it waits in
    (``call_site``); of Kind.MISMATCHED and Kind.OUT_OF_STEP, and of ``Broken.ranks``, the one that called the
    collective it failed in (RankFailure.raised_at) or, of Kind.OUT_OF_STEP, waited in (``call_site``); None
    otherwise."""
    importing: Import | None = None
    """Of Kind.IMPORTING, and of a rank blamed as hung whose stack was inside an import: that import (the
    module it ran, the trainer's line that began it); None otherwise."""
    workers: tuple[StackDump, ...] | None = None
    """Of a rank blamed as hung whose stack waited for its DataLoader's worker processes
    (``StackDump.loader``): the stacks the harness took of its helpers (``Evidence.helper_stacks``; () where
    it took none); None otherwise."""

    @classmethod
    def of(cls, rec: PhaseRecord, rank: int, *, frame: str | None = None, cause: str = "",
           no_stack: NoStack | None = None, site: Frame | None = None, importing: Import | None = None,
           workers: tuple[StackDump, ...] | None = None) -> RankAt:
        ev = rec.evidence
        beat = ev.last_heartbeat.get(rank)
        node = ev.nodes.of_rank(rank) if ev.nodes is not None else None
        earlier = earlier_beat(ev, rank)
        return cls(rank, node.name if node is not None else None, beat.step if beat else None,
                   beat.stage if beat else None, frame, cause, no_stack=no_stack,
                   beats=not ev.no_heartbeats, beat_pid=earlier[0] if earlier else None,
                   now_pid=earlier[1] if earlier else None, site=site, importing=importing, workers=workers)


def earlier_beat(ev: Evidence, rank: int) -> tuple[int, int] | None:
    """Where rank's last heartbeat was written by an earlier attempt's process than the one the
    harness found (its stack) or torchrun reported: (that earlier pid, the process's pid); None
    otherwise. A heartbeat's pid other than the process's is an earlier attempt's only where
    torchrun restarted the workers (a trainer may write its heartbeats from a process of its own)."""
    beat = ev.last_heartbeat.get(rank)
    dump, failed = ev.stackdumps.get(rank), ev.rank_failures.get(rank)
    now = dump.pid if dump is not None and dump.pid is not None else failed.pid if failed is not None else None
    if (beat is None or beat.pid is None or now is None or beat.pid == now
            or not any(a.restarted for a in ev.attempts)):
        return None
    return beat.pid, now


@dataclass(frozen=True)
class Broken:
    """Of Kind.LEFT of ranks torchrun's agent ended (SIGTERM) while they were still ending (left.py ``left_ending``):
    the ranks whose collective broke on a peer gone, the first failures torchrun saw, and what their words say of
    the peer."""

    ranks: tuple[RankAt, ...]
    """Each at the collective it failed in (``RankAt.frame``, ``RankAt.site``), its error its ``cause``."""
    peer: PeerGone
    """CLOSED where every one's words say their peer's process closed the connection; LOST where one's say only
    that it was lost (a network failing between them reads the same)."""
    one_host: bool
    """Every rank ran on one host (one torchrun agent, or every node's on the same host): no network between them
    to fail, so a connection lost is a peer's process ending too (one that ends with a message unread resets its
    connections: 'Connection reset by peer')."""

    @property
    def network_fits(self) -> bool:
        """Their words fit a network failing between the ranks' hosts as well as the peer's process ending: a
        connection lost (PeerGone.LOST), of ranks on several hosts."""
        return self.peer != PeerGone.CLOSED and not self.one_host


@dataclass(frozen=True)
class Diagnosis:
    """What happened to one process of a point, decided once from its evidence."""

    kind: Kind
    ranks: tuple[RankAt, ...] = ()
    """The ranks blamed, first the one the verdict line leads with; () where the evidence names none."""
    or_else: Diagnosis | None = None
    """Another account the evidence fits as well (ranks that may instead have left first,
    ``maybe_departed``): which came first cannot be told. None where none does."""
    cause: str | None = None
    """What ended the run where no rank is blamed for it (the log's last exception), else the first
    blamed rank's cause."""
    step: int | None = None
    """The step it happened at: the .HALT's step, else the first blamed rank's last heartbeat's."""
    logs: tuple[str, ...] = ()
    """The stderr logs that show it, relative to the results directory."""
    files: tuple[str, ...] = ()
    """The other files that show it (.HALT, stack dumps, heartbeats), relative to the results directory."""
    from_log: bool = False
    """No account of any rank's own end says it: ``cause`` is the last exception of the run's stderr
    (None where it holds none), and a run of one process blames its rank 0."""
    waited: tuple[int, ...] = ()
    """Of ranks blamed as hung because the others' collective gave up waiting for them (``waited_for``):
    the ranks that gave up; ``cause`` is the first one's word of it."""
    silences: tuple[RankSilence, ...] = ()
    """Of ranks blamed as silent (Kind.SILENT), in the order of ``ranks``: how long each was silent and
    how far the others went meanwhile."""
    common: tuple[RankAt, ...] = ()
    """Of Kind.DIVERGED: the ranks that waited together at one place, which the ranks blamed never
    reached; of Kind.MISMATCHED, the ranks at the call site a strict majority was at; () otherwise."""
    detected: Detected | None = None
    """Of Kind.MISMATCHED: the check that found it, and the ranks it ended; None otherwise."""
    ended: tuple[RankAt, ...] = ()
    """Of Kind.OUT_OF_STEP: the ranks that exited 0 (or left, ``ended_exit_0``) having completed the step the ranks
    blamed failed or waited in; () otherwise."""
    ended_exit_0: bool = True
    """Of Kind.OUT_OF_STEP: the ranks of ``ended`` exited 0; False where they left and torchrun's agent ended them
    while they were still ending (the ``beside`` of a Kind.LEFT whose ``broken`` is set)."""
    waiting: bool = False
    """Of Kind.OUT_OF_STEP: the ranks blamed still waited in their collective, with no partner left, when the harness
    stopped the run (a backend whose collective waits for its partner: NCCL's), rather than failed in it (of a rank
    of no stack, ``suspected``: still running within the step, in a call not known); False otherwise."""
    beside: Diagnosis | None = None
    """Of Kind.LEFT: the ranks' collectives out of step as well (Kind.OUT_OF_STEP), where the ranks left failed or
    waited in a collective of a step the rank that left had completed before it exited 0, or before it left and was
    still ending (``broken``). Both are faults of their own: the early exit ended the run, and without it they would
    have failed later (their collectives still out of step). None otherwise."""
    broken: Broken | None = None
    """Of Kind.LEFT of ranks torchrun's agent ended (SIGTERM) while they were still ending, not exited 0
    (left.py ``left_ending``): the ranks whose collective broke on their closed connections, and their words;
    ``cause`` is the first one's error. None otherwise."""

    @property
    def rank(self) -> int | None:
        return self.ranks[0].rank if self.ranks else None

    @property
    def stage(self) -> str | None:
        return self.ranks[0].stage if self.ranks else None

    @property
    def node(self) -> str | None:
        return self.ranks[0].node if self.ranks else None

    @property
    def suspected(self) -> bool:
        """Of Kind.OUT_OF_STEP: a rank blamed has no stack (``RankAt.no_stack``), so nothing shows it in a
        collective: it was within a step a rank that exited 0 had completed, which a rank left waiting in a
        collective of that step shows, and so does one that hung of its own after its part in that step's
        collectives (or a trainer whose ranks do not meet every step).

        Of Kind.LEFT of ranks ended while still ending (``broken``): the ranks ran on several hosts and the
        others' words say only that their peer was lost (``Broken.network_fits``: a reset, NCCL's remote error),
        which a network failing between them while the rank ran code of its own between steps writes as well; or
        several ranks stopped behind the others, and one of them need have left while another ran so. torchrun's
        SIGTERM ends a rank still running and one still ending alike. Certain where one rank stopped behind and
        every broken collective's words say the peer's process closed the connection (PeerGone.CLOSED), or the
        ranks ran on one host (``Broken.one_host``): a running rank's connection does neither."""
        if self.kind == Kind.LEFT and self.broken is not None:
            return self.broken.network_fits or len(self.ranks) > 1
        return self.kind == Kind.OUT_OF_STEP and any(at.no_stack is not None for at in self.ranks)

    @property
    def undecided(self) -> bool:
        """Whether the first failure cannot be told (``or_else``)."""
        return self.or_else is not None


def diagnosis_of(kind: Kind, ranks: tuple[RankAt, ...], rec: PhaseRecord, *, or_else: Diagnosis | None = None,
                 cause: str | None = None, step: int | None = None, logs: tuple[str, ...] = (),
                 files: tuple[str, ...] = (), waited: tuple[int, ...] = (),
                 silences: tuple[RankSilence, ...] = (), common: tuple[RankAt, ...] = (),
                 detected: Detected | None = None, ended: tuple[RankAt, ...] = (), waiting: bool = False,
                 beside: Diagnosis | None = None, broken: Broken | None = None) -> Diagnosis:
    first = ranks[0] if ranks else None
    broke = broken.ranks if broken is not None else ()
    return Diagnosis(kind, ranks, or_else, cause if cause is not None else (first.cause or None) if first else None,
                     step if step is not None else first.step if first else None, logs,
                     files or files_of(rec, ranks + common + ended + broke), waited=waited, silences=silences,
                     common=common, detected=detected, ended=ended, waiting=waiting, beside=beside, broken=broken)


def files_of(rec: PhaseRecord, ranks: tuple[RankAt, ...]) -> tuple[str, ...]:
    """The stack dumps and heartbeat files of ``ranks`` that the run directory holds, and its .HALT."""
    ev, out = rec.evidence, []
    for at in ranks:
        if at.rank is None:
            continue
        dump = ev.stackdumps.get(at.rank)
        if dump is not None and dump.frames:
            out.append(f"{rec.out_dir}/{dump.path}")
        beat = f"heartbeat_rank{at.rank}.jsonl"
        if beat in ev.files:
            out.append(f"{rec.out_dir}/{beat}")
    if ev.halt is not None and ".HALT" in ev.files:
        out.append(f"{rec.out_dir}/.HALT")
    return tuple(out)


def logs_of(r: PhaseRecord, ranks) -> tuple[str, ...]:
    """The stderr logs that show ``ranks``: of a launch of several nodes, the log of each node one
    of them ran on (the record's stderr is that of the node its verdict names, else of the agent
    that ended first); else the record's stderr."""
    nodes, ranks = r.evidence.nodes, {k for k in ranks if k is not None}
    logs = [n.log for n in nodes.nodes if ranks & set(n.ranks)] if nodes is not None else []
    return tuple(f"{r.out_dir}/{log}" for log in logs or [r.evidence.stderr_log])
