"""Who failed, how and where: the one place a failed run's blame is decided, as typed data.

``diagnose(rec)`` reads a record's evidence (torchrun's account of how each rank ended, the last
heartbeats, the stacks the harness took, the .HALT) and returns a frozen ``Diagnosis``: the kind of
failure, the rank(s) it blames with their node, step, stage, innermost frame and cause, another
account the evidence fits as well where which came first cannot be told, and the files that show
it. The findings (validation/judge/findings/) and the point's verdict line render a Diagnosis into
words and decide nothing of their own; tests assert on it.

How a rank is known to have left early with exit 0, under torchrun (its agent is what reports ends):

- the run failed: torchrun lists every worker that did not succeed, those it stopped with SIGTERM
  too; a rank of the world it does not list had exited 0 before the others failed. Only where its
  own agent lived to report: an agent a signal ended (a node going down) reports nothing of its
  workers, and a rank under it may have died with it (``unreported``);
- the harness stopped a stalled or timed-out run: it looked for every rank's process to take its
  stack (TakenStack), so a rank it found no process of had ended; with no failure of it in
  torchrun's logs, with exit 0 (torchrun ends every worker when one fails).

Only ranks that wrote a heartbeat (they ran) and whose last heartbeat says they did not complete
the last step asked for count (``incomplete``): a step before it, or the last step itself in a
record of a stage within a step, whose ``step`` is the step in progress (the contract,
nsa/contract.py ``HEARTBEAT_STAGES_IN_STEP``). A rank whose last record may say it completed the
last step did not leave early: it finished its steps and exited while another hung after them.

A trainer whose format has no heartbeats (``Evidence.no_heartbeats``: a Hugging Face Trainer's) says
nothing of where a rank stopped: a rank known to have exited 0 left early where training.csv logged
fewer steps than asked for (``_left_unrecorded``), since no rank completes a step without the others.

A rank whose heartbeats never record a step's end (``Beat.ends_steps``; the seed's format, where
ranks other than 0 beat only as each step starts) says by a last record within the last step only
that it started it (``started_last``). It is named only where a rank that remained (running or
failed) shows by its own records that it had not completed the last step either.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from nsa.contract import EXIT_NONFINITE, EXIT_WATCHDOG, HEARTBEAT_STAGE_HALT, HEARTBEAT_STAGES_IN_STEP
from validation.contract.files import HaltInfo
from validation.contract.stacks import Frame, StackDump
from validation.contract.torchrun_log import RankFailure, agent_stopped, gave_up
from validation.judge.nodes import killed_agent, killed_agents, signal_name
from validation.judge.record import TRAINER_KINDS, Beat, Evidence, PhaseRecord, Status
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
    SILENT = "silent"
    """Hung while the others went on without it: its heartbeats showed no new step for stall_s, its
    process still running, while another rank's showed new steps (``Diagnosis.silences``)."""
    LEFT = "left early"
    """Exited 0 before the steps asked for while the others still needed it."""
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
    """Why a rank blamed as hung has no stack: the verdict line says so beside its heartbeat."""

    UNTAKEN = "no stack"
    """Neither the harness (py-spy, SIGUSR1) nor the trainer's own handler left one."""
    STOPPED = "stopped, no stack"
    """Its process was stopped (SIGSTOP, or a debugger) when the harness came for it: it runs
    nothing, its own dump handler included, and py-spy cannot read it (TakenStack.state)."""


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
    """Of a hung rank named by its heartbeat alone: why it has no stack (None: it has one, or it is
    not blamed as hung)."""
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
    (``call_site``); None otherwise."""

    @classmethod
    def of(cls, rec: PhaseRecord, rank: int, *, frame: str | None = None, cause: str = "",
           no_stack: NoStack | None = None, site: Frame | None = None) -> RankAt:
        ev = rec.evidence
        beat = ev.last_heartbeat.get(rank)
        node = ev.nodes.of_rank(rank) if ev.nodes is not None else None
        earlier = earlier_beat(ev, rank)
        return cls(rank, node.name if node is not None else None, beat.step if beat else None,
                   beat.stage if beat else None, frame, cause, no_stack=no_stack,
                   beats=not ev.no_heartbeats, beat_pid=earlier[0] if earlier else None,
                   now_pid=earlier[1] if earlier else None, site=site)


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
    reached; () otherwise."""

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
    def undecided(self) -> bool:
        """Whether the first failure cannot be told (``or_else``)."""
        return self.or_else is not None


def _diagnosis(kind: Kind, ranks: tuple[RankAt, ...], rec: PhaseRecord, *, or_else: Diagnosis | None = None,
               cause: str | None = None, step: int | None = None, logs: tuple[str, ...] = (),
               files: tuple[str, ...] = (), waited: tuple[int, ...] = (),
               silences: tuple[RankSilence, ...] = (), common: tuple[RankAt, ...] = ()) -> Diagnosis:
    first = ranks[0] if ranks else None
    return Diagnosis(kind, ranks, or_else, cause if cause is not None else (first.cause or None) if first else None,
                     step if step is not None else first.step if first else None, logs,
                     files or _files(rec, ranks + common), waited=waited, silences=silences, common=common)


def _files(rec: PhaseRecord, ranks: tuple[RankAt, ...]) -> tuple[str, ...]:
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


# --- the rank that failed first, from torchrun's account of each rank's end ------------------------

#: the exit code of the artifact contract (nsa/contract.py) that goes with a .HALT's source: a rank
#: that stopped as the contract asks when its watchdog saw a stall, or its loss went non-finite
_HALT_EXIT = {"watchdog": EXIT_WATCHDOG, "nonfinite": EXIT_NONFINITE}


@dataclass(frozen=True)
class NonfiniteExit:
    """A trainer that exited with the contract's code for a non-finite loss (EXIT_NONFINITE) and left
    no .HALT (``nonfinite_exit``): under torchrun, whose own exit is 1, the ranks its log says exited
    so, lowest first; () where the harness saw the code itself (a trainer run as one process)."""

    ranks: tuple[int, ...] = ()

    def text(self, exit_code: int | None) -> str:
        """The verdict: 'trainer stopped on a non-finite loss, with no .HALT: rank 1 exited with code 4,
        the contract's code for it (exit code 1)'; '... with no .HALT (exit code 4, the contract's code
        for it)' of the one process."""
        head = "trainer stopped on a non-finite loss, with no .HALT"
        if not self.ranks:
            return f"{head} (exit code {exit_code}, the contract's code for it)"
        who = f"rank{'s' * (len(self.ranks) > 1)} {', '.join(map(str, self.ranks))}"
        return f"{head}: {who} exited with code {EXIT_NONFINITE}, the contract's code for it (exit code {exit_code})"


