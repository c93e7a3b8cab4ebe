"""How one rank of a torchrun launch ended (``RankFailure``), and what that says: its cause in
short, whether it failed in its own right, after a peer or at its agent's hand."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from nsa.contract import EXIT_NONFINITE, EXIT_WATCHDOG
from validation.contract.stacks import Frame
from validation.contract.torchrun_log.exceptions import short_exception
from validation.contract.torchrun_log.patterns import GLOO_TIMEOUT, PEER_CLOSED, PEER_LOST, VICTIM
from validation.excerpt import EXCERPT_CHARS

#: the artifact contract's exit codes of a trainer that stopped itself as it asks (nsa/contract.py),
#: and why: read alone, a rank's 'exit code 4' is any code a trainer chose
CONTRACT_STOPS = {EXIT_WATCHDOG: "a watchdog stall", EXIT_NONFINITE: "a non-finite loss"}


class PeerGone(enum.StrEnum):
    """What a rank's error says of the peer whose going broke its collective (``RankFailure.peer_gone``)."""

    CLOSED = "closed by peer"
    """The peer's own process closed their connection (``PEER_CLOSED``: gloo's orderly close): it destroyed its
    process group, or ended."""
    LOST = "lost"
    """The peer's process ended, or the network between them failed (``PEER_LOST``: a reset, a broken pipe, NCCL's
    remote error): the words do not tell which."""


