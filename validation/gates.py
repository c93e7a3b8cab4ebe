"""Gates as data: ``metric <op> threshold`` over a window, evaluated with a fixed operator table.

No expression is ever evaluated: the comparison is looked up in OPS by its symbol, and the
runbook loader refuses any symbol that is not a key of OPS.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}

PASS, FAIL, NO_DATA, UNMEASURED = "PASS", "FAIL", "NO_DATA", "UNMEASURED"


@dataclass(frozen=True)
class GateResult:
    metric: str
    op: str
    threshold: float | None
    window: str
    value: float | None
    verdict: str
    """PASS, FAIL, NO_DATA (the metric could not be computed) or UNMEASURED (the profile's
    threshold is still 'to be measured')."""
    threshold_ref: str | None = None
    description: str = ""


def check(value: float | None, op: str, threshold: float | None) -> str:
    if threshold is None:
        return UNMEASURED
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NO_DATA
    return PASS if OPS[op](value, threshold) else FAIL