def nonfinite_exit(exit_code: int | None, failures: Mapping[int, RankFailure], halt: HaltInfo | None
                   ) -> NonfiniteExit | None:
    """The trainer stopped on a non-finite loss with the contract's exit code for it and wrote no .HALT:
    its ranks that exited so (RankFailure.stopped_nonfinite), else its one process's own exit code.
    None where it left a .HALT (that decides: the guard's, or one of no source, cut short), or a rank
    failed in its own right (an exception, a signal: that is the crash, whatever the others' guard saw
    after it)."""
    return None if halt is not None else exited_nonfinite(exit_code, failures)


def exited_nonfinite(exit_code: int | None, failures: Mapping[int, RankFailure]) -> NonfiniteExit | None:
    """``nonfinite_exit`` whatever .HALT the run left: the exit code says the trainer's non-finite guard
    stopped it, where a .HALT cut short before its source cannot say whose it is."""
    if any(f.own for f in failures.values()):
        return None
    ranks = tuple(sorted(k for k, f in failures.items() if f.stopped_nonfinite))
    return NonfiniteExit(ranks) if ranks or (exit_code == EXIT_NONFINITE and not failures) else None


def nonfinite_exit_of(rec: PhaseRecord) -> NonfiniteExit | None:
    """``nonfinite_exit`` of a trainer's stored record."""
    ev = rec.evidence
    return nonfinite_exit(rec.exit_code, ev.rank_failures, ev.halt) if rec.kind in TRAINER_KINDS else None


def root_rank(failures: Mapping[int, RankFailure], halt: str | None = None) -> int | None:
    """The lowest rank that failed in its own right (RankFailure.own); else the one rank that
    exited non-zero silently (RankFailure.silent): a rank that fails before init_process_group
    leaves no ``[rankN]:`` line, and torchrun ends the ranks waiting for it (SIGTERM) only once it
    saw that one fail, so of the ranks torchrun reports it is the one that failed first (its
    summary's "Root Cause"); else None (several silent failures: nothing tells). ``halt``: the
    source of the run's .HALT, where it left one: the contract's exit code of that stop (3 of a
    watchdog, 4 of a non-finite loss) is the trainer stopping as the contract asks, no failure of
    its own; without a .HALT it is a crash like any other code."""
    own = next((rank for rank, f in sorted(failures.items()) if f.own), None)
    if own is not None:
        return own
    silent = silent_ranks(failures, halt)
    return silent[0] if len(silent) == 1 else None


def silent_ranks(failures: Mapping[int, RankFailure], halt: str | None = None) -> list[int]:
    """The ranks that exited non-zero silently (RankFailure.silent), lowest first, but not with the
    contract's exit code of the run's .HALT (``halt``, see ``root_rank``)."""
    on_purpose = _HALT_EXIT.get(halt or "")
    return sorted(rank for rank, f in failures.items() if f.silent and f.exit_code != on_purpose)


def _halt_source(ev: Evidence) -> str | None:
    return ev.halt.source if ev.halt is not None else None


def root_of_evidence(ev: Evidence) -> int | None:
    """``root_rank`` of a record's evidence, its exit codes read against the run's .HALT."""
    return root_rank(ev.rank_failures, _halt_source(ev))


def silent_of_evidence(ev: Evidence) -> list[int]:
    """``silent_ranks`` of a record's evidence, read against the run's .HALT."""
    return silent_ranks(ev.rank_failures, _halt_source(ev))


@dataclass(frozen=True)
class Died:
    """A rank that failed in its own right before the other ranks' watchdog wrote the .HALT while
    waiting for it (``died_before_watchdog``), and how it ended (RankFailure.cause)."""

    rank: int
    cause: str | None


def died_before_watchdog(halt: HaltInfo | None, stopped: bool, failures: Mapping[int, RankFailure]) -> Died | None:
    """The rank that failed in its own right (torchrun's log: killed by a signal, or an exception
    of its own) in a run that the trainer's watchdog then halted, the harness not having
    ``stopped`` it: the watchdog fired in the ranks left waiting for it, so that rank is the cause
    and no rank hung. Over NCCL a dead peer breaks no collective, so the others' watchdog is what
    ends such a run. None otherwise (a watchdog's own exit, 3, and torchrun's SIGTERM are no
    failure of their own)."""
    if halt is None or halt.source != "watchdog" or stopped:
        return None
    rank = root_rank(failures, halt.source)
    return None if rank is None else Died(rank, failures[rank].cause)


def died_first(rec: PhaseRecord) -> Died | None:
    """``died_before_watchdog`` of a stored record."""
    return died_before_watchdog(rec.evidence.halt, rec.stopped_by_harness,
                                rec.evidence.rank_failures)


def killed_by_signal(rec: PhaseRecord) -> int | None:
    """The rank that failed first in its own right (``root_rank``) where a signal of its own ended
    it and it raised nothing (not the abort of an exit after its collective broke); else None."""
    root = root_of_evidence(rec.evidence)
    fail = rec.evidence.rank_failures.get(root) if root is not None else None
    return (root if fail is not None and fail.own and fail.signal and not fail.exception and fail.aborted is None
            else None)


def failed_as(rec: PhaseRecord, root: int) -> tuple[Kind, str]:
    """How ``root``, the rank that failed first in its own right, failed, and its cause: killed by a
    signal from elsewhere (``killed_by_signal``); aborted itself, which the interpreter's exit did
    after its code ended before its steps were done (its heartbeats stop short: Kind.QUIT), else
    after its last step or within a step (Kind.ABORTED); else crashed."""
    fail, beat = rec.evidence.rank_failures[root], rec.evidence.last_heartbeat.get(root)
    if fail.aborted is not None and fail.at_exit and incomplete(beat, rec.steps):
        return Kind.QUIT, f"its heartbeats stop at step {beat.step} of {rec.steps}, and it then {fail.cause}"
    if fail.aborted is not None:
        done = beat is not None and beat.step is not None and not incomplete(beat, rec.steps)
        return Kind.ABORTED, fail.cause + (", after its last step" if done else "")
    return (Kind.KILLED if killed_by_signal(rec) == root else Kind.CRASHED), fail.located or fail.cause


