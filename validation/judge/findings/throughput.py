"""Findings about speed across the points of a phase: timings that shared the machine, throughput
cliffs, host-bound sweeps, the best setting of a sweep, and fallbacks to slower attention
backends; and within one run, tokens/s that fell and stayed down. The cross-point speed findings read only points whose timings did not share the
machine with another timed point (validation/judge/timing.py)."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, point_label, watched_runs, where
from validation.judge.findings.long_context import KIND_KEY
from validation.judge.interval import Interval, interval
from validation.judge.pace import fit_step_time
from validation.judge.record import PhaseRecord, Status
from validation.judge.timing import busy_machine, reliable, shared_machine

#: a sweep point is a cliff when its tokens/s falls below this fraction of the best earlier point
CLIFF_FRACTION = 0.25
#: kinds of finding that only show across points (a single point's test cannot fail on them)
CROSS_POINT = {"cliff", "host_bound", "long_context"}


def _toks(r: PhaseRecord) -> float | None:
    return r.metrics.toks_per_s_mean


def shared_timings(records: list[PhaseRecord]) -> list[Finding]:
    """One warning naming the timed points that ran side by side on one machine."""
    shared = shared_machine(records)
    if not shared:
        return []
    by_id = {r.test_id: r for r in records}
    lines = [f"{where(by_id[t])} ran at the same time as " + ", ".join(where(by_id[o]) for o in others)
             for t, others in shared.items()]
    phases = {by_id[t].phase for t in shared}
    return [Finding(Severity.WARNING, phases.pop() if len(phases) == 1 else "several",
                    f"timings unreliable: {len(shared)} timed point(s) shared the machine with another; their speeds "
                    "are left out of the cliff, host-bound and best-setting findings (their own gates still read them)",
                    lines, "timing", Facts.of(by_id[next(iter(shared))]))]


def busy_timings(records: list[PhaseRecord]) -> list[Finding]:
    """One warning naming the timed points that ran while other work kept the machine busy."""
    busy = busy_machine(records)
    if not busy:
        return []
    phases = {r.phase for r in busy}
    return [Finding(Severity.WARNING, phases.pop() if len(phases) == 1 else "several",
                    f"timings unreliable: {len(busy)} timed point(s) ran while other processes kept the machine busy; "
                    "their speeds are left out of the cliff, host-bound and best-setting findings, and their speed "
                    "gates and regression gate are judged within the most the load can have slowed them",
                    [f"{where(r)}: {r.load.describe()}" for r in busy], "busy_machine", Facts.of(busy[0]))]


def cliffs(records: list[PhaseRecord]) -> list[Finding]:
    """In each swept phase, in sweep order: the first point whose tokens/s drops below
    CLIFF_FRACTION of the best earlier point (the seeds' 165 -> 6 tokens/s at batch 2). A sweep
    across attention kinds compares two models, not one model's shapes: long_context.py reads it."""
    out = []
    for phase, recs in _by_phase(reliable(records)).items():
        if any(KIND_KEY in r.key.params for r in recs):
            continue
        best: PhaseRecord | None = None
        for r in sorted((r for r in recs if r.key.params and _toks(r) is not None), key=lambda r: r.sweep_index):
            if best is not None and _toks(r) < CLIFF_FRACTION * _toks(best):
                out.append(Finding(Severity.CRITICAL, phase, (
                    f"throughput cliff in {phase} at [{point_label(r)}]: {_toks(r):,.1f} toks/s after "
                    f"{_toks(best):,.1f} toks/s at [{point_label(best)}] ({_toks(best) / max(_toks(r), 1e-9):.1f}x drop)"),
                    [f"CSV: {r.out_dir}/training.csv ({r.window})"], "cliff", Facts.of(r)))
                break
            if best is None or _toks(r) > _toks(best):
                best = r
    return out


def slowdowns(records: list[PhaseRecord]) -> list[Finding]:
    """A warning per run whose tokens/s fell and stayed down (judge/stability.py ``slowdown``):
    a long run would go on at the later rate. Its gates (a floor on tokens/s, their spread) judge;
    this says where it happened."""
    return [Finding(Severity.WARNING, r.phase, f"tokens/s fell in {run.where} from step {fell.first_step}: "
                    f"{fell.text()}", [f"CSV: {run.path('training.csv')} (toks_per_s column)"], "slowdown", Facts.of(r))
            for r in records for run in watched_runs(r) if (fell := run.signs.slowdown) is not None]


def _tokens_per_step(rec: PhaseRecord) -> float | None:
    """The point's global tokens per optimizer step: recorded from env.json, else tokens/s x
    step time (records written before the metric existed)."""
    m = rec.metrics
    if m.tokens_per_step:
        return m.tokens_per_step
    if m.toks_per_s_mean and m.step_time_s_mean:
        return m.toks_per_s_mean * m.step_time_s_mean
    return None


def host_bound(records: list[PhaseRecord]) -> list[Finding]:
    """In each swept phase whose points differ in tokens per step: when the step time barely
    grows with the tokens (a meaningful fit whose fixed cost per step is at least half the step
    at the largest point, validation/judge/pace.py), a finding with the fit, so a reader knows
    why tokens/s is low. Each point's step time is its median over the window: the mean moves
    with slow first steps (a compile, a warm-up) of the same length at every point, which a fit
    takes for a fixed cost per step of a sweep whose steady steps grow with the tokens."""
    out = []
    for phase, recs in _by_phase(reliable(records)).items():
        done = [r for r in recs if r.kind == "train" and r.exit_code == 0 and not r.timed_out
                and r.metrics.step_time_s_median]
        fit = fit_step_time([(t, r.metrics.step_time_s_median) for r in done if (t := _tokens_per_step(r))])
        if fit is None or not fit.host_bound:
            continue
        facts = Facts.of(done[0])
        graphs = ("; on CUDA, graphs (train.cuda_graphs) remove the launch cost" if facts.cuda and facts.own_trainer
                  else "")
        out.append(Finding(Severity.WARNING, phase, (
            f"host-bound steps in {phase}: median step time {min(fit.step_s):.3g}-{max(fit.step_s):.3g} s while tokens "
            f"per step grow {fit.token_range:.1f}x ({min(fit.tokens):,.0f} -> {max(fit.tokens):,.0f})"), [
            f"fitted step time = {fit.fixed_s * 1e3:.1f} ± {fit.fixed_se * 1e3:.1f} ms fixed + "
            f"{fit.per_token_s * 1e6:.3g} ± {fit.per_token_se * 1e6:.2g} ms per 1k tokens "
            f"(least squares over {len(fit.tokens)} points; ± one standard error)",
            f"the fixed cost is {fit.fixed_share:.0%} of the step at the largest point: work that does not grow "
            "with the batch (launching work from the host, the optimizer, the gradient all-reduce) sets the pace, "
            f"so tokens/s grows only with tokens per step{graphs}"],
            "host_bound", facts))
    return out


def fallbacks(records: list[PhaseRecord]) -> list[Finding]:
    """One finding for all runs that reported fallbacks (heartbeat counters, or a route 'auto'
    chose after passing over a better backend), one detail line per run."""
    lines, names, phases, hit = [], set(), set(), []
    for r in records:
        counters = {k: v for k, v in r.evidence.fallbacks.items() if v}
        routed = {s: b for s, b in r.backends.items() if b.fallback or "fallback" in b.reason.lower() or b.backend == "mixed"}
        if counters or routed:
            names |= set(counters) | {f"{s} route" for s in routed}
            phases.add(r.phase)
            hit.append(r)
            parts = [f"{k}: {v:g}" for k, v in sorted(counters.items())]
            parts += [f"{s}: backend {b.backend} ({b.reason})" for s, b in sorted(routed.items())]
            lines.append(f"{where(r)}: " + "; ".join(parts))
    if not lines:
        return []
    return [Finding(Severity.WARNING, "several" if len(phases) > 1 else phases.pop(),
                    f"fallbacks in {len(lines)} of {len(records)} run(s): {', '.join(sorted(names))}", lines, "fallback",
                    Facts.of(hit[0]))]


def best_setting(records: list[PhaseRecord]) -> list[Finding]:
    """The runbook's rule for a sweep of one parameter: the highest mean wins; every point whose
    process finished counts, gates passed or not. A winner is named only when its lead beats the
    run-to-run spread: when the two leading points ran repeatedly and their t-intervals over the
    repeats do not overlap (validation/judge/interval.py). A point run once says nothing of that
    spread (its stdev over the window is step to step within one run: three runs of one setting
    named False, True and neither the best), so then the finding says it cannot tell."""
    out = []
    for phase, recs in _by_phase(reliable(records)).items():
        recs = [r for r in recs if len(r.key.params) == 1 and r.exit_code == 0 and _toks(r) is not None]
        if len(recs) < 2:
            continue
        best, second = sorted(recs, key=_toks, reverse=True)[:2]
        intervals = interval(best), interval(second)
        if None not in intervals:
            out.append(_best_by_intervals(phase, best, second, *intervals))
        else:
            out.append(_best_unknown(phase, best, second))
    return out


def _best_unknown(phase: str, best: PhaseRecord, second: PhaseRecord) -> Finding:
    """The best-setting finding where a leading point ran once: no run-to-run spread to judge by."""
    once = [point_label(r) for r in (best, second) if interval(r) is None]
    return Finding(Severity.INFO, phase, (
        f"no best setting in {phase}: {point_label(best)} ({_toks(best):,.1f} toks/s) leads {point_label(second)} "
        f"({_toks(second):,.1f}) by {_toks(best) - _toks(second):,.1f}, but {' and '.join(once)} ran once, which "
        "cannot tell a lead from run-to-run noise (the stdev over the window is step to step within one run); "
        "`repeats: 3` on the phase names a best setting when the intervals separate"), kind="best",
        facts=Facts.of(best))


def _best_by_intervals(phase: str, best: PhaseRecord, second: PhaseRecord, a: Interval, b: Interval) -> Finding:
    """The best-setting finding of two repeated points: named only when the intervals separate."""
    if a.separates(b):
        note = "" if best.status == Status.PASS else f"; its gates: {best.status}"
        return Finding(Severity.INFO, phase, (
            f"best setting in {phase}: {point_label(best)} at {a.text(' toks/s')}, above {point_label(second)} at "
            f"{b.text(' toks/s')}: the intervals do not overlap{note}"), kind="best", facts=Facts.of(best))
    return Finding(Severity.INFO, phase, (
        f"no best setting in {phase}: {point_label(best)} at {a.text(' toks/s')} and {point_label(second)} at "
        f"{b.text(' toks/s')} cannot be told apart: their intervals overlap"), kind="best", facts=Facts.of(best))


def _by_phase(records: list[PhaseRecord]) -> dict[str, list[PhaseRecord]]:
    out: dict[str, list[PhaseRecord]] = {}
    for r in records:
        out.setdefault(r.phase, []).append(r)
    return out
