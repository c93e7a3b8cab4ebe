"""A finding: one thing the report tells a reader, found automatically in stored records."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from nsa.contract import heartbeat_name
from validation.contract.torchrun_log import AttemptEnd, has_traceback, short_exception
from validation.judge.diagnosis.blame import Diagnosis, earlier_beat
from validation.judge.diagnosis.crash import killed_alone
from validation.judge.diagnosis.failed import killed_by_signal, root_of_evidence
from validation.judge.diagnosis.left import maybe_departed
from validation.judge.diagnosis.nonfinite import exited_nonfinite
from validation.judge.diagnosis.stall import no_rank_running
from validation.judge.misses import Miss
from validation.judge.record import TRAINER_KINDS, Evidence, PhaseRecord, RunSigns, SubRun
from validation.judge.stability import LossAfter
from validation.judge.unsteady import Unsteady


class Severity(enum.StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class LogSays(enum.StrEnum):
    """What a failed run's stderr log holds of why it ended."""

    TRACEBACK = "traceback"
    """A Python traceback of the trainer's own."""
    ONE_LINE = "one line"
    """No traceback, a line that reads as an error (a trainer's own 'error: ...', exit 2)."""
    NOTHING = "nothing"
    """Neither."""


@dataclass(frozen=True)
class Facts:
    """What is true of the run a finding is about, so that its advice says nothing else: this
    project's config keys only for this project's trainer, collectives only for several ranks,
    'the stack dumps show' only where there are stack dumps, CUDA only on CUDA."""

    own_trainer: bool = False
    world_size: int = 1
    stacks: int = 0
    """Stacks recorded of the run's processes (by rank, or of a rank unknown)."""
    cuda: bool = False
    no_rank_running: bool = False
    """The harness stopped the run and found no rank's process to take a stack of, and no stack
    was recorded otherwise: the ranks had ended (or never started) while a launcher kept the run
    open."""
    no_rank_started: bool = False
    """Of a launch of several nodes: no worker was seen under any node's agent, and no rank wrote a
    heartbeat or had an end reported: the agents never completed their rendezvous."""
    before_first_step: bool = False
    """No step was logged and no heartbeat carries a step: the run ended in its start-up."""
    halted_nonfinite: bool = False
    """The trainer stopped on a non-finite loss itself (.HALT source nonfinite)."""
    killed: str | None = None
    """'rank 1 was killed by SIGKILL': the rank that failed first in its own right was ended by a
    signal and raised nothing (no traceback to read)."""
    misses: tuple[Miss, ...] = ()
    """Of a pytest or preflight point: what it failed to do (validation/judge/misses.py)."""
    silent: str | None = None
    """'rank 1 exited with code 1 ...': the rank that failed first exited non-zero with no
    exception of it in torchrun's log (RankFailure.silent)."""
    stopped: bool = False
    """A rank's process was stopped (SIGSTOP, a debugger, a frozen cgroup) when the harness came for
    its stack (TakenStack.state): it ran nothing, and the others waited for it."""
    maybe_left: tuple[int, ...] = ()
    """Ranks that may have exited 0 early before the silent exits that ended the run (findings/departed.py
    ``maybe_departed``): the advice says where to look if so."""
    log_says: LogSays = LogSays.TRACEBACK
    """What the run's stderr log holds of its error: the advice sends a reader to a traceback only
    where there is one."""
    alone: bool = False
    """Of a stall of several ranks: the one rank the harness found running had outlived the others,
    which had ended (findings/failures.py ``_alone``): nothing waited for it in a collective."""
    waiting: bool = False
    """Of ranks whose collectives went out of step (Kind.OUT_OF_STEP): they waited in their collective with no
    partner left until the harness stopped the run (``Diagnosis.waiting``), rather than failed in it."""
    suspected: bool = False
    """Of ranks whose collectives went out of step (Kind.OUT_OF_STEP): a rank blamed has no stack, so it may instead
    have hung of its own within the step; of a rank that left early and was still ending (``ending``): it may instead
    have been still running (``Diagnosis.suspected``)."""
    ending: bool = False
    """Of a rank that left early (Kind.LEFT), and of the ranks out of step beside it (Kind.OUT_OF_STEP): torchrun's
    agent ended it (SIGTERM) while it was still ending, after the others' collective broke on its closed connections
    (``Diagnosis.broken``, ``Diagnosis.ended_exit_0``), rather than it having exited 0."""
    loss_after: LossAfter | None = None
    """Of a run whose training.csv logs a non-finite loss: what it logs after the first (None: every
    logged loss is finite, or a record of an older harness does not say)."""
    restarted_in_init: bool = False
    """torchrun started the workers again (--max-restarts) and every rank whose stack was taken
    waited in init_process_group: the restarted workers never met in their process group."""
    stopped_nonfinite: bool = False
    """The trainer exited with the contract's code for a non-finite loss (diagnosis.exited_nonfinite) and
    no .HALT says so: it wrote none, or one cut short before its source. Its guard did stop on the loss,
    and did not say where."""
    killed_by: str | None = None
    """The name of the signal of ``killed`` ('SIGKILL'): who may have sent it depends on it (the
    kernel's out-of-memory killer sends SIGKILL only)."""
    importing: bool = False
    """Of a stall of several ranks: a rank blamed as hung was still importing modules (``RankAt.importing``)."""
    loader: bool = False
    """Of a stall: a rank blamed as hung waited for its DataLoader's worker processes (``RankAt.workers``)."""
    unsteady: Unsteady | None = None
    """Of a failed toks_per_s_cv gate: its window's slow steps and where their time went
    (``GateResult.unsteady``), which decides what the advice looks at."""

    @classmethod
    def of(cls, rec: PhaseRecord) -> Facts:
        ev = rec.evidence
        stacks = sum(1 for d in [*ev.stackdumps.values(), *ev.unranked_stacks] if d.frames)
        started = ev.nodes is None or any(n.ranks for n in ev.nodes.nodes) or bool(ev.last_heartbeat) or \
            bool(ev.rank_failures) or bool(ev.taken_stacks)
        stepped = bool(rec.metrics.steps_completed) or any((b.step or 0) >= 1 for b in ev.last_heartbeat.values())
        root = root_of_evidence(ev)
        fail = ev.rank_failures.get(root) if root is not None else None
        # a signal of its own: not the abort of an exit after its collective broke (RankFailure.broken_collective)
        killed, killed_by = (f"rank {root} was killed by {fail.signal}", fail.signal) \
            if killed_by_signal(rec) is not None else (None, None)
        if killed is None and (alone := killed_alone(rec)) is not None:  # no torchrun log of a rank to say it
            killed, killed_by = alone.sentence(), alone.signal
        silent = None
        if fail is not None and fail.broken_collective is not None:
            silent = (f"rank {root} was killed by {fail.signal} after a collective broke "
                      f"({short_exception(fail.broken_collective)}): an interpreter's exit aborting on a broken "
                      "process group's threads, a failure after that of a peer (one that failed or left first), "
                      "not its own")
        elif fail is not None and fail.silent:
            beat = ev.last_heartbeat.get(root)
            silent = (f"rank {root} exited with code {fail.exit_code} and no traceback of its own in torchrun's log"
                      + (": the log's traceback that names no rank, in the finding, is most likely its, printed "
                         "before its process group" if fail.unranked else
                         " (it failed before its process group, or exits on an error without raising it)"
                         if beat is None or beat.step is None else
                         f" after its last heartbeat (step {beat.step}, stage {beat.stage or '?'}): the trainer exits "
                         "on an error there without raising it"))
        stopped = any(t.state == "stopped" and t.rank is not None for t in ev.taken_stacks)
        # the failed rank's exception is its traceback's (torchrun's log); a record stored before the
        # whole log was read for one: its tail says
        traced = bool(fail is not None and fail.exception) or (
            ev.traceback if ev.traceback is not None else has_traceback(ev.stderr_tail))
        says = LogSays.TRACEBACK if traced else \
            LogSays.ONE_LINE if ev.log_exception else LogSays.NOTHING
        ranked = [d for d in ev.stackdumps.values() if d.frames]
        in_init = bool(ranked) and all(any(f.func == "init_process_group" for f in d.frames) for d in ranked)
        return cls(rec.own_trainer, rec.world_size, stacks, rec.accelerator == "cuda",
                   no_rank_running(rec), not started, not stepped,
                   ev.halt is not None and ev.halt.source == "nonfinite", killed, tuple(ev.misses), silent, stopped,
                   tuple(maybe_departed(rec)), says,
                   loss_after=ev.nonfinite_loss.after if ev.nonfinite_loss is not None else None,
                   restarted_in_init=in_init and any(a.restarted for a in ev.attempts),
                   stopped_nonfinite=rec.kind in TRAINER_KINDS and (ev.halt is None or ev.halt.source is None)
                   and exited_nonfinite(rec.exit_code, ev.rank_failures) is not None,
                   killed_by=killed_by)