# --- hung ranks, from the stacks and the heartbeats -----------------------------------------------

#: a frame of a collective: the rank waits there for the others (c10d's collectives, FSDP's, the
#: functional collectives; accelerate, transformers' Trainer and DeepSpeed reach theirs through them)
#: where it is the innermost frame of the rank's own (``_PASSING``'s frames above it aside)
_COLLECTIVE = "torch/distributed/"
#: what lies under torch/distributed/ and waits for no peer: torchrun's error recording
#: (``@record`` wraps a user's main, so its frame is at the bottom of every rank's stack) and its
#: process launch
_NOT_COLLECTIVE = ("torch/distributed/elastic/multiprocessing/", "torch/distributed/run.py",
                   "torch/distributed/launcher/")
#: torch's frames that only pass a call on, which may lie above a collective's own frame (the
#: dispatcher's op call of a functional collective's wait, a decorator's or a compiler guard's
#: wrapper): the innermost frame of the rank's own is the first below them
_PASSING = ("torch/_ops.py", "torch/utils/_contextlib.py", "torch/_compile.py", "torch/_dynamo/eval_frame.py",
            "torch/_tensor.py", "torch/overrides.py", "torch/utils/_python_dispatch.py", "torch/autograd/function.py")
#: DDP's module, where it calls the C++ collectives itself (its buffers' broadcast before each
#: forward, its parameters' first sync): as the innermost frame, the rank waits there for the others.
#: Deeper in a stack it is only DDP's forward calling the model, where a rank hangs of its own.
_DDP = "torch/nn/parallel/distributed.py"
#: the autograd engine as a stack's innermost frame: DDP's reducer waits there, in C++ frames
#: py-spy does not show, for the gradient all-reduce of the ranks that have not come
_BACKWARD_ENGINE = "_engine_run_backward"
#: the stages of one step in the order a rank enters them (nsa/contract.py's heartbeat ``stage``)
STAGE_ORDER = ("data", "forward", "backward", "optimizer", "step")


def in_collective(dump: StackDump) -> bool:
    """The rank was waiting for the others: where it was blocked, its innermost frames (the top of
    the stack, torch's frames that pass a call on aside) are a torch.distributed collective's, DDP's
    own collective, or DDP's backward. A torch.distributed frame deeper in the stack says nothing:
    ``@record`` puts one at the bottom of every rank's stack, and FSDP's forward lies under the
    model's code, where a rank hangs of its own."""
    files = [fr.file.replace("\\", "/") for fr in dump.frames]
    if dump.frames and (dump.frames[0].func == _BACKWARD_ENGINE or files[0].endswith(_DDP)):
        return True
    own = next((f for f in files if not any(p in f for p in _PASSING)), None)
    return own is not None and _COLLECTIVE in own and not any(n in own for n in _NOT_COLLECTIVE)


def hung_ranks(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat]) -> list[int]:
    """The ranks outside the collectives while some rank waits in one; else, of the ranks outside
    them and those of no stack that are furthest behind of all (else of every rank with a heartbeat),
    those furthest behind (``behind``). Empty when every rank waits in a collective and none is behind
    the others: nothing tells. A rank of no stack (frozen by SIGSTOP, or py-spy failed on it) may be
    anywhere, so where its heartbeat is the furthest behind it is a candidate: over NCCL the rank that
    waits for it shows no collective frame (its wait is a CUDA synchronisation inside the training
    step), and only the heartbeats tell them apart."""
    ranks = sorted(set(stacks) | set(beats))
    waiting = [k for k in ranks if k in stacks and in_collective(stacks[k])]
    outside = [k for k in ranks if k in stacks and stacks[k].frames and k not in waiting]
    if waiting and outside:
        return outside
    known = [k for k in ranks if k in beats and beats[k].step is not None]
    last = behind(known, beats)
    unstacked = [k for k in last if not (k in stacks and stacks[k].frames)]  # of no stack, and furthest behind
    candidates = sorted(outside + unstacked)
    hung = behind(candidates, beats) if candidates else last
    return [] if not outside and len(hung) == len(known) else hung


def behind(ranks: list[int], beats: Mapping[int, Beat]) -> list[int]:
    """Those of ``ranks`` furthest behind by their last heartbeat: the lowest step, then the
    earliest stage of it (where every stage is one whose order is known); all of them when one
    has no heartbeat. Where no stack tells (every rank outside the collectives in frames py-spy
    shows, or none recorded), the hung rank is the one that never got as far in the step."""
    if not ranks or any(k not in beats or beats[k].step is None for k in ranks):
        return ranks
    low = min(beats[k].step for k in ranks)
    ranks = [k for k in ranks if beats[k].step == low]
    if any(beats[k].stage not in STAGE_ORDER for k in ranks):
        return ranks
    first = min(STAGE_ORDER.index(beats[k].stage) for k in ranks)
    return [k for k in ranks if STAGE_ORDER.index(beats[k].stage) == first]


#: torch's own package: the innermost frame outside it called into torch (``call_site``)
_TORCH = "/torch/"


def call_site(dump: StackDump) -> Frame | None:
    """The frame of the code that called the collective ``dump`` waits in: the innermost frame outside
    torch's own package (the trainer's, or a library's such as transformers' Trainer); None where every
    frame is torch's. Two ranks waiting in the same collective at different call sites wait for
    different collectives: the call site, not the collective's name, says where a rank is."""
    return next((fr for fr in dump.frames if _TORCH not in fr.file.replace("\\", "/")), None)


@dataclass(frozen=True)
class Place:
    """Where a rank waits in a collective: the last step its heartbeats say it completed and the call
    site of its collective (``call_site``); ranks at one place wait for the same collective."""

    done: int | None
    """Beat.done; None where the ranks' heartbeats cannot say it (``places``)."""
    site: Frame | None


