"""A finished point's verdict: how the process ended first (a timeout, a .HALT, a crash, a broken
contract, a half of a resume point that did not do what it was asked, a run that stopped short:
each explains everything after it), then its gates (evaluated in validation/judge/gates.py) and a
non-finite loss it logged, which no gate can pass.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from nsa.contract import HALT, HALT_NONFINITE, HALT_WATCHDOG
from validation.contract.check import HEARTBEATS, adapter_summary_step, adapter_unmeasured
from validation.contract.files import HaltInfo
from validation.judge.diagnosis.failed import Died, died_before_watchdog, died_first, root_of_evidence, root_rank
from validation.judge.diagnosis.nonfinite import NonfiniteExit, nonfinite_exit, nonfinite_exit_of
from validation.judge.gates import GateResult, GateVerdict, Pending
from validation.judge.metrics import PROFILE_METRICS, RunData, compute
from validation.judge.misses import pytest_ended
from validation.judge.nodes import agent_killed
from validation.judge.record import (
    TRAINER_KINDS,
    Beat,
    PhaseRecord,
    Status,
    last_step_done,
    rank_processes,
)
from validation.judge.resume import Breach
from validation.judge.seen import RankSilence
from validation.judge.short_ranks import CsvAhead, ShortRank, csv_ahead, short_ranks
from validation.judge.stability import first_nonfinite
from validation.judge.unprofiled import NoProfile
from validation.excerpt import EXCERPT_CHARS


#: the verdict of a run that exited non-zero with nothing more known of it at the time: the
#: point's diagnosis (judge/diagnosis/) may find later that no rank crashed (findings/headline.py)
CRASHED = "trainer crashed"


@dataclass(frozen=True)
class Outcome:
    """How a point's process ended, as the verdict reads it: from a run, or from a stored record
    (the report re-judges stored points whose golden gate it re-checks)."""

    kind: str
    exit_code: int | None = None
    timed_out: bool = False
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped the run as stalled (None: no stall)."""
    halt: HaltInfo | None = None
    errors: tuple[str, ...] = ()
    steps_requested: int | None = None
    steps_completed: int | None = None
    stacks_tried: int | None = None
    """Processes of ranks whose stacks the harness took (or tried to) when it stopped the run; 0:
    no rank was left running (they had ended, a launcher kept the run open); None: not known."""
    last_step_done: int | None = None
    """The furthest step a rank's heartbeats say was completed, else, of a format without them, the
    step of the trainer's own end-of-run summary (Evidence.summary_step): a stall's 'after step N'
    where the CSV lags (a trainer that logs every k steps)."""
    died_first: Died | None = None
    """A rank that failed in its own right before the other ranks' watchdog wrote the .HALT while
    waiting for it (diagnosis.died_before_watchdog), and how; None otherwise."""
    slurm_stopped: str | None = None
    """How Slurm ended the run's step without the harness asking (RunData.slurm_stopped)."""
    short_ranks: tuple[ShortRank, ...] = ()
    """Ranks whose heartbeats say they stopped before the run did (judge/short_ranks.py), with
    their last heartbeat: of a run of several ranks that exited 0, a rank that left early while the
    others, sharing no collective with it after, went on (rank 0's training.csv then is complete)."""
    records_steps: bool = True
    """Whether the trainer's files record each step as it runs (heartbeats). An adapter's format
    without them (a Hugging Face Trainer's) holds a step only once logged or saved: a run with no
    step in its files may still have stepped."""
    agent_killed: str | None = None
    """'node 1's torchrun agent was killed by SIGKILL', of a run where no rank failed in its own
    right: what ended it (validation/judge/nodes.py ``agent_killed``)."""
    nonfinite_loss_step: int | None = None
    """The first step whose loss training.csv logs as not finite (None: every logged loss is): of a
    run that ended clean, a FAIL whatever its gates (``clean_verdict``)."""
    csv_ahead: CsvAhead | None = None
    """training.csv logs a step beyond every rank's heartbeats (judge/short_ranks.py): the ranks that
    seem short (``short_ranks``) are so only against the CSV, which the verdict does not take for
    the truth."""
    silent_ranks: tuple[RankSilence, ...] = ()
    """Of a run the harness stopped: the ranks whose heartbeats stopped for stall_s while another's
    went on (RankSilence): a stall of theirs, or what a timeout found hung."""
    resume_breach: Breach | None = None
    """Of a half of a resume point: what it did that it was not asked (judge/resume.py), which no
    gate of the resumed run can see."""
    no_profile: NoProfile | None = None
    """Of a profile point: the profile its trainer did not write (judge/unprofiled.py), which a
    clean run's gates need not read."""
    nonfinite_exit: NonfiniteExit | None = None
    """A trainer that exited with the contract's code for a non-finite loss and wrote no .HALT
    (diagnosis.nonfinite_exit): it stopped on one, no crash."""
    halts: bool = True
    """Whether the trainer's format has a .HALT (an adapter's may not: a Hugging Face Trainer's),
    so that a run that exited 0 early is said to have written none only where it could have."""

    @classmethod
    def of_run(cls, kind: str, run: RunData, errors: Sequence[str], resume_breach: Breach | None = None,
               no_profile: NoProfile | None = None) -> Outcome:
        beats = {r: Beat.of(recs) for r, recs in run.heartbeats.items() if recs and r < run.world_size}
        done, seen = last_step_done(beats.values()), rank_processes(beats, run.processes)
        if not beats:
            done = adapter_summary_step(run.env)
        completed = compute("steps_completed", run, None)
        logged = None if completed is None else int(completed)
        died = died_before_watchdog(run.halt, run.stopped_by_harness, run.rank_failures)
        return cls(kind, run.exit_code, run.timed_out, run.stalled_s, run.halt, tuple(errors), run.steps_requested,
                   logged, run.stacks_tried, done, died, run.slurm_stopped,
                   short_ranks(beats, run.world_size, run.steps_requested, logged, seen),
                   HEARTBEATS not in adapter_unmeasured(run.env),
                   run.agent_killed if root_rank(run.rank_failures, run.halt.source if run.halt else None) is None
                   else None, first_nonfinite(run.csv), csv_ahead(beats, run.world_size, logged),
                   tuple(s for s in run.silent_ranks if s.rank < run.world_size), resume_breach, no_profile,
                   nonfinite_exit(run.exit_code, run.rank_failures, run.halt) if kind in TRAINER_KINDS else None,
                   halts=HALT not in adapter_unmeasured(run.env))

    @classmethod
    def of_record(cls, rec: PhaseRecord) -> Outcome:
        completed = rec.metrics.steps_completed
        stopped = rec.stopped_by_harness
        steps = rec.steps if rec.kind in TRAINER_KINDS else None
        logged = None if completed is None else int(completed)
        return cls(rec.kind, rec.exit_code, rec.timed_out, rec.stalled_s, rec.evidence.halt, tuple(rec.evidence.errors),
                   steps, logged,
                   len(rec.evidence.taken_stacks) if stopped else None,
                   last_step_done(rec.evidence.last_heartbeat.values()) if rec.evidence.last_heartbeat
                   else rec.evidence.summary_step,
                   died_first(rec),
                   rec.evidence.nodes.slurm_stopped if rec.evidence.nodes is not None else None,
                   short_ranks(rec.evidence.last_heartbeat, rec.world_size, steps, logged, rec.evidence.rank_processes),
                   not rec.evidence.no_heartbeats,
                   agent_killed(nodes.launcher, nodes.nodes, stopped)
                   if (nodes := rec.evidence.nodes) is not None and root_of_evidence(rec.evidence) is None else None,
                   rec.evidence.nonfinite_loss_step,
                   csv_ahead(rec.evidence.last_heartbeat, rec.world_size, logged) if steps is not None else None,
                   tuple(rec.evidence.silent_ranks), rec.evidence.resume_breach, rec.evidence.no_profile,
                   nonfinite_exit_of(rec), halts=not rec.evidence.no_halt)

    @property
    def ended_clean(self) -> bool:
        """A trainer run that exited 0 by itself: no .HALT, no timeout, no broken contract file."""
        return (self.kind in TRAINER_KINDS and self.exit_code == 0 and self.halt is None and not self.timed_out
                and not self.errors and self.steps_requested is not None)

    @property
    def done_by(self) -> str:
        """What says ``last_step_done``: the ranks' heartbeats, else the trainer's own summary."""
        return "its heartbeats" if self.records_steps else "its own summary"

    @property
    def stopped_short(self) -> bool:
        """Exit 0, no .HALT, no timeout, no broken contract file, and fewer steps logged than
        requested. A broken file decides the verdict first (process_verdict) and explains a step
        count read from it: a last row cut off is not read, so the CSV ends a step early."""
        return (self.ended_clean and self.steps_completed is not None
                and self.steps_completed < self.steps_requested and not self.csv_behind)

    @property
    def ran_past(self) -> bool:
        """Exit 0 and training.csv logs a step past the steps asked: the trainer does not take the
        steps the harness gives it (a script that sets its own max_steps), so the run judged is not
        the one asked for: its gates read steps past the run's end (a window of the last N, the
        loss of the last steps), and a baseline twin pairs with another run. A resume half that ran
        past its stop is its breach (judge/resume.py), which says it first."""
        return (self.ended_clean and self.resume_breach is None and self.steps_completed is not None
                and self.steps_completed > self.steps_requested)

    @property
    def csv_behind(self) -> str | None:
        """'training.csv ends at step 10 while the trainer reached step 12 (its heartbeats)': of a
        run that exited 0 having done every step its heartbeats record, a CSV that ends earlier (a
        trainer that logs every N steps, not one that stopped early); None otherwise."""
        done, logged = self.last_step_done, self.steps_completed
        if not self.ended_clean or done is None or logged is None or done < self.steps_requested or logged >= done:
            return None
        return f"training.csv ends at step {logged} while the trainer reached step {done} ({self.done_by})"

    @property
    def rank_stopped_short(self) -> bool:
        """Exit 0 and every step logged in training.csv, but a rank's heartbeats say it left before
        the last step (``short_ranks``)."""
        return self.ended_clean and not self.stopped_short and bool(self.short_ranks)

    @property
    def halted_itself(self) -> bool:
        """Stopped on a .HALT that neither the watchdog (a stall) nor the non-finite guard wrote: an
        operator's stop, or a stop condition of the trainer's own. With no stall or timeout of the
        harness before it, that .HALT is the verdict (``process_verdict``)."""
        return (self.halt is not None and self.halt.source not in (HALT_WATCHDOG, HALT_NONFINITE)
                and self.stalled_s is None and not self.timed_out)

    @property
    def halt_step(self) -> int | None:
        """The step a .HALT stopped the run at: its record's own, else the last step done (the CSV's
        last row, or further where a rank's heartbeats say so: a trainer logging every k steps)."""
        if self.halt is not None and self.halt.step is not None:
            return self.halt.step
        return max((n for n in (self.steps_completed, self.last_step_done) if n is not None), default=None)

    @property
    def halted_short(self) -> bool:
        """A .HALT stopped the run before the steps asked for."""
        step = self.halt_step
        return self.steps_requested is not None and (step or 0) < self.steps_requested

    def halt_at(self) -> str:
        """Where a .HALT stopped the run, against the steps asked for: 'at step 8 of 30' (its
        record's step), 'after step 7 of 30' (the last step done), 'after all 30 steps asked
        for', 'before its first step'; '' where neither is known (a record of no trainer kind)."""
        step, asked = self.halt_step, self.steps_requested
        of = f" of {asked}" if asked is not None else ""
        if self.halt is not None and self.halt.step is not None:
            return f"at step {step}{of}"
        if asked is None and step is None:
            return ""
        if not step:
            return "before its first step"
        if asked is not None and step >= asked:
            return f"after all {asked} steps asked for"
        return f"after step {step}{of}"

    def short_text(self) -> str:
        if self.ran_past:
            return (f"ran past the steps asked: training.csv logs step {self.steps_completed} of {self.steps_requested} "
                    "asked, exit 0")
        ended = ", exit 0, no .HALT" if self.halts else ", exit 0"
        if not self.stopped_short and self.csv_ahead is not None and self.short_ranks:
            return f"{self.csv_ahead.text(self.steps_requested)}{ended}"
        if not self.stopped_short and self.short_ranks:
            ranks = "; ".join(s.text(self.steps_requested) for s in self.short_ranks)
            return f"{ranks}{ended}"
        beats = (f" (training.csv; {self.done_by} reached step {self.last_step_done})"
                 if self.last_step_done is not None and self.last_step_done > self.steps_completed else "")
        return f"stopped after step {self.steps_completed}{beats} of {self.steps_requested}{ended}"


