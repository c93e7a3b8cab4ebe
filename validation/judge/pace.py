"""Who sets the pace of a training step: the GPU, or the host launching its work.

Within a profiled run: the trainer leaves, beside its profile.json, the profiled window and
every device activity interval in it (gpu_timeline.json.gz); ``device_idle`` computes from them
the GPU's busy share, which the harness gates on (the trainer's own figure in profile.json must
agree with it), and where the rest went: gaps of LONG_GAP_US and more are the host pausing the
GPU (a host sync, an optimizer's launches, loading data), shorter ones the latency between
launches. Across sweep points, the harness itself fits
``fit_step_time``: step time against tokens per step, fitted as
  ``fixed + per_token * tokens``. When both parts are positive beyond their noise and the fixed
  part is most of the step even at the largest point, step time barely grows with work: the
  host, not the GPU, sets the pace. A fit whose parts are not both meaningful says nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

#: a sweep is host-bound when the fitted fixed cost is at least this share of the step time at
#: its largest point
HOST_BOUND_FIXED_SHARE = 0.5
#: and its points span at least this ratio of tokens per step (a flat fit over a narrow range
#: says nothing)
MIN_TOKEN_RANGE = 2.0


#: a fitted coefficient is meaningful when it is positive by at least this many standard errors
#: (a fit over points timed on a shared machine can give a negative cost per token: noise)
MIN_T = 2.0
#: an idle gap of the GPU this long or longer is the host pausing it (see the module docstring)
LONG_GAP_US = 1000.0


@dataclass(frozen=True)
class DeviceIdle:
    """A profiled window's device activity, from its intervals: the busy share of the window,
    and the idle time a profiled step in gaps of LONG_GAP_US and more (``host_pause_ms``) and in
    shorter ones (``launch_gap_ms``), with the longest gap."""

    busy_frac: float
    host_pause_ms: float
    launch_gap_ms: float
    longest_gap_ms: float


def idle_gaps(intervals: Sequence[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    """(start, length) of each stretch of ``window`` that no interval covers, in order: the
    intervals (start, end) clipped to the window, overlapping work (several streams) counted
    once; the idle time before the first and after the last interval included."""
    lo, hi = window
    if hi <= lo:
        raise ValueError(f"empty window {window}")
    gaps, end = [], lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi and e > s):
        if s > end:
            gaps.append((end, s - end))
        end = max(end, e)
    if hi > end:
        gaps.append((end, hi - end))
    return gaps


def device_idle(intervals: Sequence[tuple[float, float]], window: tuple[float, float], steps: int) -> DeviceIdle:
    """The DeviceIdle of ``intervals`` (start, end, microseconds) over ``window`` (see
    idle_gaps), ``steps`` profiled steps (at least 1)."""
    if steps < 1:
        raise ValueError(f"{steps} profiled steps")
    lo, hi = window
    gaps = [g for _, g in idle_gaps(intervals, window)] or [0.0]
    long = sum(g for g in gaps if g >= LONG_GAP_US)
    return DeviceIdle(busy_frac=1.0 - sum(gaps) / (hi - lo), host_pause_ms=long / 1e3 / steps,
                      launch_gap_ms=(sum(gaps) - long) / 1e3 / steps, longest_gap_ms=max(gaps) / 1e3)


@dataclass(frozen=True)
class StepTimeFit:
    """step_s ~= fixed_s + per_token_s * tokens, least squares over the sweep's points, with the
    standard error of each coefficient (from the residuals)."""

    fixed_s: float
    per_token_s: float
    tokens: tuple[float, ...]
    step_s: tuple[float, ...]
    fixed_se: float = 0.0
    per_token_se: float = 0.0

    @property
    def token_range(self) -> float:
        return max(self.tokens) / min(self.tokens)

    @property
    def meaningful(self) -> bool:
        """Both a fixed cost and a cost per token that are positive beyond their noise: a step
        that fits this model. A negative or noise-sized coefficient says the points do not."""
        return (self.fixed_s > MIN_T * self.fixed_se and self.fixed_s > 0
                and self.per_token_s > MIN_T * self.per_token_se and self.per_token_s > 0)

    @property
    def fixed_share(self) -> float:
        """The fixed cost's share of the fitted step time at the largest point (0 to 1, for a
        meaningful fit: both coefficients positive)."""
        return self.fixed_s / (self.fixed_s + self.per_token_s * max(self.tokens))

    @property
    def host_bound(self) -> bool:
        return self.meaningful and self.token_range >= MIN_TOKEN_RANGE and self.fixed_share >= HOST_BOUND_FIXED_SHARE


def fit_step_time(points: Sequence[tuple[float, float]]) -> StepTimeFit | None:
    """Fit (tokens per step, step seconds) points; None with fewer than 3 points or fewer than
    2 distinct token counts."""
    pts = [(float(t), float(s)) for t, s in points if t > 0 and s > 0]
    if len(pts) < 3 or len({t for t, _ in pts}) < 2:
        return None
    import numpy as np  # here, not at the top: every findings import (the CLI's start) would pay for it

    tokens, steps = np.array([t for t, _ in pts]), np.array([s for _, s in pts])
    design = np.column_stack([np.ones_like(tokens), tokens])
    (fixed, per_token), *_ = np.linalg.lstsq(design, steps, rcond=None)
    residual = steps - design @ np.array([fixed, per_token])
    variance = float(residual @ residual) / (len(pts) - 2)
    fixed_se, per_token_se = np.sqrt(np.diag(variance * np.linalg.inv(design.T @ design)))
    return StepTimeFit(float(fixed), float(per_token), tuple(tokens.tolist()), tuple(steps.tolist()),
                       float(fixed_se), float(per_token_se))