def places(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat], ranks: list[int]) -> dict[int, Place]:
    """Where each of ``ranks`` waits. A step tells only where every rank's records come every step: a
    rank that beats every few steps may have run on past its last record with the others."""
    by_step = all((b := beats.get(k)) is not None and (b.every or 1) == 1 for k in ranks)
    return {k: Place(beats[k].done if by_step else None, call_site(stacks[k])) for k in ranks}


@dataclass(frozen=True)
class Split:
    """Ranks that all wait in collectives, not all at one place (``apart``)."""

    off: tuple[int, ...]
    """The ranks away from the place a strict majority waits at; () where no majority waits at one
    place, and nothing tells which rank left the common path."""
    common: tuple[int, ...]
    """That majority; () where there is none."""


def apart(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat], world: int) -> Split | None:
    """Of a world whose every rank waits in a collective (``in_collective``), not all at one place
    (``places``): the ranks off the common path and those of it. None where a rank has no stack or
    waits outside the collectives (a hang of its own: ``hung_ranks``), every rank waits at one place
    (nothing tells), or no majority waits at one place and the ranks' steps differ (the one behind is
    the one the others wait for: ``hung_ranks``)."""
    ranks = list(range(world))
    if world < 2 or not all(k in stacks and stacks[k].frames and in_collective(stacks[k]) for k in ranks):
        return None
    at = places(stacks, beats, ranks)
    if len(set(at.values())) == 1:
        return None
    counts = {p: sum(1 for q in at.values() if q == p) for p in at.values()}
    common = max(counts, key=counts.get)
    if 2 * counts[common] > world:
        return Split(tuple(k for k in ranks if at[k] != common), tuple(k for k in ranks if at[k] == common))
    return Split((), ()) if len({p.done for p in at.values()}) == 1 else None


def waited_for(failures: Mapping[int, RankFailure], beats: Mapping[int, Beat]) -> list[int]:
    """Of a run some of whose ranks' collective gave up waiting for a peer (RankFailure.gave_up_waiting:
    gloo's timeout raised in them, or their NCCL watchdog took them down): the ranks they waited for.
    Those torchrun's agent ended once the first of them was down (RankFailure.by_agent), with no
    exception and no watchdog of their own, were still running and not in that collective; of them,
    those furthest behind (``behind``): one left is the one. [] where no collective gave up so, no
    rank was left running, or several were and no heartbeat tells them apart (nothing tells)."""
    if not any(f.gave_up_waiting for f in failures.values()):
        return []
    running = sorted(k for k, f in failures.items() if f.by_agent and not f.exception and f.nccl_watchdog is None)
    hung = behind(running, beats)
    return [] if len(running) > 1 and len(hung) == len(running) else hung


# --- ranks that left early (the module's docstring) ------------------------------------------------

def incomplete(beat: Beat | None, steps: int) -> bool:
    """The rank whose last heartbeat is ``beat`` did not complete ``steps``: its last record is of
    an earlier step, or of a stage within the last one (that step in progress). False where the
    record may say the last step was completed, or says no step."""
    if beat is None or beat.step is None:
        return False
    return beat.step < steps or (beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP and beat.ends_steps)


def started_last(beat: Beat | None, steps: int) -> bool:
    """``beat`` is a record within the last step of a rank whose heartbeats record no step's end:
    it started the last step, and its records cannot say whether it completed it."""
    return (beat is not None and beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP
            and not beat.ends_steps)


def departed(rec: PhaseRecord) -> list[int]:
    """The ranks that left early (the module's docstring), lowest first; [] when none did or
    nothing tells (one process, a failure of some rank's own, a process of unknown rank)."""
    others = remained(rec)
    if not others:
        return []
    beats, waiting, silent = rec.evidence.last_heartbeat, not_done(rec, others), unreported(rec)
    return [k for k in range(rec.world_size) if k not in others and k not in silent
            and (incomplete(beats.get(k), rec.steps) or (started_last(beats.get(k), rec.steps) and bool(waiting))
                 or _left_unstarted(rec, k, others) or _left_unrecorded(rec, k))]


def _left_unrecorded(rec: PhaseRecord, rank: int) -> bool:
    """Of a trainer whose format has no heartbeats (Evidence.no_heartbeats: a Hugging Face Trainer's),
    ``rank`` (one known to have exited 0) exited before the last step asked for: training.csv logged
    fewer steps (or none), and a step of a run of several ranks is one no rank completes without the
    others (its gradients' all-reduce), so the rank that ended left the others short of it. Where it
    stopped is not known; torchrun's account of the others' ends is what says it ended."""
    if not rec.evidence.no_heartbeats or rank in rec.evidence.last_heartbeat:
        return False
    logged = rec.metrics.steps_completed
    return logged is None or logged < rec.steps


def _left_unstarted(rec: PhaseRecord, rank: int, others: set[int]) -> bool:
    """``rank`` (not among ``others``, those known not to have exited 0) exited 0 before it wrote
    any heartbeat while the others waited for it in their collectives (init_process_group, a first
    barrier), until the harness stopped the run: it wrote no record, torchrun reports no failure of
    it, and the harness found no process of it where it sees every rank (every agent on this host),
    while each rank it found waited in a collective. A rank-dependent early return before the
    process group leaves exactly this; the ranks that waited are not the ones to name."""
    ev = rec.evidence
    if rank in ev.last_heartbeat or (rec.stalled_s is None and not rec.timed_out):
        return False
    if ev.nodes is not None and ev.nodes.launcher != "torchrun":
        return False  # srun's nodes on other hosts: the harness does not see their processes
    found = [ev.stackdumps.get(k) for k in others]
    return bool(found) and all(d is not None and d.frames and in_collective(d) for d in found)


def own_root(rec: PhaseRecord) -> int | None:
    """The rank that failed first in its own right (``root_rank``), but not one that only exited
    non-zero silently (RankFailure.silent: an exit code, no exception, no signal): a rank whose
    collective broke when a peer left may catch the error and exit 1 with a message of its own, so
    a silent exit yields to a rank that left early (``departed``)."""
    root = root_of_evidence(rec.evidence)
    return None if root is None or rec.evidence.rank_failures[root].silent else root


def root_of(rec: PhaseRecord) -> int | None:
    """The rank a crash is blamed on as having failed first (``root_rank``), None where a rank left
    early and the one torchrun saw fail first only exited non-zero silently after it."""
    return root_of_evidence(rec.evidence) if not departed(rec) else None