@dataclass(frozen=True)
class Finding:
    severity: Severity
    phase: str
    title: str
    detail: list[str] = field(default_factory=list)
    kind: str = ""
    """Which detector found it (recommendations key on this)."""
    facts: Facts = Facts()
    """What is true of the run(s) it is about (the advice reads it)."""
    diagnosis: Diagnosis | None = None
    """Of a crash or a stall: what happened and the rank(s) it blames (validation/judge/diagnosis/),
    which the point's verdict line names too; None where it blames no rank."""
    rerun: PhaseRecord | None = None
    """The point that a re-run of it alone may settle (a launch that failed, a pytest point): the
    report adds its re-run line to the detail, built as its Reproduce lines are
    (validation/report/tables.py ``rerun_line``: this report's runbook, profile and results
    directory, the tests by absolute path), so that it runs as printed from any directory."""


def point_label(rec: PhaseRecord) -> str:
    """The record's sweep parameters in the runbook's sweep order: 'seq_len=512, batch_size=2'."""
    order = rec.params_order or sorted(rec.key.params)
    return ", ".join(f"{k.split('.')[-1]}={rec.key.params[k]}" for k in order if k in rec.key.params) or "default"


def where(rec: PhaseRecord) -> str:
    """'phase [point]'."""
    return f"{rec.phase} [{point_label(rec)}]"


