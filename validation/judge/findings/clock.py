"""A trainer whose logged step times are far shorter than the steps its heartbeats and its process
show (judge/clock.py): its tokens/s and step times, and every gate on them, are not the run's."""
from __future__ import annotations

from nsa.contract import TRAINING_CSV, heartbeat_name
from validation.judge.findings.finding import Facts, Finding, Severity, processes, where_run
from validation.judge.gates import Overruled, rule
from validation.judge.record import PhaseRecord

#: what a trainer does to log the step times the harness sees
FIX = ("time the whole step, from the end of the step before to the end of this one (data, forward, backward, "
       "optimizer: everything the loop does each step), and on a GPU synchronise the device (torch.cuda.synchronize()) "
       "before reading the clock, as its kernels still run after the Python that launched them returned; "
       "toks_per_s is the step's global tokens over that time")


def untrue_clocks(records: list[PhaseRecord]) -> list[Finding]:
    """A critical finding per process (every repeat's) whose trainer logged step times far shorter
    than the time per step its heartbeats and its wall time show (StepClock.disputed), naming both
    numbers, the files, the gates its numbers were not believed in, and what to fix."""
    out = []
    for r in processes(records):
        clock = r.evidence.clock
        if clock is None or not clock.disputed:
            continue
        overruled = [g for g in r.gates if g.overruled == Overruled.CLOCK]
        detail = [clock.text(),
                  f"{TRAINING_CSV}: {r.out_dir}/{TRAINING_CSV} ({clock.logged_from}); heartbeats: "
                  f"{r.out_dir}/{heartbeat_name(clock.rank)} (time)"]
        if overruled:
            detail.append("failed whatever their value, the trainer's numbers not believed: " + "; ".join(
                f"{g.metric} = {'no data' if g.value is None else f'{g.value:.4g}'}, needs {rule(g.op, g.threshold)} "
                f"({g.window})" for g in overruled))
        detail.append(f"fix in the trainer: {FIX}")
        out.append(Finding(Severity.CRITICAL, r.phase, (
            f"step times not believed in {where_run(r)}: the trainer logs {clock.logged_s:.3g} s a step, its heartbeats "
            f"and wall time show {clock.seen_s:.3g} s ({clock.ratio:.1f}x): its tokens/s and step times leave out part "
            "of each step"),
            detail, "clock", Facts.of(r)))
    return out