def maybe_departed(rec: PhaseRecord) -> list[int]:
    """Of a run whose first failures torchrun saw are silent exits (``silent_ranks``; no rank
    failed in its own right) and in which no rank is known to have left (``departed``): the ranks
    torchrun then ended with SIGTERM whose last heartbeat had not reached the step of any silent one
    (by at least their own heartbeat interval, ``Beat.every``), lowest first. Such a rank was still
    running behind the others, and the silent ones failed in their own right; or it had exited 0
    early and was still ending (its interpreter's exit, a process group's teardown, an atexit hook)
    when torchrun came for it, and the silent ones only caught their collective breaking. torchrun's
    log reads the same either way (SIGTERM, no exception), and so do the heartbeats: the crash names
    both (``silent_first``). Not of a run the harness stopped: its stacks tell the ranks still running,
    and the SIGTERMs its stop brings are no sign of an end already under way."""
    ev = rec.evidence
    first = silent_first(rec) if rec.stalled_s is None and not rec.timed_out else []
    at = [b.step for k in first if (b := ev.last_heartbeat.get(k)) is not None and b.step is not None]
    if not first or len(at) < len(first):
        return []
    return [k for k, f in sorted(ev.rank_failures.items()) if k not in first and f.signal == "SIGTERM"
            and f.by_agent and not f.exception and (b := ev.last_heartbeat.get(k)) is not None and b.step is not None
            and b.step + (b.every or 1) <= min(at)]


def silent_first(rec: PhaseRecord) -> list[int]:
    """The ranks whose silent exits are the first failures torchrun saw: every rank that exited
    non-zero silently where none failed in its own right and none is known to have left early."""
    if rec.world_size < 2 or own_root(rec) is not None or departed(rec):
        return []
    return silent_of_evidence(rec.evidence)


def exited_0(rec: PhaseRecord) -> list[int]:
    """The ranks known to have ended with exit 0 that ran (wrote a heartbeat): those that left early
    (``departed``) and those that may have completed their steps, lowest first; [] where nothing
    tells which ranks ended so (``remained``)."""
    others, silent = remained(rec), unreported(rec)
    return [k for k in range(rec.world_size) if others and k not in others and k not in silent
            and k in rec.evidence.last_heartbeat]


def unreported(rec: PhaseRecord) -> set[int]:
    """The ranks whose torchrun agent a signal ended (``killed_agents``: kill -9 of it, the node
    going down): a dead agent reports nothing of its workers, so no report of a rank's failure there
    is no sign that it exited 0; it may have died with its node."""
    nodes = rec.evidence.nodes
    if nodes is None:
        return set()
    return {k for n in killed_agents(nodes.launcher, nodes.nodes, rec.stopped_by_harness) for k in n.ranks}


def ended_before(rec: PhaseRecord, rank: int) -> str | None:
    """How ``rank`` had ended before the run was stopped: 'exited 0' (``exited_0``: early or after
    its steps), else, where the harness stopped the run, the failure torchrun reported of it; None
    where it was still running (a stack of it was taken) or nothing says. A stack dump file without
    frames (one a trainer opened for faulthandler and never wrote) is no sign that it ran."""
    if rank in exited_0(rec) or (rank not in rec.evidence.last_heartbeat and rank in departed(rec)):
        return "exited 0"
    f = rec.evidence.rank_failures.get(rank)
    dump = rec.evidence.stackdumps.get(rank)
    if f is None or (dump is not None and dump.frames) or (rec.stalled_s is None and not rec.timed_out):
        return None
    return f.cause


def remained(rec: PhaseRecord) -> set[int]:
    """The ranks known not to have exited 0: those that failed (torchrun's logs) and those the
    harness found running when it stopped the run; empty where nothing tells which ranks left
    (see ``departed``) or a rank failed in its own right (``own_root``)."""
    ev = rec.evidence
    if rec.world_size < 2 or not rec.steps or own_root(rec) is not None:
        return set()
    if rec.stopped_by_harness:
        if any(t.rank is None for t in ev.taken_stacks):
            return set()  # a process of unknown rank may be the one that seems gone
        return set(ev.rank_failures) | {t.rank for t in ev.taken_stacks} | _watchdog_dumped(rec)
    if rec.exit_code not in (0, None) and ev.rank_failures:
        return set(ev.rank_failures) | signalled_ranks(rec)
    return set()


def signalled_ranks(rec: PhaseRecord) -> set[int]:
    """The ranks whose process an agent says it signalled (``Evidence.signalled_pids``): running
    when it came for them, whether or not it reported their end (an agent that lost the rendezvous
    store ends its workers and raises, with no word of how they ended)."""
    signalled = set(rec.evidence.signalled_pids)
    return {k for k, seen in rec.evidence.rank_processes.items() if seen.pid in signalled}


def _watchdog_dumped(rec: PhaseRecord) -> set[int]:
    """Under a watchdog's .HALT, the ranks whose own stack dump holds frames: they took the
    watchdog's way out (stacks, .HALT, its exit code), not exit 0, though torchrun's log may not
    say so (the harness stopped torchrun while it waited for another rank, one frozen by SIGSTOP
    that its SIGTERM cannot end)."""
    ev = rec.evidence
    if ev.halt is None or ev.halt.source != "watchdog":
        return set()
    return {k for k, dump in ev.stackdumps.items() if dump.frames}


def not_done(rec: PhaseRecord, ranks: set[int]) -> list[int]:
    """Those of ``ranks`` whose own records say they had not completed the last step."""
    return sorted(k for k in ranks if incomplete(rec.evidence.last_heartbeat.get(k), rec.steps))


def failed_first(r: PhaseRecord) -> int | None:
    """Of a run the harness stopped (its stall watch or the timeout): the rank that had failed in
    its own right before it came (torchrun's log: an exception of its own, a signal other than the
    agent's SIGTERM, or the one rank that exited non-zero), which the others then waited for: a
    rank that dies before its process group leaves the others waiting in init_process_group, and
    across nodes nothing ends the ranks waiting for a dead peer. None where no rank failed so, a
    stack of that rank was taken (it was still running), or a rank still running was outside the
    collectives (a hang of its own, which the stall finding names beside the rank that had ended),
    other than one torchrun's agent had already signalled (``ending``)."""
    if r.stalled_s is None and not r.timed_out:
        return None
    ev = r.evidence
    root = root_of_evidence(ev)
    if root is None or ended_before(r, root) is None:
        return None
    running = [d for k, d in ev.stackdumps.items() if k != root and d.frames and ended_before(r, k) is None
               and k not in ending(r)]
    return root if all(in_collective(d) for d in running) else None


