"""Run phase points against this machine and store their records: the one loop the CLI and the
pytest plugin share. Hardware that cannot run a point gives a SKIP record; a profile/hardware
mismatch (an H100 running the a100 profile) runs and is reported, or skips under policy 'skip'."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

from . import hardware
from .phases import execute, skip_record
from .plan import PhasePoint
from .store import ResultStore

MISMATCH_POLICIES = ("run", "skip")


def why_not(point: PhasePoint, hw: dict[str, Any], mismatch: str = "run") -> str | None:
    """The reason this machine does not run the point, or None when it does."""
    short = hardware.shortfalls(point.profile, hw, point.min_gpus)
    if short:
        return "; ".join(short)
    if mismatch == "skip":
        diff = hardware.mismatches(point.profile, hw)
        if diff:
            return "hardware mismatch (--hardware-mismatch=skip): " + "; ".join(diff)
    return None


def module_missing(point: PhasePoint) -> str | None:
    """The trainer module this point launches, when it cannot be imported here."""
    if point.phase.kind != "train":
        return None
    name = point.phase.launcher.module
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"trainer module {name!r} is not importable"


def run_point(point: PhasePoint, results_dir: Path, *, mismatch: str = "run",
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    hw = hardware.detect()
    reason = why_not(point, hw, mismatch)
    record = skip_record(point, reason, hw) if reason else execute(point, results_dir, hw, progress)
    ResultStore(results_dir).put(record)
    return record
