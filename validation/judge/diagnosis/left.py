"""Which ranks left early (``departed``), which are known to have ended with exit 0 and which not
(``exited_0``, ``remained``), how a rank had ended before the harness stopped the run
(``ended_before``), and which ranks torchrun ended while they were still ending after they left
early (``left_ending``; ``left_having_completed``, where the others failed within the step it had
completed) or may have (``maybe_departed``).

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

A rank that left early need not have ended before torchrun's agent came for it: its process group
destroyed, its connections closed, its interpreter's exit or an atexit hook may still run when the
others' collective breaks on it, and the agent then ends it with SIGTERM, as it ends a rank still
running. Where the others' errors say their peer went away (``broke_on_peer``) and its heartbeats
stop a step or more behind theirs, it left (``left_ending``); where the others exited non-zero
silently, it may have (``maybe_departed``).
"""
from __future__ import annotations

from validation.contract.torchrun_log import RankFailure
from validation.judge.diagnosis.beats import incomplete, started_last
from validation.judge.diagnosis.collectives import in_collective
from validation.judge.diagnosis.failed import root_of_evidence, silent_of_evidence
from validation.judge.nodes import killed_agents
from validation.judge.record import PhaseRecord


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
    (``_stopped_behind``). Such a rank was still running behind the others, and the silent ones failed
    in their own right; or it had exited 0 early and was still ending (its interpreter's exit, a
    process group's teardown, an atexit hook) when torchrun came for it, and the silent ones only
    caught their collective breaking. torchrun's log reads the same either way (SIGTERM, no
    exception), and so do the heartbeats: the crash names both (``silent_first``)."""
    return _stopped_behind(rec, silent_first(rec))


def left_ending(rec: PhaseRecord) -> list[int]:
    """Of a run whose first failures torchrun saw are collectives broken by a peer gone (``broke_on_peer``): the
    ranks torchrun then ended with SIGTERM whose last heartbeat had not reached the step of any of those
    (``_stopped_behind``). Such a rank left its loop early, a stop condition of its own, and was still ending (its
    process group destroyed, its interpreter's exit or an atexit hook still running: a logger flushing, an
    uploader) when its closed connections broke the others' next collective; torchrun's agent saw them fail and
    ended it. A rank still running keeps its connections open (a network failing between hosts aside), and a
    collective of the others would have waited for it. How certain that is, the others' words, the ranks' hosts and how many such ranks there are say
    (blame.py ``Diagnosis.suspected``)."""
    return _stopped_behind(rec, broke_on_peer(rec))


def left_having_completed(rec: PhaseRecord) -> list[int]:
    """Of a run whose first failures torchrun saw are collectives broken by a peer gone (``broke_on_peer``): the
    ranks torchrun then ended with SIGTERM, having raised nothing (``_ended_by_agent``), whose last heartbeat is a
    step's end, not behind the others (else ``left_ending``). A rank still running keeps its connections open, so one
    whose connections closed under the others had left after the step it completed; where the others failed within
    that step, they had called more collectives than it by then (outofstep.py ``out_of_step`` says whether they
    did). [] otherwise, and of a run the harness stopped (its stop's SIGTERMs are no sign of an end under way)."""
    first = broke_on_peer(rec)
    ev = rec.evidence
    if not first or rec.stalled_s is not None or rec.timed_out:
        return []
    return [k for k, f in sorted(ev.rank_failures.items()) if k not in first and _ended_by_agent(f)
            and (b := ev.last_heartbeat.get(k)) is not None and b.done is not None]


def broke_on_peer(rec: PhaseRecord) -> list[int]:
    """The ranks whose collective broke on a peer gone (RankFailure.peer_gone), lowest first, where they are the
    first failures torchrun saw: no rank failed in its own right (``own_root``), exited non-zero silently
    (``silent_ranks``) or is known to have left (``departed``), no collective gave up waiting for a peer still
    there (RankFailure.gave_up_waiting), and every other rank torchrun reports its agent ended with SIGTERM, having
    raised nothing. [] otherwise, and where torchrun started the workers again (a rank's last heartbeat may then be
    an earlier attempt's)."""
    ev = rec.evidence
    if (rec.world_size < 2 or own_root(rec) is not None or silent_of_evidence(ev) or departed(rec)
            or any(a.restarted for a in ev.attempts) or any(f.gave_up_waiting for f in ev.rank_failures.values())):
        return []
    broke = [k for k, f in sorted(ev.rank_failures.items()) if f.peer_gone is not None]
    others = [f for k, f in ev.rank_failures.items() if k not in broke]
    return broke if all(_ended_by_agent(f) for f in others) else []


def _stopped_behind(rec: PhaseRecord, first: list[int]) -> list[int]:
    """The ranks torchrun's agent ended with SIGTERM, having raised nothing (``_ended_by_agent``), once ``first``
    had failed, whose last heartbeat had not reached the step of any of ``first`` (by at least their own heartbeat
    interval, ``Beat.every``), lowest first; [] where one of ``first`` has no heartbeat step. Not of a run the
    harness stopped: its stacks tell the ranks still running, and the SIGTERMs its stop brings are no sign of an
    end already under way."""
    ev = rec.evidence
    if rec.stalled_s is not None or rec.timed_out:
        return []
    at = [b.step for k in first if (b := ev.last_heartbeat.get(k)) is not None and b.step is not None]
    if not first or len(at) < len(first):
        return []
    return [k for k, f in sorted(ev.rank_failures.items()) if k not in first and _ended_by_agent(f)
            and (b := ev.last_heartbeat.get(k)) is not None and b.step is not None
            and b.step + (b.every or 1) <= min(at)]


def _ended_by_agent(f: RankFailure) -> bool:
    """torchrun's agent ended the rank with SIGTERM (RankFailure.by_agent) and it raised nothing: it was still
    running, or still ending, when the agent came for it."""
    return f.signal == "SIGTERM" and f.by_agent and not f.exception


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