def ending(rec: PhaseRecord) -> set[int]:
    """The ranks the harness found running whose process torchrun's agent had already signalled
    (``Evidence.signalled_pids``), ending the run once a rank had failed: each was in its end (a
    handler of its own that outlasts the agent's SIGTERM: a checkpoint saved on preemption), not hung
    of its own, wherever its stack shows it."""
    signalled = set(rec.evidence.signalled_pids)
    return {t.rank for t in rec.evidence.taken_stacks if t.rank is not None and t.pid in signalled}


def halted_ranks(r: PhaseRecord) -> list[int]:
    """Of a run of several ranks that its trainer halted on a non-finite loss: the ranks whose last
    heartbeat is a halt record of the .HALT's step where some rank's is not (that one went on, into
    its next collective); [] where every rank's is or none's (nothing singles a rank out)."""
    halt, beats = r.evidence.halt, r.evidence.last_heartbeat
    if halt is None or r.world_size < 2:
        return []
    halted = [k for k in range(r.world_size) if (b := beats.get(k)) is not None and b.stage == HEARTBEAT_STAGE_HALT
              and b.step == halt.step]
    return halted if len(halted) < r.world_size else []


def nonfinite_ranks(r: PhaseRecord) -> list[int]:
    """The ranks whose own loss the trainer's non-finite .HALT says was not finite, by their place
    in its list of losses per rank."""
    losses = r.evidence.halt.losses or [] if r.evidence.halt is not None else []
    return [i for i, v in enumerate(losses) if not (isinstance(v, (int, float)) and abs(v) < float("inf"))]


def no_rank_started(r: PhaseRecord) -> bool:
    """Of a launch of several nodes: no rank ran anywhere and the run failed, where some agent gave
    up on the rendezvous (the others never joined), or the harness stopped the agents still meeting
    with no rank's end reported: the node that never joined is what happened, not a crash."""
    nodes = r.evidence.nodes
    if nodes is None or any(n.ranks for n in nodes.nodes) or r.evidence.last_heartbeat or r.exit_code == 0:
        return False
    if any(gave_up(n.said) for n in nodes.nodes):
        return True
    return r.stopped_by_harness and not r.evidence.rank_failures and bool(nodes.nodes)


# --- the diagnosis of each way a process fails -------------------------------------------------------

def logs_of(r: PhaseRecord, ranks) -> tuple[str, ...]:
    """The stderr logs that show ``ranks``: of a launch of several nodes, the log of each node one
    of them ran on (the record's stderr is that of the node its verdict names, else of the agent
    that ended first); else the record's stderr."""
    nodes, ranks = r.evidence.nodes, {k for k in ranks if k is not None}
    logs = [n.log for n in nodes.nodes if ranks & set(n.ranks)] if nodes is not None else []
    return tuple(f"{r.out_dir}/{log}" for log in logs or [r.evidence.stderr_log])


def nonfinite(r: PhaseRecord) -> Diagnosis | None:
    """The trainer stopped on a non-finite loss (.HALT source nonfinite): the ranks whose own loss
    was (the .HALT's losses per rank), else those whose heartbeats say they halted on it where the
    others did not; no rank where nothing singles one out."""
    ev = r.evidence
    if r.kind not in TRAINER_KINDS or ev.halt is None or ev.halt.source != "nonfinite":
        return None
    step, losses, world = ev.halt.step, ev.halt.losses or [], max(r.world_size or 1, 1)
    bad = nonfinite_ranks(r)
    files = (f"{r.out_dir}/.HALT",)
    if len(losses) != world:  # no loss of every rank: the heartbeats may say which rank halted
        halted = halted_ranks(r)
        return _diagnosis(Kind.HALTED if halted else Kind.NONFINITE, tuple(RankAt.of(r, k) for k in halted), r,
                          step=step, files=files)
    if not bad or (world > 1 and len(bad) == world):
        return _diagnosis(Kind.NONFINITE, (), r, step=step, files=files)
    return _diagnosis(Kind.NONFINITE, tuple(RankAt.of(r, k, cause=f"loss {losses[k]} at step {step}") for k in bad),
                      r, step=step, files=files)


def crash(r: PhaseRecord) -> Diagnosis | None:
    """A trainer process that failed with a non-zero exit (and no .HALT, or a watchdog's that a
    rank's death brought about): the rank that failed first in its own right, else the ranks whose
    silent exits came first (or ranks that may have left before them: which came first cannot be
    told), else ranks that left early or exited 0 while the others still needed them, else ranks
    the others' collective gave up waiting for, else the one process of its run; no rank where
    nothing tells (the log's last exception is the cause)."""
    ev = r.evidence
    if r.kind in TRAINER_KINDS and ev.halt is not None and ev.halt.source == "nonfinite":
        return None
    if no_rank_started(r) or (ev.nodes is not None and ev.nodes.slurm_stopped is not None):
        return None  # a node never joined, or Slurm stopped the ranks (findings/nodes.py says how): no crash
    if not (r.status == Status.FAIL and r.exit_code not in (0, None) and r.kind in TRAINER_KINDS
            and (ev.halt is None or died_first(r) is not None)):
        return None
    if (stop := nonfinite_exit_of(r)) is not None:
        return _stopped_nonfinite(r, stop)
    root, gone, ended, maybe = root_of(r), departed(r), exited_0(r), maybe_departed(r)
    if root is not None or maybe:
        first = silent_first(r) if maybe else [root]
        causes = {k: ev.rank_failures[k].exception or ev.rank_failures[k].cause for k in first}
        either = _diagnosis(Kind.LEFT, tuple(RankAt.of(r, k) for k in maybe), r) if maybe else None
        kind = Kind.CRASHED
        if not maybe:
            kind, causes[root] = failed_as(r, root)
        ranks = tuple(RankAt.of(r, k, cause=c) for k, c in causes.items())
        return _diagnosis(kind, ranks, r, or_else=either, logs=logs_of(r, first))
    if gone:  # no rank failed in its own right: the others failed after one that left
        return _diagnosis(Kind.LEFT, tuple(RankAt.of(r, k) for k in gone), r, logs=logs_of(r, gone))
    if ended:  # none left early: one that may have done all its steps ended while the others still needed it
        return _diagnosis(Kind.ENDED, tuple(RankAt.of(r, k) for k in ended), r, logs=logs_of(r, ended))
    if hung := waited_for(ev.rank_failures, ev.last_heartbeat):
        waited = sorted(k for k, f in ev.rank_failures.items() if f.gave_up_waiting)
        return _diagnosis(Kind.HUNG, tuple(RankAt.of(r, k) for k in hung), r,
                          cause=ev.rank_failures[waited[0]].gave_up_waiting, logs=logs_of(r, hung),
                          waited=tuple(waited))
    if ev.nodes is not None and killed_agent(ev.nodes.launcher, ev.nodes.nodes, r.stopped_by_harness) is not None:
        return None  # no rank failed: a node's agent was killed (findings/nodes.py names it), no crash of the trainer
    exception = ev.log_exception
    # the one process is rank 0, whatever launched it
    alone = killed_alone(r)
    killed = alone.cause() if alone is not None else None
    # a signal's word comes first: the exception of an agent told to stop by one is only its way of ending
    ranks = (RankAt.of(r, 0, cause=killed or exception or f"exit code {r.exit_code}"),) if r.world_size == 1 else ()
    return Diagnosis(Kind.KILLED if killed else Kind.CRASHED, ranks, cause=killed or exception,
                     step=ranks[0].step if ranks else None, logs=logs_of(r, [0] if ranks else ()),
                     files=_files(rec=r, ranks=ranks), from_log=True)


