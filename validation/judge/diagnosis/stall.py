"""The diagnosis of a stalled trainer process, one the harness stopped or whose watchdog wrote the
.HALT (``stall``): from the processes it found running (``running``), a rank that had failed in its
own right before it came (``failed_first``), ranks whose heartbeats stopped while the others went
on, ranks whose collectives went apart, ranks left waiting in a collective whose partner had exited 0
(their collectives out of step), ranks all still importing, and the ranks that hung while the others
waited for them."""
from __future__ import annotations

from dataclasses import replace

from validation.judge.diagnosis.blame import Diagnosis, Kind, NoStack, RankAt, diagnosis_of
from validation.judge.diagnosis.collectives import apart, call_site, hung_ranks, in_collective
from validation.judge.diagnosis.failed import died_first, failed_as, root_of_evidence
from validation.judge.diagnosis.left import departed, ended_before
from validation.judge.diagnosis.nonfinite import halted_ranks
from validation.judge.diagnosis.outofstep import waited_out_of_step
from validation.judge.record import TRAINER_KINDS, PhaseRecord


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
    stayed alive after the trainer's non-finite .HALT, else ranks that left early (with the ranks left waiting
    in a collective of a step one of them had completed, ``Diagnosis.beside``), else the rank that
    had failed first in its own right (the others waited for it), else the ranks whose heartbeats
    stopped while the others went on (``silent``), else, of ranks that all wait in collectives, those
    whose collectives went off the common path (``apart``), else the ranks left running in a collective (or,
    of no stack, anywhere) within a step a rank had completed before it exited 0 (``waited_out_of_step``), else
    every process found running inside an import (``_importing``: still starting up, or an import that does not
    return), else the ranks that hung while the others waited for them (their stacks and heartbeats tell), else the one
    process left running, else every rank found running alike (stalled: nothing tells which hung first)."""
    if not stalled(r):
        return None
    ev = r.evidence
    if r.progressing_at_timeout:
        return diagnosis_of(Kind.TIMED_OUT, (), r)
    found = running(r)
    if ev.halt is not None and ev.halt.source == "nonfinite":
        halted = halted_ranks(r)
        return diagnosis_of(Kind.HALT_STALL, tuple(RankAt.of(r, k) for k in halted), r, step=ev.halt.step)
    if gone := departed(r):
        return diagnosis_of(Kind.LEFT, tuple(RankAt.of(r, k) for k in gone), r, beside=waited_out_of_step(r, found))
    if (root := failed_first(r)) is not None:
        kind, cause = failed_as(r, root)
        return diagnosis_of(kind, (RankAt.of(r, root, cause=cause),), r,
                            logs=(f"{r.out_dir}/{ev.stderr_log}",))
    if (lone := silent(r)) is not None:
        return lone
    if (split := _apart(r)) is not None:
        return split
    # in a collective (or, of no stack, anywhere) within a step one that ended had completed: not behind of its own
    if (off := waited_out_of_step(r, found)) is not None:
        return off
    if (importing := _importing(r, found)) is not None:
        return importing
    if (hung := _hung_first(r, found)) is not None:
        return hung
    if len(found) == 1 and _alone(r, found[0]):  # the one process left running: the others had ended
        return diagnosis_of(Kind.HUNG, (_hung_at(r, found[0].rank),), r)
    if r.world_size == 1 and len(found) == 1 and found[0].rank is not None:  # the run's one process
        return diagnosis_of(Kind.HUNG, (_hung_at(r, found[0].rank),), r)
    return diagnosis_of(Kind.HUNG if r.world_size == 1 and found else Kind.STALLED, tuple(found), r)


def silent(r: PhaseRecord) -> Diagnosis | None:
    """The ranks whose heartbeats the harness's watch saw stop for stall_s while another rank's went
    on (Evidence.silent_ranks), each at the innermost frame of its stack where one was taken; None
    where it saw none. Their stacks need not show it: the others waited in no collective for them."""
    ev = r.evidence
    if not ev.silent_ranks:
        return None
    frames = {k: d.frames[0].func for k, d in ev.stackdumps.items() if d.frames}
    ranks = tuple(RankAt.of(r, s.rank, frame=frames.get(s.rank)) for s in ev.silent_ranks)
    return diagnosis_of(Kind.SILENT, ranks, r, silences=tuple(ev.silent_ranks))


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
        return diagnosis_of(Kind.DIVERGED, tuple(map(at, split.off)), r, common=tuple(map(at, split.common)))
    return diagnosis_of(Kind.APART, tuple(map(at, range(r.world_size))), r)


def _importing(r: PhaseRecord, found: list[RankAt]) -> Diagnosis | None:
    """Every process found running inside an import (``StackDump.importing``), each with that import
    (Kind.IMPORTING); None where one was not, or none was found."""
    ev = r.evidence
    unranked = iter([d for d in ev.unranked_stacks if d.frames])  # ``running`` lists their processes in this order
    dumps = [(at, ev.stackdumps[at.rank] if at.rank is not None else next(unranked)) for at in found]
    if not dumps or any(d.importing is None for _, d in dumps):
        return None
    return diagnosis_of(Kind.IMPORTING, tuple(
        RankAt.of(r, at.rank, frame=at.frame, importing=d.importing) if at.rank is not None
        else replace(at, importing=d.importing) for at, d in dumps), r)


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
    return diagnosis_of(Kind.HUNG, tuple(_hung_at(r, k) for k in hung)
                        + tuple(RankAt.of(r, k, no_stack=NoStack.STOPPED if k in stopped else NoStack.UNTAKEN)
                                for k in unstacked), r)


def _hung_at(r: PhaseRecord, k: int) -> RankAt:
    """Rank ``k``, blamed as hung, at the innermost frame of its stack, with the import it was running and,
    where it waited for its DataLoader's workers, their stacks."""
    dump = r.evidence.stackdumps[k]
    workers = tuple(r.evidence.helper_stacks.get(k, ())) if dump.loader is not None else None
    return RankAt.of(r, k, frame=dump.frames[0].func, importing=dump.importing, workers=workers)


def _alone(r: PhaseRecord, only: RankAt) -> bool:
    """Of a run of several ranks the harness stopped: ``only`` was the one process it found running,
    and every other rank had ended before (``ended_before``: exited 0 after its steps, or failed):
    that one hung, after the others were done with it (a save, a teardown, a loop of its own). Where it
    waits in a collective within a step a rank that exited 0 had completed, it did not outlive them so:
    their collectives were out of step (``waited_out_of_step``, decided first)."""
    if r.world_size < 2 or only.rank is None:
        return False
    return all(ended_before(r, k) is not None for k in range(r.world_size) if k != only.rank)
