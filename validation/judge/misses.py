"""What a point that runs no trainer (a pytest or preflight point) failed to do, in its own terms.

Such a point has no output contract: its errors are never a trainer's broken file. Each way it
can fail is typed here where it is found (validation/launch/kinds.py), kept in the record, and
read by the findings and their advice (validation/judge/findings/checks.py), so that neither has
to parse the error's text."""
from __future__ import annotations

import enum


class Miss(enum.StrEnum):
    TEST_PATHS = "test_paths"
    """A path the pytest phase's ``tests`` names is not in this repository's checkout."""
    JUNIT = "junit"
    """pytest wrote no JUnit XML (or one that cannot be read), so no test outcome was counted."""
    GIT_SHA = "git_sha"
    """Preflight: ``git describe`` failed and no SOURCE_SHA stamp names the commit."""
    COLLECT_ENV = "collect_env"
    """Preflight: ``python -m torch.utils.collect_env`` failed or wrote nothing."""
    NVIDIA_SMI = "nvidia_smi"
    """Preflight of a CUDA profile: nvidia-smi is not installed, failed or wrote nothing."""
    TIMED_OUT = "timed_out"
    """Preflight: a command (git describe, collect_env, nvidia-smi) ran past its time and was killed;
    recorded instead of that item's own miss (it did not fail: it did not finish)."""


#: pytest's own exit codes other than 0 and 1 (tests failed): it could not run the tests as asked
PYTEST_EXIT = {2: "pytest was interrupted", 3: "pytest hit an internal error",
               4: "pytest could not run the tests as asked (a usage error, or a test path not found)",
               5: "pytest collected no tests (the phase's tests and -k/-m select none)"}


def pytest_ended(exit_code: int) -> str:
    """What a pytest point's non-zero exit code says: its tests failed (1), pytest could not run
    them (2-5), or the process was killed by a signal (negative)."""
    if exit_code < 0:
        return f"pytest was killed by signal {-exit_code}"
    return PYTEST_EXIT.get(exit_code, "tests failed")
