"""Loss and grad-norm spikes, NaN-free divergence, and tokens/s that fell and stayed down, found
in a run's training.csv.

A spike is a logged step whose value lies far above the steps just before it: its robust z-score
against the rolling median of the previous ``window`` logged steps, with the median absolute
deviation (MAD, times 1.4826, the normal's consistency constant; at least 1% of the median) as the
scale, exceeds ``z``. Only
steps with a full window of finite history are scored, so the first steps of a run, where the
loss legitimately jumps about, are never called spikes; only upward deviations count (a loss
that falls faster than its neighbours is no problem). A spike carries the consecutive logged
steps around it whose values lie above the same limit, scored or not: where they are several, the
value rose at the first of them and stayed up (``Shape``), and the step scored is only where the
rule first saw it, often the first step with a full window after a level shift that began earlier.

Divergence is a loss that rises without going NaN: the median loss of ``diverge_window`` logged
steps lies more than ``diverge_rise`` nats above the lowest median of an earlier, disjoint window
of the same length. Medians make one spike too little to call a run diverging. That window is
where the rule sees the rise, not where it began: its first steps may be the run's lowest. The
rise began after the last step at or below the lowest level the loss held (the lowest median of
a window that ends before the rule's window does), within that window.

A slowdown is tokens/s that fell and did not come back: the run's logged steps split in two where
one step change fits them best (least absolute deviation from each part's median), and the later
part's median below SLOWDOWN_FRACTION of the earlier's. The later part runs to the end of the run, so
a dip the run recovered from is none, and a slow first step or two (a compile) makes the earlier
part slower, never a slowdown.

The profile sets the rule (``spike_window``, ``spike_z``, ``diverge_window``, ``diverge_rise``);
a key it lacks, or sets null, takes the default below.
"""
from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

#: the normal distribution's MAD-to-stdev factor: the robust z-score of Gaussian noise is its z-score
MAD_SCALE = 1.4826
#: the scale never falls below this share of the rolling median: a history that clusters tightly
#: (a loss flat on random data, where half the steps agree to 3 digits) has a MAD far below its
#: real noise, and would make a wiggle of 0.6% a "spike"; with it a spike lies at least spike_z per
#: cent above the median (6% by default)
MIN_SCALE = 0.01
#: the later part's median tokens/s below this share of the earlier's is a slowdown
SLOWDOWN_FRACTION = 0.7
#: logged steps each part of a slowdown needs at least
SLOWDOWN_MIN_STEPS = 5
#: split points tried at most (evenly spaced): a run of thousands of logged steps stays quick
SLOWDOWN_SPLITS = 200
#: profile keys of the rule, each a field of StabilityRule
PROFILE_KEYS = {"spike_window": "window", "spike_z": "z", "diverge_window": "diverge_window",
                "diverge_rise": "diverge_rise"}


@dataclass(frozen=True)
class StabilityRule:
    window: int = 20
    """Logged steps before a step that it is scored against (profile ``spike_window``)."""
    z: float = 6.0
    """Robust z-score above which a step is a spike (profile ``spike_z``): Gaussian noise
    exceeds 6 about once in a billion steps."""
    diverge_window: int = 20
    """Logged steps whose median loss is compared (profile ``diverge_window``)."""
    diverge_rise: float = 0.2
    """Nats by which a window's median loss may lie above the lowest earlier window's (profile
    ``diverge_rise``)."""

    @classmethod
    def of(cls, thresholds: Mapping[str, float | None]) -> StabilityRule:
        """The rule a profile's thresholds set, defaults for the keys it does not."""
        out = {name: float(thresholds[key]) for key, name in PROFILE_KEYS.items() if thresholds.get(key) is not None}
        for key in ("spike_window", "diverge_window"):
            n = out.get(PROFILE_KEYS[key])
            if n is not None and (n < 1 or not n.is_integer()):
                raise ValueError(f"{key} must be a whole number of logged steps >= 1, got {n:g}")
        for key in ("spike_z", "diverge_rise"):
            if out.get(PROFILE_KEYS[key], 1.0) <= 0:
                raise ValueError(f"{key} must be > 0, got {out[PROFILE_KEYS[key]]:g}")
        return cls(**{k: int(v) if k.endswith("window") else v for k, v in out.items()})


