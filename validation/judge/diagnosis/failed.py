"""The rank that failed first in its own right, from torchrun's account of each rank's end
(``root_rank``), its exit codes read against the run's .HALT; a rank that died before the others'
watchdog halted the run (``Died``); and how the first one failed: killed, aborted, exited early or
crashed (``failed_as``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nsa.contract import EXIT_NONFINITE, EXIT_WATCHDOG
from validation.contract.files import HaltInfo
from validation.contract.torchrun_log import RankFailure
from validation.judge.diagnosis.beats import incomplete
from validation.judge.diagnosis.blame import Kind
from validation.judge.record import Evidence, PhaseRecord

#: the exit code of the artifact contract (nsa/contract.py) that goes with a .HALT's source: a rank
#: that stopped as the contract asks when its watchdog saw a stall, or its loss went non-finite
_HALT_EXIT = {"watchdog": EXIT_WATCHDOG, "nonfinite": EXIT_NONFINITE}


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
