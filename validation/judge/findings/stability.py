"""Findings about how the loss and the gradient norm behaved over a run: spikes and rises that
lasted, each named from the step it began (a warning: a run may recover from one, and a reader
should know it happened), a NaN-free divergence (critical: a loss that climbs is not a
configuration to take into a long run), and a non-finite loss the trainer logged and went on from
(critical, whether or not a gate checks it). They come from the record's evidence, found by the
profile's rule when the point was judged (validation/judge/stability.py)."""
from __future__ import annotations

import enum

from validation.judge.findings.finding import Facts, Finding, Severity, Watched, watched_runs
from validation.judge.record import PhaseRecord
from validation.judge.resume import placed
from validation.judge.stability import Shape, Spike, events


class Kind(enum.StrEnum):
    """What a spike finding is of, which decides its advice (findings/advice.py)."""

    SPIKE = "spike"
    """One step far above the steps before it (stability.Shape.STEP)."""
    LEVEL_SHIFT = "level_shift"
    """A rise over consecutive steps (stability.Shape.RISE, SHIFT): something changed at its first step."""
    RESUME_SHIFT = "resume_shift"
    """A rise from the first step after a resume, which the point's uninterrupted run does not have."""


#: spikes listed one by one in a finding's detail; the title counts them all
LISTED = 5
_WHAT = {"loss": "loss", "grad_norm": "gradient-norm"}
#: the metric that counts each column's spikes: a failed gate on it makes its finding critical
GATED_BY = {"loss": "loss_spikes", "grad_norm": "grad_norm_spikes"}
#: metrics whose failed gate these findings explain (validation/judge/findings/failures.py)
EXPLAINED = frozenset({*GATED_BY.values(), "loss_diverging"})


def spikes(records: list[PhaseRecord]) -> list[Finding]:
    """One finding per run (every repeat of a repeated point), column and ``Kind``: one-step spikes,
    and rises that lasted (judge/stability.py ``Shape``), named from the step they began, not the
    step scored. The first is named in the title (step, value, rolling median, robust z), the first
    few in the detail. A warning, or critical where the phase gates that column's spikes and the
    run's gate failed."""
    out = []
    for r in records:
        reference = next((s.signs.spikes for s in r.runs if s.name == "reference" and s.signs is not None), None)
        for run in watched_runs(r):
            by_col: dict[str, list[Spike]] = {}
            for s in run.signs.spikes:
                by_col.setdefault(s.column, []).append(s)
            for col, found in by_col.items():
                by_kind: dict[Kind, list[Spike]] = {}
                for s in events(found):
                    by_kind.setdefault(_kind(run, s, reference), []).append(s)
                for kind, group in by_kind.items():
                    out.append(_finding(r, run, col, kind, group))
    return out


def _kind(run: Watched, s: Spike, reference: list[Spike] | None) -> Kind:
    """The finding's kind of a spike of ``run``; ``reference``: the spikes of the point's
    uninterrupted run, of a resume point (None: it has none)."""
    if s.shape == Shape.STEP:
        return Kind.SPIKE
    after_resume = run.resumed_after is not None and s.began == run.resumed_after + 1
    # a rise the uninterrupted run has too began at a step of the data or schedule, not at the resume
    shared = reference is None or any(x.column == s.column and x.began <= s.began <= x.ended for x in reference)
    return Kind.RESUME_SHIFT if after_resume and not shared else Kind.LEVEL_SHIFT


def _began(run: Watched, s: Spike) -> str:
    """Where the step a rise began lies against the resume, of a run that holds steps after one."""
    return placed(s.began, run.resumed_after) if run.resumed_after is not None and s.began > run.resumed_after else ""


def _finding(r: PhaseRecord, run: Watched, col: str, kind: Kind, found: list[Spike]) -> Finding:
    first = found[0]
    if len(found) == 1:
        many = f"{_WHAT[col]} {first.shape}"
    else:
        many = f"{len(found)} {_WHAT[col]} spikes" if kind == Kind.SPIKE else f"{len(found)} lasting {_WHAT[col]} rises"
    lines = [s.text() if kind == Kind.SPIKE else s.event_text(_began(run, s)) for s in found[:LISTED]]
    detail = lines if len(found) > 1 else []
    if len(found) > LISTED:
        detail.append(f"... and {len(found) - LISTED} more")
    detail.append(f"CSV: {run.path('training.csv')} ({col} column)")
    severity = Severity.CRITICAL if GATED_BY[col] in run.signs.failed_gates else Severity.WARNING
    return Finding(severity, r.phase, f"{many} in {run.where} " + ("(the first) " if len(found) > 1 else "")
                   + first.event_text(_began(run, first)), detail, kind, Facts.of(r))


def divergence(records: list[PhaseRecord]) -> list[Finding]:
    """One critical finding per run (every repeat of a repeated point) whose loss rose (NaN-free)
    by more than the rule allows."""
    return [Finding(Severity.CRITICAL, r.phase, f"loss diverging in {run.where} {rise.start_text()}: "
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