class Shape(enum.StrEnum):
    """How long a spike's value stayed up: what its finding calls it and the advice it gets."""

    STEP = "spike"
    """It alone lies above its limit: one step, a bad batch or a numerical accident."""
    RISE = "rise"
    """The consecutive logged steps around it lie above its limit too, and a later step came back
    below: the value rose for a while, not for one step."""
    SHIFT = "level shift"
    """The consecutive logged steps around it lie above its limit up to the run's last logged step:
    the value rose and stayed there, something changed at the first of them."""


@dataclass(frozen=True)
class Spike:
    """A scored step far above the steps before it, and the consecutive logged steps around it
    that lie above the same limit (scored or not: the first ``window`` steps of a run are never
    scored): a level shift that began before the first step scored is found at that step, and
    only ``first_step`` says where the rise began."""

    column: str
    """The training.csv column: loss or grad_norm."""
    step: int
    value: float
    median: float
    """The rolling median of the window before the step."""
    z: float
    limit: float
    """The rule's z it exceeds."""
    first_step: int | None = None
    """The first of the consecutive logged steps up to it whose values all lie above ``bar``: where
    the rise began. None in a record of an older harness, which kept the step alone."""
    last_step: int | None = None
    """The last of the consecutive logged steps from it whose values all lie above ``bar``."""
    bar: float | None = None
    """The value above which a step lies at robust z ``limit`` of this step's window: its median
    plus ``limit`` times its scale."""
    to_end: bool = False
    """``last_step`` is the run's last logged step: the value had not come back down."""
    first_scored: int | None = None
    """The run's first step with a full window of history before it: no step before it is scored."""

    @property
    def began(self) -> int:
        return self.step if self.first_step is None else self.first_step

    @property
    def ended(self) -> int:
        return self.step if self.last_step is None else self.last_step

    @property
    def shape(self) -> Shape:
        if self.began == self.ended:
            return Shape.STEP
        return Shape.SHIFT if self.to_end else Shape.RISE

    def text(self) -> str:
        return (f"step {self.step}: {self.value:.4g} against a rolling median of {self.median:.4g} "
                f"(robust z {self.z:.3g} > {self.limit:g})")

    def event_text(self, began: str = "") -> str:
        """What happened, from where it began (``began``: what else is known of that step): 'at step
        45: ...' of a one-step spike; of one that lasted, 'from step 7 to the run's last logged step,
        12: every logged step lies above 1.331, the limit of step 11's window (a level shift, not a
        one-step spike); step 11: ...; the steps before step 11 are not scored (...)'."""
        if self.shape == Shape.STEP:
            return f"at {self.text()}"
        began = f" ({began})" if began else ""
        if self.shape == Shape.SHIFT:
            span, back = f"to the run's last logged step, {self.ended}", ""
        else:
            span, back = f"to step {self.ended}", ", and the next logged step came back below it"
        unscored = ""
        if self.first_scored is not None and self.began < self.first_scored:
            unscored = (f"; the steps before step {self.first_scored} are not scored (fewer logged steps before them "
                        "than the spike window)")
        return (f"from step {self.began}{began} {span}: every logged step lies above {self.bar:.4g}, the limit of "
                f"step {self.step}'s window{back} (a {self.shape}, not a one-step spike); {self.text()}{unscored}")


def events(found: Sequence[Spike]) -> list[Spike]:
    """The spikes of one column that are not the same rise as an earlier one: a rise that lasted
    has each of its scored steps above its limit found, and the first found stands for it."""
    out: list[Spike] = []
    for s in sorted(found, key=lambda s: s.step):
        if out and s.began <= out[-1].ended:
            continue
        out.append(s)
    return out


