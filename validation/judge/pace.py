"""Who sets the pace of a training step: the GPU, or the host launching its work.

The GPU's busy share is measured by the trainer when the harness asks for a profile
(nsa/train/profile.py writes it into profile.json). Across sweep points, the harness itself fits
``fit_step_time``: step time against tokens per step, fitted as
  ``fixed + per_token * tokens``. When both parts are positive beyond their noise and the fixed
  part is most of the step even at the largest point, step time barely grows with work: the
  host, not the GPU, sets the pace. A fit whose parts are not both meaningful says nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: a sweep is host-bound when the fitted fixed cost is at least this share of the step time at
#: its largest point
HOST_BOUND_FIXED_SHARE = 0.5
#: and its points span at least this ratio of tokens per step (a flat fit over a narrow range
#: says nothing)
MIN_TOKEN_RANGE = 2.0


#: a fitted coefficient is meaningful when it is positive by at least this many standard errors
#: (a fit over points timed on a shared machine can give a negative cost per token: noise)
MIN_T = 2.0


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
    tokens, steps = np.array([t for t, _ in pts]), np.array([s for _, s in pts])
    design = np.column_stack([np.ones_like(tokens), tokens])
    (fixed, per_token), *_ = np.linalg.lstsq(design, steps, rcond=None)
    residual = steps - design @ np.array([fixed, per_token])
    variance = float(residual @ residual) / (len(pts) - 2)
    fixed_se, per_token_se = np.sqrt(np.diag(variance * np.linalg.inv(design.T @ design)))
    return StepTimeFit(float(fixed), float(per_token), tuple(tokens.tolist()), tuple(steps.tolist()),
                       float(fixed_se), float(per_token_se))
