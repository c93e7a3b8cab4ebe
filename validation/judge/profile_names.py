"""The profile thresholds the harness reads by name itself, beside the ones a runbook's gates name
(``threshold: {profile: min_toks_per_s}``, any name the profile defines). A gate's name that the
profile lacks is an error when the runbook loads; one of these misspelt would be read by nothing,
and its rule would quietly fall back to its default or to none (``max_toks_regresion: 0.05`` gated
no baseline comparison at all), so a near miss of one is refused (validation/runbook/load.py)."""
from __future__ import annotations

from validation.judge.findings.long_context import MIN_SPEEDUP_KEY
from validation.judge.resume import RTOL_KEY as RESUME_RTOL
from validation.judge.stability import PROFILE_KEYS as STABILITY_KEYS

#: the largest allowed fractional drop of tokens/s against a baseline (store/baseline.py)
REGRESSION_KEY = "max_toks_regression"
#: the golden-loss gate's tolerance (store/goldens.py)
GOLDEN_RTOL = "golden_loss_rtol"

HARNESS_READ: tuple[str, ...] = (REGRESSION_KEY, GOLDEN_RTOL, RESUME_RTOL, MIN_SPEEDUP_KEY, *STABILITY_KEYS)