def where_run(rec: PhaseRecord) -> str:
    """'phase [point]', and which of its processes the record's evidence is of, for points that
    run several ('resume [default], first half (steps 1-3, stopped)')."""
    return where(rec) + (f", {rec.part}" if rec.part else "")


@dataclass(frozen=True)
class Watched:
    """One run of a record whose whole training.csv findings read: where it is for people, the
    directories of the processes whose steps it holds and what it says of how it trained."""

    where: str
    out_dirs: tuple[str, ...]
    signs: RunSigns
    resumed_after: int | None = None
    """Of a run of a resume point that holds steps after its stop: the step the first half stopped
    after, so that a finding says which of its steps is the first after the resume; else None."""

    def path(self, name: str) -> str:
        """The file ``name`` of each of its processes: 'runs/.../first/training.csv and ...'."""
        return " and ".join(f"{d}/{name}" for d in self.out_dirs)


def watched_runs(rec: PhaseRecord) -> list[Watched]:
    """The runs of a record that the findings of spikes, divergence, a non-finite loss, a slowdown
    and memory growth look at: every repeat of a repeated point ('ab [default], repeat 1 of 3'),
    not only the one whose evidence the record keeps; of a resume point, its uninterrupted
    reference run ('resume [default], uninterrupted run (steps 1-30)', which no gate of the point
    reads) and the resumed run its record holds, each sign named by the half whose steps it is of
    (``_halves``); else the record's own run (and so for a record of an older harness, whose
    processes kept no signs)."""
    repeats = [s for s in rec.runs if s.name.startswith("repeat") and s.signs is not None]
    if repeats:
        return [Watched(f"{where(rec)}, {s.label}", (s.out_dir,), s.signs) for s in repeats]
    own = Watched(where_run(rec), (rec.out_dir,), RunSigns.of(rec.evidence, [g.metric for g in rec.failed_gates()]))
    reference = next((s for s in rec.runs if s.name == "reference" and s.signs is not None), None)
    if rec.kind == "resume" and reference is not None and reference.out_dir != rec.out_dir:
        # its own gates judge nothing of the point (no gate's finding names what it found): its spikes
        # are warnings, its non-finite loss a finding of its own
        return [Watched(f"{where(rec)}, {reference.label}", (reference.out_dir,),
                        replace(reference.signs, failed_gates=[])), *_halves(rec, own)]
    return [own]


