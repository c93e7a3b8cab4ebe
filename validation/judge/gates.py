"""Gates as data: ``metric <op> threshold`` over a window, evaluated with a fixed operator table.

No expression is ever evaluated: the comparison is looked up in OPS by its symbol, and the
runbook loader refuses any symbol that is not a key of OPS.
"""
from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Window:
    """Which rows of training.csv a metric reads: the last ``last`` steps, or all (None)."""

    last: int | None = None

    def describe(self) -> str:
        return f"last {self.last} steps" if self.last else "all steps"


@dataclass(frozen=True)
class Gate:
    """``metric <op> threshold`` over ``window``. ``threshold_ref`` names a profile key."""

    metric: str
    op: str
    threshold: float | None
    window: Window = Window()
    threshold_ref: str | None = None
    description: str = ""


class GateVerdict(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    NO_DATA = "NO_DATA"
    """The metric could not be computed."""
    UNMEASURED = "UNMEASURED"
    """The profile's threshold is still 'to be measured'."""


@dataclass(frozen=True)
class GateResult:
    metric: str
    op: str
    threshold: float | None
    window: str
    value: float | None
    verdict: GateVerdict
    threshold_ref: str | None = None
    description: str = ""
    note: str = ""
    """What this evaluation found beyond the number (the golden-loss gate's first diverging step)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateResult:
        return cls(data["metric"], data["op"], data["threshold"], data["window"], data["value"],
                   GateVerdict(data["verdict"]), data.get("threshold_ref"), data.get("description") or "",
                   data.get("note") or "")

    def text(self) -> str:
        """'metric = value, needs op threshold (window)', then the note when there is one."""
        val = "no data" if self.value is None else f"{self.value:.4g}"
        return f"{self.metric} = {val}, needs {self.op} {self.threshold:g} ({self.window})" + (
            f": {self.note}" if self.note else "")


def check(value: float | None, op: str, threshold: float | None) -> GateVerdict:
    if threshold is None:
        return GateVerdict.UNMEASURED
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return GateVerdict.NO_DATA
    return GateVerdict.PASS if OPS[op](value, threshold) else GateVerdict.FAIL