@dataclass(frozen=True)
class Rise:
    """The first window whose median loss lies more than the rule's rise above an earlier one's."""

    first_step: int
    last_step: int
    median: float
    low_first_step: int
    low_last_step: int
    low: float
    """The lowest median of an earlier, disjoint window."""
    allowed: float
    """The rule's rise in nats that it exceeds."""
    began: int | None = None
    """The step the climb began (the module's docstring): the logged step after ``held_to``; None in
    records of older harnesses."""
    held_to: int | None = None
    """The last step at or below ``level`` before the climb."""
    level: float | None = None
    """The lowest level the loss held: the lowest median of a window that ends before this one does."""
    window: int | None = None
    """The rule's window, in logged steps."""

    @property
    def nats(self) -> float:
        return self.median - self.low

    def text(self) -> str:
        return (f"median loss {self.median:.4g} over steps {self.first_step}-{self.last_step}, {self.nats:.3g} nats "
                f"above {self.low:.4g} over steps {self.low_first_step}-{self.low_last_step} "
                f"(allowed rise {self.allowed:g} nats)")

    def start_text(self) -> str:
        """'from step 22 (after step 21, its last at or below 4.521, the lowest median of 10 logged
        steps)'; of a record that does not say where the climb began, its window's first step."""
        if self.began is None or self.level is None:
            return f"from step {self.first_step}"
        return (f"from step {self.began} (after step {self.held_to}, its last at or below {self.level:.4g}, the "
                f"lowest median of {self.window} logged steps)")


def _finite(steps: Sequence[int], values: Sequence[float]) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]


def spikes(steps: Sequence[int], values: Sequence[float], rule: StabilityRule, column: str) -> list[Spike]:
    """Every logged step of ``column`` whose robust z-score against the previous ``rule.window``
    finite values exceeds ``rule.z``."""
    rows = _finite(steps, values)
    out = []
    for i in range(rule.window, len(rows)):
        history = [v for _, v in rows[i - rule.window:i]]
        median = statistics.median(history)
        mad = statistics.median(abs(v - median) for v in history)
        scale = max(MAD_SCALE * mad, MIN_SCALE * abs(median), 1e-12)
        step, value = rows[i]
        z = (value - median) / scale
        if z > rule.z:
            bar = median + rule.z * scale
            lo, hi = i, i
            while lo > 0 and rows[lo - 1][1] > bar:
                lo -= 1
            while hi + 1 < len(rows) and rows[hi + 1][1] > bar:
                hi += 1
            out.append(Spike(column, step, value, median, z, rule.z, rows[lo][0], rows[hi][0], bar,
                             hi == len(rows) - 1, rows[rule.window][0]))
    return out


def rise(steps: Sequence[int], loss: Sequence[float], rule: StabilityRule) -> Rise | None:
    """The first window of ``rule.diverge_window`` logged finite losses whose median lies more
    than ``rule.diverge_rise`` nats above the lowest median of a window that ended before it
    began; None when there is none (or too few steps for two windows)."""
    rows = _finite(steps, loss)
    w = rule.diverge_window
    medians = [(rows[i][0], rows[i + w - 1][0], statistics.median(v for _, v in rows[i:i + w]))
               for i in range(len(rows) - w + 1)]
    low: tuple[int, int, float] | None = None
    for i in range(w, len(medians)):
        earlier = medians[i - w]  # the window that ends right before this one starts
        if low is None or earlier[2] < low[2]:
            low = earlier
        first, last, median = medians[i]
        if median - low[2] > rule.diverge_rise:
            held = min(range(i), key=lambda k: medians[k][2])  # the lowest level, in a window ending before i's
            level = medians[held][2]
            at = max(k for k in range(held, held + w) if rows[k][1] <= level)
            return Rise(first, last, median, low[0], low[1], low[2], rule.diverge_rise,
                        began=rows[at + 1][0], held_to=rows[at][0], level=level, window=w)
    return None



@dataclass(frozen=True)
class Slowdown:
    """Tokens/s that fell and stayed down: the median after the split against the median before."""

    first_step: int
    last_step: int
    median: float
    before_first_step: int
    before_last_step: int
    before: float

    def text(self) -> str:
        return (f"median {self.median:,.0f} tokens/s over steps {self.first_step}-{self.last_step}, "
                f"{self.median / self.before:.2f}x the {self.before:,.0f} of steps {self.before_first_step}-"
                f"{self.before_last_step}")