def verdict(outcome: Outcome, gates: Sequence[GateResult]) -> tuple[Status, str]:
    return process_verdict(outcome) or clean_verdict(outcome, gates)


def clean_verdict(outcome: Outcome, gates: Sequence[GateResult]) -> tuple[Status, str]:
    """The verdict of a run whose process ended clean (``process_verdict`` None): its gates, and a
    loss it logged as not finite, a FAIL whatever its gates (a runbook that gates only speed, or
    nothing), as a non-finite loss the trainer stopped on is. Where a gate failed (a loss_finite
    gate on that loss among them), the gates say why. A profile point without its profile is
    UNMEASURED where nothing failed, whatever its gates read: the phase exists to profile."""
    status, reason = gate_verdict(gates)
    step = outcome.nonfinite_loss_step
    if status == Status.FAIL:
        return status, reason
    if step is not None:
        return Status.FAIL, (f"non-finite loss logged at step {step}, and the trainer did not stop on it (no .HALT)"
                             + (f"; its gates: {reason}" if gates else ""))
    missing = outcome.no_profile
    if missing is None:
        return status, reason
    # a gate on a profile metric already says it (its note is the same words)
    said = any(g.pending == Pending.NOT_PROVIDED and g.metric in PROFILE_METRICS for g in gates)
    return Status.UNMEASURED, reason if said else missing.text() + (f"; its gates: {reason}" if gates else "")