def _halves(rec: PhaseRecord, own: Watched) -> list[Watched]:
    """The runs of a resume point after its reference, each sign named by the half whose steps it
    is of (a spike at a step of the first half is the first half's, in its directory, never the
    second half's whose evidence the record keeps). Where the second half ran clean, the record
    holds the resumed run (the first half's steps up to resume_after, the second's after it): its
    signs are split by step, and one over steps of both halves (a rise, a slowdown, memory growth
    fitted across the resume) is the resumed run's, in both directories. Where the second half
    failed, the record holds it alone, beside the first half's own signs; where the first failed,
    the record is the first half's."""
    if rec.halves is None:
        first = next((s for s in rec.runs if s.name == "first" and s.out_dir != rec.out_dir), None)
        if first is None or first.signs is None:  # the first half failed (the record's), or an older record
            return [own]
        # the second half failed: the record holds it alone, and no gate of the point read the first's
        return [Watched(f"{where(rec)}, {first.label}", (first.out_dir,), replace(first.signs, failed_gates=[])),
                replace(own, resumed_after=rec.asked.resume_after if rec.asked is not None else None)]
    first, _ = rec.halves
    last = rec.asked.resume_after if rec.asked is not None else None
    if not last:  # a record of an older harness: where the halves meet is not kept
        return [own]
    signs = own.signs

    def of(lo: int, hi: int) -> int:
        """0: the steps lo-hi lie in the first half, 1: in the second, 2: in both."""
        return 0 if hi <= last else 1 if lo > last else 2

    def part(k: int) -> RunSigns:
        div, slow, nan = signs.divergence, signs.slowdown, signs.nonfinite_loss_step
        return replace(  # a spike is of the half that holds its rise, from the step it began to its last
            signs, spikes=[x for x in signs.spikes if of(x.began, x.ended) == k],
            divergence=div if div is not None and of(div.low_first_step, div.last_step) == k else None,
            slowdown=slow if slow is not None and of(slow.before_first_step, slow.last_step) == k else None,
            memory_growth=[g for g in signs.memory_growth if of(g.first_step, g.last_step) == k],
            nonfinite_loss_step=nan if nan is not None and of(nan, nan) == k else None,
            halted_nonfinite=signs.halted_nonfinite and k == 1)  # a .HALT is the second half's, the record's

    return [Watched(f"{where(rec)}, {first.label}", (first.out_dir,), part(0)),
            replace(own, signs=part(1), resumed_after=last),
            Watched(f"{where(rec)}, the resumed run ({first.label}, then {rec.part})", (first.out_dir, rec.out_dir),
                    part(2), last)]


def processes(records: list[PhaseRecord]) -> list[PhaseRecord]:
    """Each record, and of a repeated point each other repeat that kept its evidence, as a record
    of its own process (``process``): a repeat that crashed, stalled, stopped short, broke a
    contract file or ran with an idle or slow rank is a finding named with its repeat ('crash in
    ab [default], repeat 2 of 3: ...'), whichever repeat decided the record."""
    out = []
    for r in records:
        out.append(r)
        out += [process(r, s) for s in r.runs
                if s.name.startswith("repeat") and s.out_dir != r.out_dir and s.evidence is not None]
    return out


