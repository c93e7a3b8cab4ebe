"""The diagnosis of ranks whose collectives went out of step, as their ends show it: a rank failed in a collective
within a step that another rank had completed before it exited 0 (``out_of_step``), or waited in one there until
the harness stopped the run (``waited_out_of_step``).

A rank completes a step only once every collective of it has completed, with every rank's part. So where a
rank exited 0 having completed step N, it had called each collective of step N and the others had met it
there; a rank still inside step N, in one of that step's collectives, when the exited rank ended, was left
without a partner because its earlier collectives had taken the exited rank's later ones: it had called more
collectives than the exited rank by then. One rank called a collective the other did not (a rank-conditional
one: a loss all-reduced again for logging on one rank), or skipped one the other called, earlier in the run; a
collective of the same size pairs silently with the other's next one, so nothing failed there, and each
collective after it met another of the other rank's than its own. Which rank did, and at which step, the
evidence does not tell.

How the rank left without a partner ends depends on the backend: gloo's collective fails once the exited rank's
connection closes ('Connection closed by peer': its traceback ends in the collective); NCCL's waits, and the
harness's stall watch finds that rank alone running, its stack in the collective. Either way its last heartbeat
is of a stage within the step the exited rank completed.

A rank the harness found running of which it could take no stack (py-spy missing or refused, no SIGUSR1
handler of the trainer's) shows by its heartbeat alone that it was within a step the exited rank had completed:
out of step is suspected (``Diagnosis.suspected``), since a rank that hung of its own after its part in that
step's collectives leaves the same heartbeats, and so does a trainer whose ranks do not meet every step. A rank
whose process was stopped (SIGSTOP) is not suspected so: it ran nothing, and hung as stopped.

That is not the early exit the same ends may seem to show: a rank that exited 0 early (its heartbeats stop
before the last step, ``departed``) did not complete the step the others failed or waited in, where they waited
in one after it; where they failed or waited in a collective of a step it had completed, the two happened both
(the early exit's ``Diagnosis.beside``). One that exited 0
after its last step while the others failed or waited in a collective after theirs (a final barrier or save: their
heartbeats say they completed the last step too) left them after the loop (Kind.ENDED of a crash; of a stall, the
one rank left running hung after the others were done with it, Kind.HUNG)."""
from __future__ import annotations

from collections.abc import Collection

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.judge.diagnosis.blame import Diagnosis, Kind, NoStack, RankAt, diagnosis_of, earlier_beat, logs_of
from validation.judge.diagnosis.collectives import call_site, in_collective
from validation.judge.diagnosis.left import ended_before, exited_0
from validation.judge.record import PhaseRecord


def out_of_step(r: PhaseRecord, ended: list[int]) -> Diagnosis | None:
    """Of a failed run where no rank failed in its own right and ``ended`` exited 0 (``exited_0``, those that left
    early included):
    the ranks that failed in a collective within a step one of ``ended`` had completed (the module's docstring),
    beside those of ``ended`` that had completed it. None where no rank failed so (``_within``)."""
    failures = {k: f for k, f in r.evidence.rank_failures.items()
                if f.collective is not None and f.raised_at is not None and not f.own}
    found = _within(r, ended, failures)
    if found is None:
        return None
    within, completed = found
    failed = tuple(RankAt.of(r, k, frame=failures[k].collective, cause=failures[k].cause or "",
                             site=failures[k].raised_at) for k in within)
    return diagnosis_of(Kind.OUT_OF_STEP, failed, r, ended=completed, logs=logs_of(r, [*within, *completed]))


def waited_out_of_step(r: PhaseRecord, found: list[RankAt]) -> Diagnosis | None:
    """Of a run the harness stopped where no rank failed first: where every process it found running (``found``,
    of known rank) waited in a collective (its stack), and every rank still running of which it took no stack
    (``_unstacked``) had a heartbeat, within a step a rank that exited 0 had completed, and every other rank had
    ended before (``ended_before``), those ranks, each at its collective's call site or, of no stack, at its
    heartbeat (``Diagnosis.suspected``), beside the exited ranks that had completed the step
    (``Diagnosis.waiting``). None otherwise: a rank found outside the collectives hung of its own, and so did one
    whose process was stopped."""
    stacks = r.evidence.stackdumps
    stacked, unstacked = [at.rank for at in found], _unstacked(r, found)
    ranks = stacked + (unstacked or [])
    if (unstacked is None or not ranks or any(k is None or not in_collective(stacks[k]) for k in stacked)
            or any(ended_before(r, k) is None for k in range(r.world_size) if k not in ranks)):
        return None
    hit = _within(r, exited_0(r), ranks)
    if hit is None or len(hit[0]) < len(ranks):
        return None
    within, completed = hit
    waited = tuple(RankAt.of(r, k, frame=stacks[k].frames[0].func, site=call_site(stacks[k])) if k in stacked
                   else RankAt.of(r, k, no_stack=NoStack.UNTAKEN) for k in within)
    return diagnosis_of(Kind.OUT_OF_STEP, waited, r, ended=completed, waiting=True)


def _unstacked(r: PhaseRecord, found: list[RankAt]) -> list[int] | None:
    """The ranks of the world still running (``ended_before`` says nothing of an end) with a heartbeat and no
    stack among ``found``, lowest first; None where one of them was a stopped process (TakenStack.state)."""
    ranked = {at.rank for at in found}
    ranks = [k for k in range(r.world_size) if k not in ranked and k in r.evidence.last_heartbeat
             and ended_before(r, k) is None]
    stopped = {t.rank for t in r.evidence.taken_stacks if t.state == "stopped"}
    return None if stopped & set(ranks) else ranks


def _within(r: PhaseRecord, ended: list[int], ranks: Collection[int]) -> tuple[list[int], tuple[RankAt, ...]] | None:
    """Of ``ranks`` (each left in a collective, its failure or its stack says), those whose last heartbeat is of a
    stage within a step that one of ``ended`` (ranks that exited 0) had completed, lowest first, and those of
    ``ended`` that had completed the last such step. A record of a stage within a step says the step was in
    progress only where the rank's records mark a step's end at all (Beat.ends_steps). None where no rank is so,
    or torchrun started the workers again (a rank's last heartbeat may then be an earlier attempt's: a rank that
    exited 0 in the last one need have written none)."""
    ev = r.evidence
    if any(a.restarted for a in ev.attempts):
        return None
    beats = ev.last_heartbeat
    done = {k: b.done for k in ended if (b := beats.get(k)) is not None and b.done is not None}
    if not done:
        return None
    furthest = max(done.values())
    within = {k: b.step for k in ranks if (b := beats.get(k)) is not None and b.step is not None
              and b.stage in HEARTBEAT_STAGES_IN_STEP and b.ends_steps and earlier_beat(ev, k) is None
              and b.step <= furthest}
    if not within:
        return None
    last = max(within.values())
    return sorted(within), tuple(RankAt.of(r, k) for k, step in sorted(done.items()) if step >= last)
