"""Findings about how the loss and the gradient norm behaved over a run: spikes (a warning: a run
may recover from one, and a reader should know it happened), a NaN-free divergence (critical:
a loss that climbs is not a configuration to take into a long run), and a non-finite loss the
trainer logged and went on from (critical, whether or not a gate checks it). They come from the
record's evidence, found by the profile's rule when the point was judged
(validation/judge/stability.py)."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, watched_runs
from validation.judge.record import PhaseRecord
from validation.judge.stability import Spike

#: spikes listed one by one in a finding's detail; the title counts them all
LISTED = 5
_WHAT = {"loss": "loss", "grad_norm": "gradient-norm"}
#: the metric that counts each column's spikes: a failed gate on it makes its finding critical
GATED_BY = {"loss": "loss_spikes", "grad_norm": "grad_norm_spikes"}
#: metrics whose failed gate these findings explain (validation/judge/findings/failures.py)
EXPLAINED = frozenset({*GATED_BY.values(), "loss_diverging"})


def spikes(records: list[PhaseRecord]) -> list[Finding]:
    """One finding per run (every repeat of a repeated point) and column with spikes: the first
    named in the title (step, value, rolling median, robust z), the first few in the detail. A
    warning, or critical where the phase gates that column's spikes and the run's gate failed."""
    out = []
    for r in records:
        for run in watched_runs(r):
            by_col: dict[str, list[Spike]] = {}
            for s in run.signs.spikes:
                by_col.setdefault(s.column, []).append(s)
            for col, found in by_col.items():
                many = f"{len(found)} {_WHAT[col]} spikes" if len(found) > 1 else f"{_WHAT[col]} spike"
                first = found[0]
                detail = [s.text() for s in found[:LISTED]] if len(found) > 1 else []
                if len(found) > LISTED:
                    detail.append(f"... and {len(found) - LISTED} more")
                detail.append(f"CSV: {run.path('training.csv')} ({col} column)")
                severity = Severity.CRITICAL if GATED_BY[col] in run.signs.failed_gates else Severity.WARNING
                out.append(Finding(severity, r.phase, (
                    f"{many} in {run.where} " + ("(the first) " if len(found) > 1 else "") + f"at {first.text()}"),
                    detail, "spike", Facts.of(r)))
    return out


def divergence(records: list[PhaseRecord]) -> list[Finding]:
    """One critical finding per run (every repeat of a repeated point) whose loss rose (NaN-free)
    by more than the rule allows."""
    return [Finding(Severity.CRITICAL, r.phase, f"loss diverging in {run.where} from step {rise.first_step}: "
                    f"{rise.text()}", [f"CSV: {run.path('training.csv')}"], "diverging", Facts.of(r))
            for r in records for run in watched_runs(r) if (rise := run.signs.divergence) is not None]


def nonfinite(records: list[PhaseRecord]) -> list[Finding]:
    """One critical finding per run (every repeat of a repeated point) whose training.csv logs a
    non-finite loss that nothing else names: not where the trainer's own guard stopped on it (.HALT
    source nonfinite: the crash finding's) nor where a loss_finite gate failed on it (the gate's
    finding names the step). A runbook that gates only speed would otherwise pass a run whose loss
    went NaN."""
    out = []
    for r in records:
        for run in watched_runs(r):
            step = run.signs.nonfinite_loss_step
            if step is None or run.signs.halted_nonfinite or "loss_finite" in run.signs.failed_gates:
                continue
            out.append(Finding(Severity.CRITICAL, r.phase, f"non-finite loss in {run.where}: first logged at step {step}, "
                               "and the trainer did not stop on it (no .HALT); no loss_finite gate of the phase checks it",
                               [f"CSV: {run.path('training.csv')} (loss column)"], "nonfinite", Facts.of(r)))
    return out
