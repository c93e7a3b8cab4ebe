"""The profile thresholds the harness reads by name itself, beside the ones a runbook's gates name
(``threshold: {profile: min_toks_per_s}``, any name the profile defines). A gate's name that the
profile lacks is an error when the runbook loads; one of these misspelt would be read by nothing,
and its rule would quietly fall back to its default or to none (``max_toks_regresion: 0.05`` gated
no baseline comparison at all), so a near miss of one is refused (validation/runbook/load.py)."""
from __future__ import annotations

from dataclasses import dataclass

from validation.judge.findings.long_context import MIN_SPEEDUP_KEY
from validation.judge.resume import RTOL_KEY as RESUME_RTOL
from validation.judge.stability import PROFILE_KEYS as STABILITY_KEYS

#: the largest allowed fractional drop of tokens/s against a baseline (store/baseline.py)
REGRESSION_KEY = "max_toks_regression"
#: the golden-loss gate's tolerance (store/goldens.py)
GOLDEN_RTOL = "golden_loss_rtol"

HARNESS_READ: tuple[str, ...] = (REGRESSION_KEY, GOLDEN_RTOL, RESUME_RTOL, MIN_SPEEDUP_KEY, *STABILITY_KEYS)


@dataclass(frozen=True)
class Bounds:
    """The values a threshold the harness reads can take: one outside them would change what its
    rule means rather than how strict it is (a drop fraction of 5, meant as 5%, allows any drop)."""

    low: float
    high: float = float("inf")
    low_open: bool = False
    """Whether ``low`` itself is outside."""
    high_open: bool = True
    """Whether ``high`` itself is outside."""
    meaning: str = ""

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def text(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}"
        high = "" if self.high == float("inf") else f" and {'<' if self.high_open else '<='} {self.high:g}"
        return low + high + (f" ({self.meaning})" if self.meaning else "")


#: the range of each threshold above with one (the stability rule's keys check their own,
#: judge/stability.py); the profile loader refuses a value outside it, naming the key
BOUNDS: dict[str, Bounds] = {
    REGRESSION_KEY: Bounds(0.0, 1.0, meaning="a fraction of the baseline's tokens/s: 0.05 allows a 5% drop"),
    GOLDEN_RTOL: Bounds(0.0, meaning="a relative difference of the loss: 1.0e-4, or 0 for the same digits"),
    RESUME_RTOL: Bounds(0.0, meaning="a relative difference of loss and learning rate: 1.0e-4, or 0 for the same"),
    MIN_SPEEDUP_KEY: Bounds(0.0, low_open=True, meaning="NSA's tokens/s over dense's at the longest length"),
}