def rejudge(rec: PhaseRecord, gates: list[GateResult]) -> PhaseRecord:
    """The record with ``gates`` in place of its own and its verdict derived again (a golden gate
    re-checked at report time); how its process ended still decides first."""
    status, reason = verdict(Outcome.of_record(rec), gates)
    return dataclasses.replace(rec, gates=gates, status=status, reason=reason)


def process_verdict(outcome: Outcome) -> tuple[Status, str] | None:
    """The verdict that how the process ended decides on its own, or None when it ran clean."""
    halt = outcome.halt
    if halt is not None and halt.source == "nonfinite":  # the trainer's NaN/inf guard, first whatever came after
        return Status.FAIL, _nonfinite(halt) + _after_halt(outcome)
    silent = "; ".join(s.text() for s in outcome.silent_ranks)
    if outcome.stalled_s is not None:
        # the CSV's last row, or further where a rank's heartbeats say so (a trainer logging every k steps)
        done = max((n for n in (outcome.steps_completed, outcome.last_step_done) if n is not None), default=None)
        at = f"after step {done}" if done else "before its first step (start-up)"
        # before the first step no rank may ever have run ('left' would say they had ended)
        stacks = ("stacks taken" if outcome.stacks_tried != 0 else "no rank was left running to take a stack of"
                  if done else "no rank was running to take a stack of")
        # a rank that hung while the others went on: the run's files showed progress, that rank's did not
        what = silent or f"no progress for {outcome.stalled_s:.0f}s {at}"
        return Status.FAIL, f"stalled: {what}; {stacks} and the run killed by the harness"
    if outcome.timed_out:
        return Status.FAIL, "timed out: killed by the harness at the phase timeout" + (f"; {silent}" if silent else "")
    if halt is not None:
        torn = " (its record cut short)" if halt.torn else ""
        if halt.source == "watchdog" and outcome.died_first:
            died = outcome.died_first
            return Status.FAIL, (f"trainer crashed: rank {died.rank}: {died.cause}; the other ranks' watchdog then wrote .HALT "
                                 f"waiting for it (exit code {outcome.exit_code}){torn}")
        if halt.source == "watchdog":
            return Status.FAIL, f"watchdog wrote .HALT: no rank made progress{torn}"
        # an operator's .HALT (empty, free text, or JSON from another source), or one cut short: it
        # says where the run stopped against the steps asked for, as a run that stopped short does
        at = f" {a}" if (a := outcome.halt_at()) else ""
        return Status.FAIL, f"stopped by a .HALT{at}{halt_said(halt)}"
    if outcome.slurm_stopped and outcome.exit_code not in (0, None):
        # someone's scancel, the job's time limit, preemption: the ranks were stopped, they did not fail
        return Status.FAIL, (f"stopped by Slurm, not by the trainer or the harness: {outcome.slurm_stopped} "
                             f"(exit code {outcome.exit_code})")
    if outcome.exit_code not in (0, None):
        what = (pytest_ended(outcome.exit_code) if outcome.kind == "pytest" else
                "preflight incomplete" if outcome.kind == "preflight" else None)
        if what is not None and outcome.errors:  # what it failed to do: a path not found, git describe
            what += f": {outcome.errors[0]}"
        # the CSV's last row, or the heartbeats' where a broken CSV gives no step count
        done = outcome.steps_completed or outcome.last_step_done
        if what is None and outcome.nonfinite_exit is not None:  # the contract's code: its word, no crash
            return Status.FAIL, outcome.nonfinite_exit.text(outcome.exit_code)
        if what is None and outcome.agent_killed:  # no rank failed of its own: the launch lost a node's agent
            what = outcome.agent_killed
        if what is None and not done:
            # no step logged: a crash at start-up, or ranks that never started at all (a node that
            # never joined the rendezvous); the findings tell which, the verdict claims neither. A
            # format that records steps only when it logs them cannot say even that much
            what = "trainer ended before its first step" if outcome.records_steps else "trainer ended with no step logged"
        # a file the crashed run broke after it had stepped is said too: the step counts read from it are missing
        broken = f"; {outcome.errors[0]}" if what is None and done and outcome.errors else ""
        return Status.FAIL, f"{what or CRASHED} (exit code {outcome.exit_code}){broken}"
    if outcome.errors:
        return Status.ERROR, outcome.errors[0]
    if outcome.resume_breach is not None:  # read from its files, so a broken one decides first
        return Status.FAIL, outcome.resume_breach.text()
    if outcome.stopped_short or outcome.rank_stopped_short or outcome.ran_past:
        return Status.FAIL, outcome.short_text()
    return None


