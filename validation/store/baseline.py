"""Comparison with a baseline: the same runbook and profile stored in another results directory
(an earlier commit, the run before a kernel change), point by point.

Beside each summary metric of each point: the baseline's value and the relative change. Points
stored on only one side are listed, never dropped. The profile threshold ``max_toks_regression``
(a fraction: 0.05 = 5%) turns a larger drop of a point's tokens/s into a failed gate and a
critical finding ("tokens/s 8.1% below baseline <commit>"), so the report says NO-GO; without
it the changes are shown and nothing is gated. Drops of half the allowed one or more (at least
NOTED_DROP) that fail no gate are named in one note (an info finding, no verdict changes): a reader
sees how close a point came. Points repeated on either side (a phase's
``repeats``) compare by the rule the best-setting finding uses: a drop beyond the threshold is a
regression only when the current point's t-interval over its repeats lies wholly below the
baseline's (a point run once is an interval of no width); a drop inside the noise is shown,
with its intervals, and not gated. A point whose numbers are over other steps on the two sides
(the runbook's window, or its steps where the window is all of them, changed since the baseline),
or whose runs the runbook asked differently where that decides their speed (config, overrides,
environment, world size, launcher: ``SPEED_ASKED``), or either of whose runs other work on the
machine competed with for its cores (``MachineLoad.busy``), is not judged: its gate is UNMEASURED, a
warning finding names it and why, and the report is INCOMPLETE (never a GO or NO-GO from numbers
that are not comparable, nor advice to bisect the trainer for a change of settings). Records in, typed
comparison out; the report renders it (validation/report.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from validation.errors import StoreError
from validation.judge.asked import Asked
from validation.judge.findings.finding import Facts, Finding, Severity, point_label, where
from validation.judge.gates import GateVerdict, Window
from validation.judge.interval import Interval, interval
from validation.judge.metrics import METRICS
from validation.judge.profile_names import REGRESSION_KEY
from validation.judge.record import PhaseRecord
from validation.store.results import ResultStore, record_key

THROUGHPUT = "toks_per_s_mean"
#: a record's window where its phase's gates name none, in the gates' words
ALL_STEPS = Window().describe()
#: a drop of tokens/s that no gate fails is still named (a note) from half the allowed drop on, and
#: never below this fraction: three runs of one commit on one H100 differed by up to 2.4%
#: (docs/guides/comparing-runs.md, golden loss curves)
NOTED_DROP = 0.05
#: points a note lists one by one; its title counts them all
LISTED = 5
#: what the runbook asked of a run (judge/asked.py) that decides its speed: two runs asked these
#: differently measure the settings, not the trainer (its commit, its steps' window and its
#: repeats are compared on their own)
SPEED_ASKED = ("config", "overrides", "env", "world_size", "launcher")


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    current: float | None
    baseline: float | None

    @property
    def change(self) -> float | None:
        """(current - baseline) / |baseline|, or None when either is missing or the baseline is 0."""
        if self.current is None or self.baseline is None or self.baseline == 0:
            return None
        return (self.current - self.baseline) / abs(self.baseline)


@dataclass(frozen=True)
class PointDelta:
    phase: str
    point: str
    status: str
    baseline_status: str
    metrics: list[MetricDelta]
    regression: GateVerdict | None = None
    """The tokens/s regression gate: PASS/FAIL, or None when not gated (no threshold or no number)."""
    intervals: tuple[Interval, Interval] | None = None
    """Tokens/s over the repeats (current, baseline) where either side was repeated."""
    note: str = ""
    """Why a drop beyond the threshold is no regression (inside the repeats' noise)."""
    finished: bool = True
    """Both sides' processes ran and exited 0 (only such points are gated or noted)."""
    window: str = ALL_STEPS
    """The steps each side's numbers are over (the phase's window: 'last 5 steps'): a gate on another
    window reads other numbers ('loss_drop' over all steps in the gates table, over the last 5 here)."""
    baseline_window: str = ALL_STEPS
    steps: int | None = None
    """Steps each side asked for: where the window is all steps, they are what it is over."""
    baseline_steps: int | None = None
    asked_apart: str = ""
    """How the runbook asked the two runs differently ('override sim.step_s 0.01 here, 0.002 in the
    baseline'), of what decides a run's speed (``SPEED_ASKED``); '' where it asked them alike or a
    side kept no record of it."""
    busy: str = ""
    """Which side ran while other work kept the machine busy, and how busy ('this run: other
    processes used 1.40 of the 2 cores on average (2.00 in use in all, 0.60 by the point's)'); '' where neither did or
    nothing measured it."""

    @property
    def same_steps(self) -> bool:
        """Both sides' windowed numbers are over the same steps: the same window, and, where that is
        all steps, the same steps asked for (the mean of 8 steps weighs a slow first step more than
        that of 20)."""
        return self.window == self.baseline_window and (
            self.window != ALL_STEPS or None in (self.steps, self.baseline_steps) or self.steps == self.baseline_steps)

    @property
    def comparable(self) -> bool:
        """Both sides' numbers say the same of the trainer: over the same steps of runs asked alike
        (a side that other work slowed is bounded, ``_delta``)."""
        return self.same_steps and not self.asked_apart

    def _sides(self) -> tuple[str, str]:
        """The steps this run's and the baseline's windowed numbers are over, in words."""
        if self.window == self.baseline_window == ALL_STEPS and not self.same_steps:
            return f"all {self.steps} steps", f"all {self.baseline_steps} steps"
        return self.window, self.baseline_window

    @property
    def window_text(self) -> str:
        """'last 5 steps', or 'last 5 steps (baseline: last 50 steps)' where the two sides' differ
        ('all 8 steps (baseline: all 20 steps)' where the window is all steps of runs of other lengths)."""
        mine, theirs = self._sides()
        return mine if mine == theirs else f"{mine} (baseline: {theirs})"

    @property
    def not_comparable(self) -> str:
        """Why the two sides' numbers cannot be compared ('' where they can)."""
        mine, theirs = self._sides()
        apart = [f"the runbook asked the runs differently: {self.asked_apart}"] if self.asked_apart else []
        steps = [f"this run's numbers are over {_over(mine)}, the baseline's over {_over(theirs)}"] if mine != theirs else []
        return "; ".join(apart + steps)

    @property
    def toks(self) -> MetricDelta | None:
        return next((m for m in self.metrics if m.metric == THROUGHPUT), None)


def _over(window: str) -> str:
    """'the last 5 steps', 'all 8 steps': a window as the object of 'over'."""
    return window if window.startswith("all ") else f"the {window}"


@dataclass(frozen=True)
class BaselineSource:
    results_dir: str
    commit: str | None
    """This repository's commit at the baseline's runs."""
    date: str
    """When its runs started: the first and last, or the one day."""
    hardware: str
    trainer: str | None = None
    """The runbook's own trainer, when it is not this project's (whose commit is ``commit``)."""
    trainer_commit: str | None = None

    @property
    def short(self) -> str:
        """The commit that ran: the trainer's when it is another project's."""
        # the commit is cut to 12 characters, never the words that stand for a missing one
        if self.trainer is not None:
            return f"{self.trainer} at {self.trainer_commit[:12] if self.trainer_commit else '(commit not recorded)'}"
        return self.commit[:12] if self.commit else "(commit not recorded)"


@dataclass
class Comparison:
    source: BaselineSource
    threshold: float | None
    facts: Facts = Facts()
    """What is true of the current runs (their trainer), for the regression advice."""
    points: list[PointDelta] = field(default_factory=list)
    only_current: list[str] = field(default_factory=list)
    only_baseline: list[str] = field(default_factory=list)

    def regressions(self) -> list[PointDelta]:
        return [p for p in self.points if p.regression == GateVerdict.FAIL]

    def unjudged(self) -> list[PointDelta]:
        """Points whose regression gate could not be judged: their two sides' numbers do not compare
        (``PointDelta.not_comparable``)."""
        return [p for p in self.points if p.regression == GateVerdict.UNMEASURED]

    @property
    def unjudged_why(self) -> str:
        """Why the unjudged points' numbers do not compare, each reason that holds for one of them."""
        unjudged = self.unjudged()
        reasons = [("the runbook asked their runs differently", any(p.asked_apart for p in unjudged)),
                   ("their numbers are over other steps than the baseline's", any(not p.same_steps for p in unjudged)),
                   ("other work kept the machine busy while they ran", any(p.busy for p in unjudged))]
        return ", or ".join(text for text, seen in reasons if seen)

    def unjudged_lines(self) -> list[str]:
        """'run1 [default]: this run's numbers are over the last 3 steps, ...' for the report's status."""
        return [f"{p.phase} [{p.point}]: {p.note}" for p in self.unjudged()]

    @property
    def noted_drop(self) -> float:
        """The drop from which a point no gate fails is noted: half the allowed one, at least NOTED_DROP."""
        return max(NOTED_DROP, self.threshold / 2) if self.threshold is not None else NOTED_DROP

    def slower(self) -> list[PointDelta]:
        """Points whose tokens/s fell by ``noted_drop`` or more without failing the regression gate
        (within the threshold, inside the repeats' noise, or no threshold set), the largest drop first."""
        found = [p for p in self.points if p.finished and p.comparable
                 and p.regression not in (GateVerdict.FAIL, GateVerdict.UNMEASURED)
                 and p.toks is not None and p.toks.change is not None and p.toks.change <= -self.noted_drop]
        return sorted(found, key=lambda p: p.toks.change)

    def findings(self) -> list[Finding]:
        """One critical finding per point whose tokens/s fell more than the threshold, one warning
        naming the points it could not judge (their numbers do not compare), and one note
        naming the points that fell by ``noted_drop`` or more without failing it (no verdict changes)."""
        out = self._slower_note() + self._unjudged_warning()
        for p in self.regressions():
            t = p.toks
            out.append(Finding(Severity.CRITICAL, p.phase, (
                f"tokens/s {-t.change:.1%} below baseline {self.source.short} in {p.phase} [{p.point}]: "
                f"{t.current:,.1f} vs {t.baseline:,.1f} (allowed drop {self.threshold:.0%}, profile {REGRESSION_KEY})"),
                [f"baseline: {self.source.results_dir}, {self.source.hardware}, {self.source.date}"
                 + (f"; this repository at {(self.source.commit or '?')[:12]}" if self.source.trainer else "")]
                + ([p.note] if p.note else []),
                "regression", self.facts))
        return out

    def _unjudged_warning(self) -> list[Finding]:
        unjudged = self.unjudged()
        if not unjudged:
            return []
        phases = list(dict.fromkeys(p.phase for p in unjudged))
        why = self.unjudged_why
        return [Finding(Severity.WARNING, ", ".join(phases), (
            f"tokens/s not compared with baseline {self.source.short} at {len(unjudged)} point(s): "
            f"{why}, so the regression gate ({REGRESSION_KEY}) was not judged"),
            [f"{p.phase} [{p.point}]: {p.note} ({p.toks.current:,.1f} vs {p.toks.baseline:,.1f} toks/s)"
             for p in unjudged], "not_comparable", self.facts)]

    def _slower_note(self) -> list[Finding]:
        slower = self.slower()
        if not slower:
            return []
        allowed = (f"within the allowed drop of {self.threshold:.0%} (profile {REGRESSION_KEY})" if self.threshold
                   is not None else f"not gated: the profile sets no {REGRESSION_KEY}")
        lines = []
        for p in slower[:LISTED]:
            t = p.toks
            share = f", {-t.change / self.threshold:.0%} of the allowed drop" if self.threshold else ""
            lines.append(f"{p.phase} [{p.point}]: {t.current:,.1f} vs {t.baseline:,.1f} toks/s "
                         f"({-t.change:.1%} below{share})" + (f"; {p.note}" if p.note else ""))
        if len(slower) > LISTED:
            lines.append(f"... and {len(slower) - LISTED} more (the comparison table has every point)")
        first = slower[0]
        phases = {p.phase for p in slower}
        return [Finding(Severity.INFO, phases.pop() if len(phases) == 1 else "several", (
            f"tokens/s {self.noted_drop:.0%} or more below baseline {self.source.short} at {len(slower)} point(s), "
            f"{allowed}: the largest {-first.toks.change:.1%} in {first.phase} [{first.point}]"), lines,
            "slower_than_baseline", self.facts)]

    def rows(self) -> list[dict]:
        """Rows for the report's comparison table: one per metric of each point on both sides."""
        rows = []
        for p in self.points:
            for m in p.metrics:
                cur, base = m.current, m.baseline
                if m.metric == THROUGHPUT and p.intervals is not None:
                    cur, base = (i.text() for i in p.intervals)
                windowed = METRICS[m.metric].windowed  # else a count of the whole run's
                change = ("— (asked differently)" if p.asked_apart else "— (other steps)" if windowed and not p.same_steps
                          else "—" if m.change is None else f"{m.change:+.1%}")
                if p.busy and METRICS[m.metric].timing is not None and m.change is not None and p.comparable:
                    change += " (busy machine)"
                rows.append({"phase": p.phase, "point": p.point, "metric": m.metric,
                             "window": p.window_text if windowed else "",  # none: it reads the whole run
                             "current": cur, "baseline": base, "change": change,
                             "flag": _flag(p) if m.metric == THROUGHPUT else ""})
        return rows

    def gate_rows(self) -> list[dict]:
        """Rows for the report's gates table (its columns), one per gated point."""
        return [{"phase": p.phase, "point": p.point, "metric": f"{THROUGHPUT} change vs baseline",
                 "value": p.toks.change if p.comparable else None, "op": ">=",
                 "threshold": f"{-self.threshold:g} ({REGRESSION_KEY})",
                 "window": f"baseline {self.source.short}", "verdict": str(p.regression), "csvs": [],
                 "description": "tokens/s may not drop more than the profile allows against the baseline",
                 "note": p.note or ""}
                for p in self.points if p.regression is not None]


def _flag(p: PointDelta) -> str:
    """The comparison table's mark beside a point's tokens/s: its regression gate failed, was not
    judged (numbers that do not compare), or passed on a drop inside the repeats' noise."""
    if p.regression == GateVerdict.FAIL:
        return "❌"
    if p.regression == GateVerdict.UNMEASURED:
        return "(not judged)"
    return "(inside the noise)" if p.note else ""


def load(baseline_dir: Path, results_dir: Path, runbook: str, profile: str) -> list[PhaseRecord]:
    """The baseline's records of this runbook and profile. A StoreError names a bad store, a
    baseline that is ``results_dir`` itself, and one without records of the pair (a comparison
    that compares nothing, whose regression gate could never fire)."""
    store = ResultStore(baseline_dir)
    if not store.path.is_file():
        raise StoreError(f"--baseline {baseline_dir}: no result store ({store.path} not found)")
    if Path(baseline_dir).resolve() == Path(results_dir).resolve():
        raise StoreError(f"--baseline {baseline_dir} is the results directory itself; give the results "
                         "directory of another run (every point would be compared with itself)")
    records = store.records(runbook, profile)
    if not records:
        held = ", ".join(f"{rb}/{prof}" for rb, prof in store.pairs()) or "no records at all"
        raise StoreError(f"--baseline {baseline_dir}: no records of runbook {runbook}, profile {profile} "
                         f"(it holds: {held})")
    return records


def compare(current: list[PhaseRecord], baseline: list[PhaseRecord], baseline_dir: Path,
            threshold: float | None) -> Comparison:
    """Point-by-point comparison of ``current`` with ``baseline`` (records of one runbook and
    profile), in the current records' order, then the baseline-only points."""
    base = {record_key(r.key): r for r in baseline}
    cur_keys = {record_key(r.key) for r in current}
    out = Comparison(_source(baseline, baseline_dir), threshold, Facts.of(current[0]) if current else Facts())
    for r in current:
        b = base.get(record_key(r.key))
        if b is None:
            out.only_current.append(where(r))
            continue
        mine, theirs = r.metrics.as_dict(), b.metrics.as_dict()
        deltas = [MetricDelta(m, mine[m], theirs[m]) for m in mine if mine[m] is not None or theirs[m] is not None]
        out.points.append(_delta(r, b, deltas, threshold))
    out.only_baseline = [where(b) for k, b in base.items() if k not in cur_keys]
    return out


def _delta(r: PhaseRecord, b: PhaseRecord, deltas: list[MetricDelta], threshold: float | None) -> PointDelta:
    """One point against its baseline twin, with the regression gate's verdict."""
    finished = all(x.ran and x.exit_code == 0 for x in (r, b))
    base = PointDelta(r.phase, point_label(r), str(r.status), str(b.status), deltas, finished=finished,
                      window=r.window, baseline_window=b.window, steps=r.steps, baseline_steps=b.steps,
                      asked_apart=asked_apart(r.asked, b.asked), busy=busy_sides(r, b))
    toks = next((d for d in deltas if d.metric == THROUGHPUT), None)
    if toks is None or toks.current is None or toks.baseline is None:
        return base
    pair = None
    if interval(r) is not None or interval(b) is not None:
        pair = (interval(r) or Interval.of([toks.current]), interval(b) or Interval.of([toks.baseline]))
    base = replace(base, intervals=pair)
    if threshold is None or toks.change is None or not finished:
        return base
    if not base.comparable:  # a drop (or none) between other steps or other settings says nothing of the trainer
        return replace(base, regression=GateVerdict.UNMEASURED, note=base.not_comparable)
    # other work only slows a run: the trainer's own change lies between ratio / slowdown(baseline)
    # (the baseline's trainer up to its load's slowdown faster than it recorded) and ratio *
    # slowdown(this run). A verdict stands only where every change in that range gives it: a busy
    # baseline can hide a drop, and a busy run can make one
    ratio = 1 + toks.change
    if 1 - ratio / _slowdown(b) <= threshold:
        return replace(base, regression=GateVerdict.PASS)
    noise = pair is not None and not pair[0].high < pair[1].low
    if noise and _slowdown(b) <= 1:
        return replace(base, regression=GateVerdict.PASS, note=(
            f"a drop of {-toks.change:.1%} inside the repeats' noise: this run's {pair[0].text()} overlaps the "
            f"baseline's {pair[1].text()}"))
    if 1 - ratio <= threshold or noise:  # only the baseline's load, which b.load holds, stands in the way
        return replace(base, regression=GateVerdict.UNMEASURED, note=(
            f"tokens/s {toks.change:+.1%} against the baseline passes as measured, but the baseline ran beside other "
            f"work ({b.load.describe()}): its trainer may have run up to {_slowdown(b):.1f}x faster than it recorded, which "
            f"could hide a drop beyond the allowed {threshold:.0%}; record the baseline on a quiet machine"))
    if 1 - ratio * _slowdown(r) <= threshold:
        return replace(base, regression=GateVerdict.UNMEASURED, note=(
            f"tokens/s {toks.change:+.1%} against the baseline, within what the load may explain: the machine was busy "
            f"with other work ({base.busy})"))
    busy = (f"it is beyond the allowed drop even had the load slowed this run {_slowdown(r):.1f}x "
            f"({base.busy})") if _slowdown(r) > 1 else ""
    return replace(base, regression=GateVerdict.FAIL, note=busy)


def _slowdown(r: PhaseRecord) -> float:
    """The most other work can have slowed the record's run (1: not busy, or not measured)."""
    return r.load.slowdown if r.load is not None else 1.0


def asked_apart(mine: Asked | None, theirs: Asked | None) -> str:
    """'override sim.step_s 0.01 here, 0.002 in the baseline; world size 2 here, 1 in the baseline':
    how two runs were asked differently, of the fields that decide a run's speed; '' where they were
    asked alike, or either record kept nothing of it (a harness before ``asked``)."""
    if mine is None or theirs is None:
        return ""
    labels = dict(Asked.fields())
    out = []
    for name in SPEED_ASKED:
        a, b = getattr(mine, name), getattr(theirs, name)
        if a is None or b is None or a == b:
            continue
        label = labels[name].label
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{label} {k} {a.get(k, 'unset')} here, {b.get(k, 'unset')} in the baseline"
                    for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
        else:
            out.append(f"{label} {a} here, {b} in the baseline")
    return "; ".join(out)


def busy_sides(mine: PhaseRecord, theirs: PhaseRecord) -> str:
    """'this run: other processes used ...; the baseline: ...': the sides whose run other work
    competed with for the machine's cores; '' where neither's did (or neither's load was measured)."""
    sides = [(label, r.load) for label, r in (("this run", mine), ("the baseline", theirs))]
    return "; ".join(f"{label}: {load.describe()}" for label, load in sides if load is not None and load.busy)


def _source(records: list[PhaseRecord], baseline_dir: Path) -> BaselineSource:
    sha = next((r.git_sha for r in records if r.git_sha), None)
    foreign = next((r for r in records if not r.own_trainer), None)
    trainer_sha = next((r.trainer_sha for r in records if r.trainer_sha and not r.own_trainer), None)
    started = sorted(r.started for r in records if r.started)
    days = sorted({s[:10] for s in started})
    date = "no runs" if not days else days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    hw = next((r.hardware for r in records if r.hardware), None)
    # absolute: the report is read from elsewhere than the directory it was rendered from
    return BaselineSource(str(Path(baseline_dir).resolve()), sha, date,
                          f"{hw.describe()} on {hw.hostname}" if hw else "unknown",
                          foreign.trainer if foreign else None, trainer_sha)