def _stopped_nonfinite(r: PhaseRecord, stop: NonfiniteExit) -> Diagnosis:
    """The trainer stopped on a non-finite loss with the contract's exit code and no .HALT: the ranks
    that exited so, where not every rank did (nothing singles one out then), else the one process, rank
    0; the exit code is the trainer's word of a non-finite loss, no crash."""
    said = f"exit code {EXIT_NONFINITE}, the contract's code for it, with no .HALT"
    ranks = (0,) if r.world_size <= 1 else stop.ranks if len(stop.ranks) < r.world_size else ()
    return _diagnosis(Kind.NONFINITE_EXIT, tuple(RankAt.of(r, k, cause=said) for k in ranks), r,
                      cause=f"stopped on a non-finite loss ({said})", logs=logs_of(r, ranks or [0]))


@dataclass(frozen=True)
class ProcessKilled:
    """The process the harness launched, ended by a signal (``killed_alone``): a trainer run as one
    process, or the one torchrun agent of a launch whose log names no rank's end."""

    agent: bool
    """The torchrun agent, not the trainer's own process."""
    signal: str
    """The signal's name: 'SIGKILL'."""
    told: bool = False
    """A signal the agent handles told it to stop (it ended its workers itself): 'stopped by', not
    'killed by'."""

    def cause(self) -> str:
        """'killed by SIGTERM' (one process, as torchrun's log says of a rank); 'the torchrun agent was
        killed by SIGKILL', 'the torchrun agent was stopped by SIGTERM'."""
        by = f"{'stopped' if self.told else 'killed'} by {self.signal}"
        return f"the torchrun agent was {by}" if self.agent else by

    def sentence(self) -> str:
        """The cause as a sentence's subject and verb: 'the trainer's process was killed by SIGTERM'."""
        return self.cause() if self.agent else f"the trainer's process was {self.cause()}"


def killed_alone(r: PhaseRecord) -> ProcessKilled | None:
    """A trainer run as one process that a signal ended (its exit code < 0, as Python's subprocess
    says it; the harness's own stop records no exit code), which torchrun's log would say of a rank:
    'exit code -15' read as a code the trainer chose, and sent the reader to its log for why it
    exited, where a signal leaves nothing. Of a run of several ranks under one torchrun agent (the
    process the harness launched) whose log names no rank's end: the agent itself, as a node's is
    named (judge/nodes.py ``agent_killed``), killed, or told to stop by a signal it handles (it ends
    its workers, raises SignalException, exits 1) that the harness did not send. None otherwise."""
    ev = r.evidence
    one_agent = (r.world_size > 1 and ev.nodes is None and "torch.distributed.run" in r.command[:3]
                 and not ev.rank_failures)
    if one_agent and not r.stopped_by_harness and (told := agent_stopped(ev.log_exception)) is not None:
        return ProcessKilled(agent=True, signal=signal_name(told), told=True)
    if r.exit_code is None or r.exit_code >= 0 or ev.log_exception:
        return None
    if r.world_size == 1:
        return ProcessKilled(agent=False, signal=signal_name(-r.exit_code))
    return ProcessKilled(agent=True, signal=signal_name(-r.exit_code)) if one_agent else None


def stalled(r: PhaseRecord) -> bool:
    """A trainer process the harness stopped (its stall watch, the timeout) or whose watchdog wrote
    the .HALT, where no rank had died first (then the crash is what happened)."""
    ev = r.evidence
    if not (r.stopped_by_harness or (ev.halt is not None and ev.halt.source == "watchdog")):
        return False
    return r.kind in TRAINER_KINDS and died_first(r) is None


def no_rank_running(r: PhaseRecord) -> bool:
    """The harness stopped the run and found no rank's process to take a stack of, and no stack
    was recorded otherwise: the ranks had ended (or never started) while a launcher kept the run open."""
    ev = r.evidence
    stacks = sum(1 for d in [*ev.stackdumps.values(), *ev.unranked_stacks] if d.frames)
    stopped = r.stopped_by_harness
    return not stacks and stopped and len(ev.taken_stacks) == 0


def running(r: PhaseRecord) -> list[RankAt]:
    """The processes the harness found running with a stack when it stopped the run, each at its
    innermost frame: every rank of the world it took a stack of that had not ended before
    (``ended_before``), then every process whose rank cannot be told."""
    ev = r.evidence
    if no_rank_running(r):
        return []
    known = set(ev.last_heartbeat) | set(ev.stackdumps) | {t.rank for t in ev.taken_stacks if t.rank is not None}
    out = [RankAt.of(r, k, frame=ev.stackdumps[k].frames[0].func) for k in sorted(known)
           if k < r.world_size and ended_before(r, k) is None and (d := ev.stackdumps.get(k)) is not None and d.frames]
    out += [RankAt(None, frame=d.frames[0].func, pid=d.pid) for d in ev.unranked_stacks if d.frames]
    return out