def halt_said(halt: HaltInfo) -> str:
    """What a .HALT that is neither the watchdog's nor the non-finite guard's says, as the verdict
    and its finding quote it: ' (operator stop)', ' (an empty file)', ' (from ops: disk full)', '
    whose JSON record is cut short, no source in it: {"ste'."""
    text = halt.text[:EXCERPT_CHARS]
    if halt.torn and halt.source is None:
        return f" whose JSON record is cut short, no source in it: {text}"
    said = (text or "an empty file") if halt.source is None else f"from {halt.source}: {text}"
    return f" ({said})" + (" (its record cut short)" if halt.torn else "")


def _nonfinite(halt: HaltInfo) -> str:
    """'non-finite loss at step 3: loss per rank [...], grad_norm nan (trainer .HALT)'."""
    said = (f": loss per rank {halt.losses}, grad_norm {halt.grad_norm}" if halt.losses is not None
            else f" ({halt.text[:EXCERPT_CHARS]})")  # a trainer whose .HALT says less (the seed's)
    torn = " (its record cut short)" if halt.torn else ""
    return f"non-finite loss at step {halt.step}{said} (trainer .HALT){torn}"


def _after_halt(outcome: Outcome) -> str:
    """What became of a run after its trainer's non-finite .HALT where it did not end by itself: a
    rank that halted and stayed alive, the others waiting for it in a collective, until the harness
    stopped it (its stall watch or the timeout); '' where it ended."""
    if outcome.stalled_s is not None:
        return (f"; the run did not end after it: no progress for {outcome.stalled_s:.0f}s, stopped by the "
                "harness")
    if outcome.timed_out:
        return "; the run did not end after it: killed by the harness at the phase timeout"
    return ""