@dataclass(frozen=True)
class RankFailure:
    """How one rank ended, from torchrun's log."""

    exception: str | None = None
    signal: str | None = None
    exit_code: int | None = None
    unranked: str | None = None
    """Of a rank that failed silently (``silent``), the only one of its log: the exception of the
    log's worker tracebacks that name no rank (``worker_said``; one, or several that all end in it,
    as where every rank failed one import and torchrun stopped the others before they exited),
    most likely its own, printed before its process group; the log does not say whose, and the
    report says so."""
    unranked_count: int = 0
    """How many of the log's worker tracebacks that name no rank end in ``unranked``: more than one
    (as where every rank failed the same way) is said, as the reader may then look past this rank."""
    broken_collective: str | None = None
    """Of a rank killed by SIGABRT with no exception of it in the log: the error of a broken collective
    that the log shows before its abort ('error: [..pair.cc:553] Connection closed by peer [..]:5860';
    ``_teardown_aborts``), most likely its own, caught: the rank caught its collective broken by a
    peer's failure and exited (sys.exit(1), as many trainers do), and its interpreter's exit aborted on
    the broken process group's threads. It failed after a peer, not in its own right."""
    nccl_watchdog: str | None = None
    """Of a rank whose NCCL watchdog found its collective failed by a peer (``_WATCHDOG``, of that rank
    in the log): it timed out waiting for a peer that never came ('Watchdog caught collective operation
    timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, ...) ran for 15085 milliseconds before timing out'), or a
    peer went away under it (ncclRemoteError). The watchdog then took the process down (SIGABRT), or its
    next collective raised (DistBackendError): it failed waiting for a peer, not in its own right, and
    the peer it waited for may have been still running (a hang: torchrun's SIGTERM ended it)."""
    caught_timeout: str | None = None
    """Of a rank that exited non-zero with no exception of it in the log: gloo's timeout of a collective
    that a worker printed ('rank 0: giving up: [..unbound_buffer.cc:78] Timed out waiting 10000ms for recv
    operation to complete'; ``_caught_timeouts``), most likely its own, caught: its collective gave up
    waiting for a peer that was there and never came (a peer that had left breaks it at once, 'Connection
    closed by peer'), and it exited of its own choosing after. It failed waiting, not in its own right."""
    aborted: str | None = None
    """Of a rank killed by SIGABRT with no exception of it in the log, no broken collective before its
    abort and no NCCL watchdog's word: the C++ runtime's last word (``_TERMINATE``; ``_own_aborts``):
    the process aborted itself (a C++ thread object destroyed while still joinable; at an
    interpreter's exit, a process group's threads never torn down). No signal came from elsewhere:
    not the kernel's OOM killer, which sends SIGKILL."""
    at_exit: bool = False
    """Of an ``aborted`` rank: Python's report of the abort (``_FATAL_ABORT``) lists no Python frame
    in any thread: the trainer's code had ended (sys.exit, a return from main) and the interpreter's
    exit aborted."""
    pid: int | None = None
    """Its process id, as torchrun's summary reports it."""
    traceback: str | None = None
    """Its own traceback as the log prints it (its ``[rankN]:`` lines, the prefix dropped), from its
    first 'Traceback' line to its exception, the last STDERR_TAIL_LINES lines of it; None where the
    log holds none of it."""
    raised_at: Frame | None = None
    """The innermost frame of its last traceback in the trainer's own code (no installed package's,
    no standard library's: ``_LIBRARY``): where the trainer called what raised; of a rank that a
    collective ``mismatch`` aborted, the same frame of Python's report of the abort (faulthandler's,
    ``_FATAL_ABORT``) where the log's one report is its own; None where no frame is."""
    collective: str | None = None
    """The collective that traceback (or report) ends in: its innermost frame of torch.distributed's
    ('all_reduce'); None where none is."""
    mismatch: str | None = None
    """The words of a check that found this rank's collective not matching the other ranks'
    (``MISMATCH``): torch's exception under TORCH_DISTRIBUTED_DEBUG=DETAIL, or, of a rank killed by
    SIGABRT with no exception of it in the log, gloo's size check ('op.preamble.length <= op.nbytes. 8
    vs 4. Received data size doesn't match expected size'), which aborts the rank that received a
    message of another size than its own collective's: where the mismatch was detected, not the rank
    that left the common path (``_mismatch_aborts``)."""
    raised_code: str | None = None
    """That frame's source line, as the traceback prints it, without its comment."""
    ended_by_agent: bool | None = None
    """Whether torchrun's agent signalled this rank's process (``AGENT_SIGNALLED``): True, its end was
    the agent ending the ranks still running; False, the agent signalled other ranks (so its log shows
    its signals) but not this one, which had ended before, and a SIGTERM that killed it came from
    elsewhere (a person's kill, a scheduler, a preemption of one process); None where the log cannot
    say (no pid, no signal of the agent's in it, or the agent was itself told to stop)."""

    @classmethod
    def from_json(cls, d: dict) -> RankFailure:
        """A stored record's failure of a rank."""
        return cls(**{**d, "raised_at": Frame(**d["raised_at"]) if d.get("raised_at") else None})

    @property
    def located(self) -> str | None:
        """Its exception and where the trainer's code was when it was raised: 'OSError: [Errno 22]
        Invalid argument, at /x/train.py:49 in <module> (st = torch.load(ck))'; its exception alone
        where no frame of the trainer's is known."""
        if not self.exception or self.raised_at is None:
            return self.exception
        f = self.raised_at
        return (f"{self.exception}, at {f.file}:{f.line} in {f.func}"
                + (f" ({self.raised_code[:EXCERPT_CHARS]})" if self.raised_code else ""))

    @property
    def own(self) -> bool:
        """Failed in its own right: killed by a signal that was not torchrun's agent ending it
        (``by_agent``), or an exception that is not a peer's collective breaking under it."""
        if self.exception:
            return not VICTIM.search(self.exception)
        return (bool(self.signal) and not self.by_agent and self.broken_collective is None
                and self.nccl_watchdog is None)

    @property
    def peer_gone(self) -> PeerGone | None:
        """What its exception, else its NCCL watchdog's word, says of a peer gone under its collective; None where
        it says nothing of one (a failure of its own, a collective that timed out waiting for a peer still there)."""
        said = self.exception or self.nccl_watchdog or ""
        if PEER_CLOSED.search(said):
            return PeerGone.CLOSED
        return PeerGone.LOST if PEER_LOST.search(said) else None

    @property
    def gave_up_waiting(self) -> str | None:
        """What says its collective gave up waiting for a peer that never came: its NCCL watchdog's
        word ('its NCCL watchdog: timeout: WorkNCCL(SeqNum=3, ...) ran for 15085 milliseconds before
        timing out.'), or gloo's exception ('RuntimeError: Timed out waiting 10000ms for recv operation
        to complete'); None where nothing does."""
        if self.nccl_watchdog is not None:
            return "its NCCL watchdog: " + self.nccl_watchdog.removeprefix("Watchdog caught collective operation ")
        if self.exception and GLOO_TIMEOUT.search(self.exception):
            return short_exception(self.exception)
        return self.caught_timeout

    @property
    def by_agent(self) -> bool:
        """Ended by torchrun's agent, which ends the ranks still running once one has failed: its log
        says it signalled this rank's process (``ended_by_agent``; a SIGKILL after a SIGTERM the rank
        outlived too), else, where the log cannot say, a SIGTERM is taken for the agent's."""
        if self.ended_by_agent is not None:
            return self.ended_by_agent and bool(self.signal)
        return self.signal == "SIGTERM"

    @property
    def silent(self) -> bool:
        """Exited with a code of its own (no signal) and no exception of it in the log: a rank that
        failed before its process group (its traceback, if any, carries no ``[rankN]:``), or one
        that printed its error its own way and exited non-zero; or one that did the latter after its
        collective broke and whose exit then aborted (``broken_collective``): what torchrun saw of it
        is an exit of its own choosing, after a peer's failure."""
        if self.broken_collective is not None:
            return True
        if self.nccl_watchdog is not None or self.caught_timeout is not None:
            return False
        return not self.exception and not self.signal and self.exit_code is not None and self.exit_code > 0

    @property
    def stopped_nonfinite(self) -> bool:
        """Exited with the contract's code for a non-finite loss (EXIT_NONFINITE) of its own choosing
        (no signal): its trainer stopped on one."""
        return self.exit_code == EXIT_NONFINITE and not self.signal

    @property
    def cause(self) -> str | None:
        """What ended it, in short: its exception without gloo's source path, else the signal
        that killed it ('killed by SIGKILL'), else its exit code ('exit code 1'; 'exit code 4
        (the contract's code for a non-finite loss)' of a code the contract gives a stop); None where
        torchrun said none of them."""
        if self.exception:
            return short_exception(self.exception)
        if self.mismatch is not None:
            return f"killed by {self.signal} by gloo's check of a message's size ({self.mismatch})"
        if self.broken_collective is not None:
            return f"killed by {self.signal} after a collective broke ({short_exception(self.broken_collective)})"
        if self.aborted is not None:
            return (f"aborted itself ({self.signal} after {self.aborted!r})"
                    + (" at the interpreter's exit (no Python frame running)" if self.at_exit else ""))
        if self.nccl_watchdog is not None and self.signal == "SIGABRT":  # the watchdog's own abort
            return f"killed by SIGABRT by its NCCL watchdog ({self.nccl_watchdog[:EXCERPT_CHARS]})"
        if self.nccl_watchdog is not None and self.signal:  # ended before its watchdog's abort came
            sender = " from torchrun's agent" if self.by_agent else ""
            return (f"killed by {self.signal}{sender}, its NCCL watchdog having given up on a collective "
                    f"({self.nccl_watchdog[:EXCERPT_CHARS]})")
        if self.signal and self.ended_by_agent is True and self.signal != "SIGTERM":
            return f"killed by {self.signal} from torchrun's agent, once its SIGTERM had not ended it"
        if self.signal == "SIGTERM" and self.ended_by_agent is False:
            return "killed by SIGTERM, not torchrun's (its agent signalled only ranks still running after it had ended)"
        if self.signal:
            return f"killed by {self.signal}"
        if self.exit_code is None:
            return None
        if self.caught_timeout is not None:
            return f"exit code {self.exit_code} after a collective timed out ({self.caught_timeout})"
        meant = f" (the contract's code for {CONTRACT_STOPS[self.exit_code]})" if self.exit_code in CONTRACT_STOPS else ""
        return f"exit code {self.exit_code}{meant}" + self._unranked_text()

    def _unranked_text(self) -> str:
        if not self.unranked:
            return ""
        if self.unranked_count > 1:
            every = "both" if self.unranked_count == 2 else f"all {self.unranked_count}"
            return (f"; the log's {self.unranked_count} tracebacks that name no rank, {every} ending in "
                    f"{short_exception(self.unranked)}")
        return f"; the log's traceback that names no rank: {short_exception(self.unranked)}"
