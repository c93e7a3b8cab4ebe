"""Confidence intervals over a point's repeats: the mean of a metric over its repeated runs with a
two-sided Student t-interval (the runs' standard deviation over the square root of their number,
times the t quantile of n - 1 degrees of freedom), and the rule the findings and the baseline
comparison share: two settings are told apart only when their intervals do not overlap.

The t quantile is computed here (the regularized incomplete beta function by its continued
fraction, then bisection): the harness does not depend on SciPy for one number.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from validation.judge.record import PhaseRecord

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    half: float
    """Half its width: the interval is mean - half .. mean + half."""
    n: int
    """Runs it is over (1: a single run, an interval of no width)."""

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    @classmethod
    def of(cls, values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
        n = len(values)
        mean = statistics.fmean(values)
        if n < 2:
            return cls(mean, 0.0, n)
        return cls(mean, t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n), n)

    def separates(self, other: Interval) -> bool:
        """Whether the two intervals do not overlap."""
        return self.high < other.low or other.high < self.low

    def text(self, unit: str = "") -> str:
        if self.n < 2:
            return f"{self.mean:,.1f}{unit} (one run)"
        return (f"{self.mean:,.1f} ± {self.half:,.1f}{unit} ({CONFIDENCE:.0%} CI {self.low:,.1f}-{self.high:,.1f} over "
                f"{self.n} runs)")


def repeat_values(rec: PhaseRecord, metric: str) -> list[float]:
    """The metric's value in each repeat of a repeated train point (none for other points)."""
    if rec.kind != "train":
        return []
    values = (getattr(s.metrics, metric) for s in rec.runs)
    return [v for v in values if v is not None]


def interval(rec: PhaseRecord, metric: str = "toks_per_s_mean") -> Interval | None:
    """The metric's t-interval over the point's repeats; None without at least two."""
    values = repeat_values(rec, metric)
    return Interval.of(values) if len(values) >= 2 else None


def t_quantile(p: float, df: int) -> float:
    """The p quantile (0.5 < p < 1) of Student's t distribution with ``df`` degrees of freedom."""
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0."""
    return 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h
