"""The diagnosis of a trainer process that failed with a non-zero exit (``crash``): the rank that
failed first, ranks that left early (those torchrun ended while still ending included) or ended
while the others still needed them, ranks the others' collective gave up waiting for, or the one
process a signal ended (``killed_alone``); and a launch of several nodes none of whose ranks
started (``no_rank_started``), which is no crash."""
from __future__ import annotations

from dataclasses import dataclass, replace

from nsa.contract import EXIT_NONFINITE
from validation.contract.torchrun_log import agent_stopped, gave_up
from validation.contract.torchrun_log.failure import PeerGone
from validation.judge.diagnosis.blame import Broken, Diagnosis, Kind, RankAt, diagnosis_of, files_of, logs_of
from validation.judge.diagnosis.collectives import waited_for
from validation.judge.diagnosis.failed import died_first, failed_as
from validation.judge.diagnosis.left import (broke_on_peer, departed, exited_0, left_ending, left_having_completed,
                                             maybe_departed, root_of, silent_first)
from validation.judge.diagnosis.mismatch import mismatched
from validation.judge.diagnosis.nonfinite import NonfiniteExit, nonfinite_exit_of
from validation.judge.diagnosis.outofstep import out_of_step
from validation.judge.nodes import killed_agent, signal_name
from validation.judge.record import TRAINER_KINDS, PhaseRecord, Status


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


def crash(r: PhaseRecord) -> Diagnosis | None:
    """A trainer process that failed with a non-zero exit (and no .HALT, or a watchdog's that a
    rank's death brought about): ranks whose collectives a check found not matching (``mismatched``),
    else the rank that failed first in its own right, else the ranks whose silent exits came first (or
    ranks that may have left before them: which came first cannot be told), else ranks that left early
    (with the ranks that failed in a collective of a step one of them had completed, ``Diagnosis.beside``), or
    that left early and were still ending when torchrun ended them (``Diagnosis.broken``; ``beside`` too where the
    others broke within a step it had completed), else
    ranks that failed in a collective within a step a rank had completed before it exited 0
    (``out_of_step``), else ranks that exited 0 while the others still needed them, else ranks the
    others' collective gave up waiting for, else the one process of its run; no rank where nothing
    tells (the log's last exception is the cause)."""
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
    if (check := mismatched(r)) is not None:  # the rank a check ended is where it was detected, no culprit
        return check
    root, gone, ended, maybe = root_of(r), departed(r), exited_0(r), maybe_departed(r)
    if root is not None or maybe:
        first = silent_first(r) if maybe else [root]
        causes = {k: ev.rank_failures[k].exception or ev.rank_failures[k].cause for k in first}
        either = diagnosis_of(Kind.LEFT, tuple(RankAt.of(r, k) for k in maybe), r) if maybe else None
        kind = Kind.CRASHED
        if not maybe:
            kind, causes[root] = failed_as(r, root)
        ranks = tuple(RankAt.of(r, k, cause=c) for k, c in causes.items())
        return diagnosis_of(kind, ranks, r, or_else=either, logs=logs_of(r, first))
    if gone:  # no rank failed in its own right: the others failed after one that left
        return diagnosis_of(Kind.LEFT, tuple(RankAt.of(r, k) for k in gone), r, logs=logs_of(r, gone),
                            beside=out_of_step(r, ended))
    if leaving := left_ending(r):  # the others' collective broke on one that left, which torchrun then ended
        return _left_ending(r, leaving)
    # ... broke within a step the one that left had completed: their collectives were out of step as well. Not
    # where their words fit a network failing between hosts (Broken.network_fits): a rank still finishing the
    # step's all-reduce when the network failed leaves the same ends, its peer having returned from it and gone on
    if (leaving := left_having_completed(r)) and (off := out_of_step(r, leaving)) is not None:
        left = _left_ending(r, leaving, beside=replace(off, ended_exit_0=False))
        if not left.broken.network_fits:
            return left
    if ended and (off := out_of_step(r, ended)) is not None:  # a rank failed in a step one that ended had completed
        return off
    if ended:  # none left early: one that may have done all its steps ended while the others still needed it
        return diagnosis_of(Kind.ENDED, tuple(RankAt.of(r, k) for k in ended), r, logs=logs_of(r, ended))
    if hung := waited_for(ev.rank_failures, ev.last_heartbeat):
        waited = sorted(k for k, f in ev.rank_failures.items() if f.gave_up_waiting)
        return diagnosis_of(Kind.HUNG, tuple(RankAt.of(r, k) for k in hung), r,
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
                     files=files_of(rec=r, ranks=ranks), from_log=True)


def _left_ending(r: PhaseRecord, leaving: list[int], beside: Diagnosis | None = None) -> Diagnosis:
    """``leaving``, ranks that left early and were still ending when torchrun's agent ended them (``left_ending``),
    beside the ranks whose collective broke on them (``broke_on_peer``), each at its collective's call site; with
    ``beside``, those ranks' collectives out of step with theirs (``left_having_completed``)."""
    failures = r.evidence.rank_failures
    broke = broke_on_peer(r)
    ranks = tuple(RankAt.of(r, k, frame=failures[k].collective, cause=failures[k].cause or "",
                            site=failures[k].raised_at) for k in broke)
    peer = PeerGone.CLOSED if all(failures[k].peer_gone == PeerGone.CLOSED for k in broke) else PeerGone.LOST
    nodes = r.evidence.nodes
    return diagnosis_of(Kind.LEFT, tuple(RankAt.of(r, k) for k in leaving), r, cause=ranks[0].cause or None,
                        logs=logs_of(r, [*leaving, *broke]),
                        broken=Broken(ranks, peer, one_host=nodes is None or nodes.one_host), beside=beside)


def _stopped_nonfinite(r: PhaseRecord, stop: NonfiniteExit) -> Diagnosis:
    """The trainer stopped on a non-finite loss with the contract's exit code and no .HALT: the ranks
    that exited so, where not every rank did (nothing singles one out then), else the one process, rank
    0; the exit code is the trainer's word of a non-finite loss, no crash."""
    said = f"exit code {EXIT_NONFINITE}, the contract's code for it, with no .HALT"
    ranks = (0,) if r.world_size <= 1 else stop.ranks if len(stop.ranks) < r.world_size else ()
    return diagnosis_of(Kind.NONFINITE_EXIT, tuple(RankAt.of(r, k, cause=said) for k in ranks), r,
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