def slowdown(steps: Sequence[int], toks: Sequence[float]) -> Slowdown | None:
    """The step change of tokens/s that fits the logged steps best (see the module docstring), when
    the later part's median is below SLOWDOWN_FRACTION of the earlier's; else None."""
    rows = _finite(steps, toks)
    n = len(rows)
    if n < 2 * SLOWDOWN_MIN_STEPS:
        return None
    values = [v for _, v in rows]
    stride = max(1, (n - 2 * SLOWDOWN_MIN_STEPS) // SLOWDOWN_SPLITS)

    def cost(part: list[float]) -> float:
        m = statistics.median(part)
        return sum(abs(v - m) for v in part)

    k = min(range(SLOWDOWN_MIN_STEPS, n - SLOWDOWN_MIN_STEPS + 1, stride),
            key=lambda i: cost(values[:i]) + cost(values[i:]))
    before, after = statistics.median(values[:k]), statistics.median(values[k:])
    if before <= 0 or after >= SLOWDOWN_FRACTION * before:
        return None
    return Slowdown(rows[k][0], rows[-1][0], after, rows[0][0], rows[k - 1][0], before)


@dataclass(frozen=True)
class Curve:
    """What a run's whole training.csv says of how it trained, by the profile's rule."""

    spikes: tuple[Spike, ...] = ()
    """Loss and grad-norm spikes."""
    divergence: Rise | None = None
    slowdown: Slowdown | None = None
    nonfinite_step: int | None = None
    """The first step whose logged loss is not finite (None: every logged loss is)."""


def curve(csv, rule: StabilityRule) -> Curve:
    """``Curve`` of a training.csv as read (a DataFrame with step, loss, toks_per_s and maybe
    grad_norm columns); an empty Curve where there is none."""
    if csv is None:
        return Curve()
    steps = csv["step"].tolist()
    found = tuple(s for col in ("loss", "grad_norm") if col in csv for s in spikes(steps, csv[col].tolist(), rule, col))
    return Curve(found, rise(steps, csv["loss"].tolist(), rule), slowdown(steps, csv["toks_per_s"].tolist()),
                 first_nonfinite(csv))


class LossAfter(enum.StrEnum):
    """What training.csv logs after its first non-finite loss."""

    RECOVERED = "recovered"
    """The losses logged after the last non-finite one, to the CSV's last step, are finite: the
    weights did not keep non-finite values (a non-finite one makes every later loss so)."""
    STAYED = "stayed"
    """Every loss logged from the first non-finite one to the CSV's last step is not finite."""
    RECURRED = "recurred"
    """Finite losses were logged between non-finite ones, and the CSV's last logged loss is not finite."""


@dataclass(frozen=True)
class NonFinite:
    """training.csv's losses that are not finite (nan, inf): where the first and the last are, and
    what the steps after the first show."""

    first_step: int
    last_step: int
    """The last step whose logged loss is not finite."""
    count: int
    """Logged steps whose loss is not finite."""
    end_step: int
    """The CSV's last logged step."""
    logged_from: int
    """Logged steps from ``first_step`` to ``end_step``, both included."""

    @property
    def after(self) -> LossAfter:
        if self.last_step < self.end_step:
            return LossAfter.RECOVERED
        return LossAfter.STAYED if self.count == self.logged_from else LossAfter.RECURRED

    def text(self) -> str:
        """'first non-finite loss logged at step 5, the only one: the losses logged after it, to step
        12, are finite'."""
        head = f"first non-finite loss logged at step {self.first_step}"
        if self.after == LossAfter.RECOVERED:
            which = "the only one" if self.count == 1 else f"{self.count} in all, the last at step {self.last_step}"
            return f"{head}, {which}: the losses logged after it, to step {self.end_step}, are finite"
        if self.after == LossAfter.STAYED:
            return (f"{head}, the last logged step" if self.first_step == self.end_step else
                    f"{head}: every loss logged from it to step {self.end_step} is non-finite")
        return (f"{head}, {self.count} in all, the last at step {self.end_step}, the last logged step: finite losses "
                "logged between them")


def nonfinite(csv) -> NonFinite | None:
    """``NonFinite`` of a training.csv as read; None where every logged loss is finite, or there is
    no CSV."""
    if csv is None:
        return None
    rows = list(zip(csv["step"].tolist(), csv["loss"].tolist()))
    bad = [i for i, (_, v) in enumerate(rows) if not math.isfinite(v)]
    if not bad:
        return None
    return NonFinite(int(rows[bad[0]][0]), int(rows[bad[-1]][0]), len(bad), int(rows[-1][0]), len(rows) - bad[0])


def first_nonfinite(csv) -> int | None:
    """The first step of a training.csv as read whose logged loss is not finite; None where every
    logged loss is, or there is no CSV."""
    found = nonfinite(csv)
    return None if found is None else found.first_step
