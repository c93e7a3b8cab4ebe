"""Which ranks of a run of several left early: ended with exit 0 and no failure of their own,
before the steps asked for, while the other ranks still needed them. The others then fail in
their collectives after it (gloo: 'Connection closed by peer', a peer's failure, not their own)
or wait for it until the stall watch stops the run, so the rank that left is the one to name;
its own files show nothing wrong.

How a rank is known to have left with exit 0, under torchrun (its agent is what reports ends):

- the run failed: torchrun lists every worker that did not succeed, those it stopped with SIGTERM
  too; a rank of the world it does not list had exited 0 before the others failed;
- the harness stopped a stalled or timed-out run: it looked for every rank's process to take its
  stack (TakenStack), so a rank it found no process of had ended; with no failure of it in
  torchrun's logs, with exit 0 (torchrun ends every worker when one fails).

Only ranks that wrote a heartbeat (they ran) and whose last heartbeat says they did not complete
the last step asked for count (``incomplete``): a step before it, or the last step itself in a
record of a stage within a step, whose ``step`` is the step in progress (the contract,
nsa/contract.py ``HEARTBEAT_STAGES_IN_STEP``). A rank whose last record may say it completed the
last step (a ``step`` record, a checkpoint or profile after it, a stage the contract does not name,
none) did not leave early: it finished its steps and exited while another hung after them.

A rank whose heartbeats never record a step's end (``Beat.ends_steps``; the seed's format, where
ranks other than 0 beat only as each step starts) says by a last record within the last step only
that it started it (``started_last``). It is named only where a rank that remained (running or
failed) shows by its own records that it had not completed the last step either: the rank left
while that one still needed it. Where every rank that remained had completed it, the one that left
may have done all its work, and is not named.
"""
from __future__ import annotations

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.judge.findings.hung import in_collective
from validation.judge.record import Beat, PhaseRecord


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
    """The ranks that left early (see the module's docstring), lowest first; [] when none did or
    nothing tells (one process, a failure of some rank's own, a process of unknown rank)."""
    others = _remained(rec)
    if not others:
        return []
    beats, waiting = rec.evidence.last_heartbeat, _not_done(rec, others)
    return [k for k in range(rec.world_size) if k not in others
            and (incomplete(beats.get(k), rec.steps) or (started_last(beats.get(k), rec.steps) and bool(waiting))
                 or _left_unstarted(rec, k, others))]


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
    """The rank that failed first in its own right (``Evidence.root_rank``), but not one that only
    exited non-zero silently (RankFailure.silent: an exit code, no exception, no signal): a rank
    whose collective broke when a peer left may catch the error and exit 1 with a message of its
    own, so a silent exit yields to a rank that left early (``departed``)."""
    root = rec.evidence.root_rank
    return None if root is None or rec.evidence.rank_failures[root].silent else root


def root_of(rec: PhaseRecord) -> int | None:
    """The rank a crash is blamed on as having failed first (``Evidence.root_rank``), None where a
    rank left early and the one torchrun saw fail first only exited non-zero silently after it."""
    return rec.evidence.root_rank if not departed(rec) else None


def maybe_departed(rec: PhaseRecord) -> list[int]:
    """Of a run whose first failures torchrun saw are silent exits (``Evidence.silent_ranks``; no rank
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
    return rec.evidence.silent_ranks


def exited_0(rec: PhaseRecord) -> list[int]:
    """The ranks known to have ended with exit 0 that ran (wrote a heartbeat): those that left early
    (``departed``) and those that may have completed their steps, lowest first; [] where nothing
    tells which ranks ended so (``_remained``)."""
    others = _remained(rec)
    return [k for k in range(rec.world_size) if others and k not in others and k in rec.evidence.last_heartbeat]


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


def _remained(rec: PhaseRecord) -> set[int]:
    """The ranks known not to have exited 0: those that failed (torchrun's logs) and those the
    harness found running when it stopped the run; empty where nothing tells which ranks left
    (see ``departed``) or a rank failed in its own right (``own_root``)."""
    ev = rec.evidence
    if rec.world_size < 2 or not rec.steps or own_root(rec) is not None:
        return set()
    if rec.stalled_s is not None or rec.timed_out:
        if any(t.rank is None for t in ev.taken_stacks):
            return set()  # a process of unknown rank may be the one that seems gone
        return set(ev.rank_failures) | {t.rank for t in ev.taken_stacks} | _watchdog_dumped(rec)
    if rec.exit_code not in (0, None) and ev.rank_failures:
        return set(ev.rank_failures)
    return set()


def _watchdog_dumped(rec: PhaseRecord) -> set[int]:
    """Under a watchdog's .HALT, the ranks whose own stack dump holds frames: they took the
    watchdog's way out (stacks, .HALT, its exit code), not exit 0, though torchrun's log may not
    say so (the harness stopped torchrun while it waited for another rank, one frozen by SIGSTOP
    that its SIGTERM cannot end)."""
    ev = rec.evidence
    if ev.halt is None or ev.halt.source != "watchdog":
        return set()
    return {k for k, dump in ev.stackdumps.items() if dump.frames}


def _not_done(rec: PhaseRecord, ranks: set[int]) -> list[int]:
    """Those of ``ranks`` whose own records say they had not completed the last step."""
    return sorted(k for k in ranks if incomplete(rec.evidence.last_heartbeat.get(k), rec.steps))


def departure(rec: PhaseRecord, ranks: list[int]) -> str:
    """'rank 1 exited 0 early (last heartbeat step 4 of 8, stage data)' for each of ``ranks``, with
    ': step 8 not completed' where its last record was within the last step (or, of a rank whose
    records say no step's end, that it started it and which ranks had not completed it)."""
    parts = []
    for k in ranks:
        hb = rec.evidence.last_heartbeat.get(k)
        if hb is None:
            parts.append(f"rank {k} exited 0 early (no heartbeat written: before its first step; torchrun reports no "
                         "failure of it, and the harness found no process of it)")
            continue
        stage = f", stage {hb.stage}" if hb.stage else ""
        if started_last(hb, rec.steps):
            who = ", ".join(map(str, _not_done(rec, _remained(rec))))
            within = (f": step {hb.step} started; its heartbeats record no step's end, and rank{'s' * (',' in who)} "
                      f"{who} had not completed step {hb.step}")
        else:
            within = f": step {hb.step} not completed" if hb.step == rec.steps else ""
        parts.append(f"rank {k} exited 0 early (last heartbeat step {hb.step} of {rec.steps}{stage}{within})")
    return "; ".join(parts)


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
    root = ev.root_rank
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