def stall(r: PhaseRecord) -> Diagnosis | None:
    """A stalled trainer process (``stalled``): slow at its timeout but progressing, else a rank that
    stayed alive after the trainer's non-finite .HALT, else ranks that left early, else the rank that
    had failed first in its own right (the others waited for it), else the ranks whose heartbeats
    stopped while the others went on (``silent``), else, of ranks that all wait in collectives, those
    whose collectives went off the common path (``apart``), else the ranks that hung while the others
    waited for them (their stacks and heartbeats tell), else the one process left running, else every
    rank found running alike (stalled: nothing tells which hung first)."""
    if not stalled(r):
        return None
    ev = r.evidence
    if r.progressing_at_timeout:
        return _diagnosis(Kind.TIMED_OUT, (), r)
    found = running(r)
    if ev.halt is not None and ev.halt.source == "nonfinite":
        halted = halted_ranks(r)
        return _diagnosis(Kind.HALT_STALL, tuple(RankAt.of(r, k) for k in halted), r, step=ev.halt.step)
    if gone := departed(r):
        return _diagnosis(Kind.LEFT, tuple(RankAt.of(r, k) for k in gone), r)
    if (root := failed_first(r)) is not None:
        kind, cause = failed_as(r, root)
        return _diagnosis(kind, (RankAt.of(r, root, cause=cause),), r,
                          logs=(f"{r.out_dir}/{ev.stderr_log}",))
    if (lone := silent(r)) is not None:
        return lone
    if (split := _apart(r)) is not None:
        return split
    if (hung := _hung_first(r, found)) is not None:
        return hung
    if len(found) == 1 and _alone(r, found[0]):  # the one process left running: the others had ended
        return _diagnosis(Kind.HUNG, tuple(found), r)
    return _diagnosis(Kind.HUNG if r.world_size == 1 and found else Kind.STALLED, tuple(found), r)


def silent(r: PhaseRecord) -> Diagnosis | None:
    """The ranks whose heartbeats the harness's watch saw stop for stall_s while another rank's went
    on (Evidence.silent_ranks), each at the innermost frame of its stack where one was taken; None
    where it saw none. Their stacks need not show it: the others waited in no collective for them."""
    ev = r.evidence
    if not ev.silent_ranks:
        return None
    frames = {k: d.frames[0].func for k, d in ev.stackdumps.items() if d.frames}
    ranks = tuple(RankAt.of(r, s.rank, frame=frames.get(s.rank)) for s in ev.silent_ranks)
    return _diagnosis(Kind.SILENT, ranks, r, silences=tuple(ev.silent_ranks))


def _apart(r: PhaseRecord) -> Diagnosis | None:
    """Ranks whose collectives went apart (``apart``): those off the common path beside those of it
    (Kind.DIVERGED), else every rank (Kind.APART); each with its call site. None where ``apart`` says
    nothing, or a process of unknown rank was found (it may be anywhere)."""
    ev = r.evidence
    split = apart(ev.stackdumps, ev.last_heartbeat, r.world_size) if not ev.unranked_stacks else None
    if split is None:
        return None

    def at(k: int) -> RankAt:
        dump = ev.stackdumps[k]
        return RankAt.of(r, k, frame=dump.frames[0].func, site=call_site(dump))

    if split.off:
        return _diagnosis(Kind.DIVERGED, tuple(map(at, split.off)), r, common=tuple(map(at, split.common)))
    return _diagnosis(Kind.APART, tuple(map(at, range(r.world_size))), r)


def _hung_first(r: PhaseRecord, found: list[RankAt]) -> Diagnosis | None:
    """The ranks that hung while the others waited for them, where the stacks and heartbeats of a
    run of several ranks tell them apart (``hung_ranks``); a hung rank of no stack (a process frozen
    by SIGSTOP, which neither py-spy nor its own handler can dump) is named by its heartbeat. None
    where nothing tells them apart: every rank is listed alike."""
    if r.world_size < 2:
        return None
    ev = r.evidence
    ranked = {at.rank for at in found if at.rank is not None}
    hung = hung_ranks(ev.stackdumps, ev.last_heartbeat)
    unstacked = [k for k in hung if k not in ranked and k in ev.last_heartbeat and k < r.world_size
                 and ended_before(r, k) is None]
    hung = [k for k in hung if k in ranked]
    if not unstacked and (not hung or set(hung) == ranked):
        return None
    stopped = {t.rank for t in ev.taken_stacks if t.state == "stopped"}
    return _diagnosis(Kind.HUNG, tuple(RankAt.of(r, k, frame=ev.stackdumps[k].frames[0].func) for k in hung)
                      + tuple(RankAt.of(r, k, no_stack=NoStack.STOPPED if k in stopped else NoStack.UNTAKEN)
                              for k in unstacked), r)


def _alone(r: PhaseRecord, only: RankAt) -> bool:
    """Of a run of several ranks the harness stopped: ``only`` was the one process it found running,
    and every other rank had ended before (``ended_before``: exited 0 after its steps, or failed):
    that one hung, after the others were done with it (a save, a teardown, a loop of its own)."""
    if r.world_size < 2 or only.rank is None:
        return False
    return all(ended_before(r, k) is not None for k in range(r.world_size) if k != only.rank)


def diagnose(rec: PhaseRecord) -> Diagnosis | None:
    """What happened to the point's process that the verdict line leads with: its crash's diagnosis
    (a non-finite loss the trainer stopped on included) where it blames a rank, else its stall's;
    None where neither blames one, or the point did not fail. Of a repeated point, the repeat its
    record keeps (another repeat's failure is a finding of its own, never this one's cause)."""
    if rec.status != Status.FAIL:
        return None
    for found in (nonfinite(rec), crash(rec), stall(rec)):
        # a stall after the trainer's non-finite .HALT is the end of a run the non-finite loss decided
        if found is not None and found.ranks and found.kind != Kind.HALT_STALL:
            return found
    return None