def process(rec: PhaseRecord, sub: SubRun) -> PhaseRecord:
    """The record as one of its processes (``sub``, which kept its evidence) would have it: its exit
    code, how it ended, its evidence, numbers and gates, and ``where_run`` naming it."""
    return replace(rec, out_dir=sub.out_dir, status=sub.status, reason=sub.reason, exit_code=sub.exit_code,
                   timed_out=sub.timed_out, stalled_s=sub.stalled_s, timeout_quiet_s=sub.timeout_quiet_s,
                   wall_s=sub.wall_s, command=list(sub.command), metrics=sub.metrics, gates=list(sub.gates),
                   evidence=sub.evidence)


def own_reason(rec: PhaseRecord) -> str:
    """The record's reason without the process it names first, which ``where_run`` names ('trainer
    crashed (exit code 1)' of 'repeat 2 of 3: trainer crashed (exit code 1)')."""
    return rec.reason.removeprefix(f"{rec.part}: ") if rec.part else rec.reason


def repeat_part(rec: PhaseRecord) -> str:
    """Of a repeated point, the repeat whose gates and evidence its record holds ('repeat 2 of 3':
    its most severe failure, session/repeats.py, else the last); '' for any other point."""
    return rec.part if any(s.name.startswith("repeat") for s in rec.runs) else ""


def where_gated(rec: PhaseRecord) -> str:
    """'phase [point]', and for a repeated point the repeat whose gate values the record holds
    ('ab [default], repeat 2 of 3'); a resume point's gates are the whole point's."""
    part = repeat_part(rec)
    return where(rec) + (f", {part}" if part else "")


def last_heartbeat(rec: PhaseRecord, rank: int) -> str:
    """'last heartbeat step 4, stage data'; for a rank that wrote none, the file it was to write
    and whether it exists: 'no heartbeat written (heartbeat_rank1.jsonl has no record)'; of a
    trainer whose format has none, what its adapter said: 'no heartbeats (a Trainer writes no
    per-rank records)'; of a process torchrun started again that wrote none, whose heartbeat is an
    earlier attempt's (diagnosis.earlier_beat), whose it was."""
    hb = rec.evidence.last_heartbeat.get(rank)
    if hb is None and rec.evidence.no_heartbeats:
        return f"no heartbeats ({rec.evidence.no_heartbeats})"
    if hb is None:
        name = heartbeat_name(rank)
        return f"no heartbeat written ({f'{name} has no record' if name in rec.evidence.files else f'no {name}'})"
    said = f"last heartbeat step {'?' if hb.step is None else hb.step}, stage {hb.stage or '?'}"
    earlier = earlier_beat(rec.evidence, rank)
    if earlier is not None:
        return f"no heartbeat of pid {earlier[1]}; its {said} was pid {earlier[0]}'s, of an earlier attempt"
    return said


def attempts_said(attempts: list[AttemptEnd]) -> str:
    """Each attempt's end (AttemptEnd.text) in order; of a launch of several nodes, whose agents each
    count their own attempts, a rank's failure in its own right before those of ranks whose
    collective it broke, within an attempt's number."""
    return "; ".join(a.text() for a in sorted(attempts, key=lambda a: (a.attempt, not a.own, a.node or 0)))


def attempt_logs(ev: Evidence, attempts: list[AttemptEnd]) -> str:
    """The logs that say how ``attempts`` ended, as a finding names them: ' (trainer.stderr.log)';
    of a launch of several nodes, each node's agent's log that shows one (' (node0.stderr.log,
    node1.stderr.log)'); '' where no log is known."""
    nodes = sorted({a.node for a in attempts if a.node is not None})
    if nodes and ev.nodes is not None:
        logs = [n.log for n in ev.nodes.nodes if n.index in nodes]
    else:
        logs = [ev.stderr_log] if ev.stderr_log else []
    return f" ({', '.join(logs)})" if logs else ""