def gate_verdict(gates: Sequence[GateResult]) -> tuple[Status, str]:
    bad = [g for g in gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]
    if bad:
        return Status.FAIL, "; ".join(g.text() for g in bad)
    pending = [g for g in gates if g.verdict == GateVerdict.UNMEASURED]
    if pending:
        lacking = [f"{g.metric} ({g.note})" for g in pending if g.pending == Pending.NOT_PROVIDED]
        golden = [g.note for g in pending if g.pending == Pending.NO_GOLDEN]
        unset = list(dict.fromkeys(g.threshold_ref or g.metric for g in pending if g.pending == Pending.THRESHOLD))
        no_peak = [g.metric for g in pending if g.pending == Pending.NO_PEAK]
        busy = [g for g in pending if g.pending == Pending.BUSY_MACHINE]
        parts = ([f"{Pending.NOT_PROVIDED}: {', '.join(lacking)}"] if lacking else []) + golden + (
            [f"threshold(s) to be measured for this profile: {', '.join(unset)}"] if unset else []) + (
            [f"{Pending.NO_PEAK} (hardware.peak_bf16_tflops): {', '.join(no_peak)}"] if no_peak else []) + (
            [f"timing(s) not judged, the machine busy with other work: {', '.join(g.text() for g in busy)}"]
            if busy else [])
        return Status.UNMEASURED, "; ".join(parts)
    return Status.PASS, f"{len(gates)} gate(s) passed" if gates else "completed (no gates)"
