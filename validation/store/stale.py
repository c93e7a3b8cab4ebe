"""Stored records judged against the runbook as it is now, where it matters: a record whose run was
asked for other steps, another config, other overrides, another environment or another world size
than the runbook's point asks now is no result of that point (a stored 6-step GO is no 60-step
GO). Such a point counts as not run (INCOMPLETE, never GO): the report names each key that
changed, its value at the run and now, and the command that re-runs only that point. Its stored
verdict, whatever it was, is no verdict of the point the runbook asks for now.

A passed point whose runbook now asks a gate its run was not asked (a new metric, another
window) is not run either: nothing stored can pass that gate (a changed threshold is re-checked
from the stored value instead, thresholds.py).

Records keep what was asked (judge/asked.py). Of records of older harnesses, which kept none,
what they kept is read: their steps (not of a resume point that failed: it stores its failed
half's), their overrides, and their world size where below the runbook's (env.json's world, which
a record keeps, is never below the processes launched, and may be above them).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from validation.judge.asked import Asked
from validation.judge.gates import rule
from validation.judge.record import TRAINER_KINDS, PhaseRecord, Status
from validation.runbook.plan import PhasePoint


class Key(enum.StrEnum):
    """A key of the runbook whose value decides what a point's result means."""

    STEPS = "steps"
    CONFIG = "config"
    OVERRIDE = "override"
    ENV = "env"
    WORLD_SIZE = "world size"
    GATE = "gate"
    """A gate the runbook asks now that the run did not evaluate (a new metric, another window): no
    stored value to re-check it by (a changed threshold is re-checked, thresholds.py)."""


@dataclass(frozen=True)
class Change:
    key: Key
    stored: str
    """The value at the run ('unset': the run had none)."""
    now: str
    """The value the runbook's point has now."""
    name: str = ""
    """The override or variable (OVERRIDE, ENV)."""

    def text(self) -> str:
        what = f"{self.key} {self.name}" if self.name else str(self.key)
        return f"{what} {self.stored} at the run, {self.now} in the runbook now"


@dataclass(frozen=True)
class Outdated:
    """A stored record of a point the runbook now asks something else of."""

    record: PhaseRecord
    changes: tuple[Change, ...]

    def text(self) -> str:
        return "; ".join(c.text() for c in self.changes)


def changes(rec: PhaseRecord, point: PhasePoint) -> tuple[Change, ...]:
    """What the runbook's ``point`` asks now that ``rec``'s run was not asked (none of a SKIP:
    nothing ran; the hardware that skipped it is checked when the point runs)."""
    if rec.status == Status.SKIP:
        return ()
    return (*_asked(rec, point), *_new_gates(rec, point))


def _new_gates(rec: PhaseRecord, point: PhasePoint) -> list[Change]:
    """Of a passed point: the gates it would have to pass now that its run was not asked to (a
    failed point is no GO whatever they say; a record that kept no gates cannot tell)."""
    then = rec.asked.gates if rec.asked is not None else None
    if rec.status != Status.PASS or then is None:
        return []
    return [Change(Key.GATE, "not asked", f"{rule(g.op, g.threshold)} ({g.window.describe()})", g.metric)
            for g in point.gates() if Asked.gate_key(g) not in then]


def _asked(rec: PhaseRecord, point: PhasePoint) -> tuple[Change, ...]:
    now = Asked.of(point, TRAINER_KINDS)
    then = rec.asked
    if then is None:
        return _older(rec, now)
    out = []
    if then.steps != now.steps:
        out.append(Change(Key.STEPS, _v(then.steps), _v(now.steps)))
    if then.config != now.config:
        out.append(Change(Key.CONFIG, then.config or "unset", now.config or "unset"))
    out += _mapping(Key.OVERRIDE, then.overrides, now.overrides)
    out += _mapping(Key.ENV, then.env, now.env)
    if then.world_size != now.world_size:
        out.append(Change(Key.WORLD_SIZE, str(then.world_size), str(now.world_size)))
    return tuple(out)


def _older(rec: PhaseRecord, now: Asked) -> tuple[Change, ...]:
    out = []
    if rec.kind in TRAINER_KINDS and not (rec.kind == "resume" and rec.failed) and rec.steps != now.steps:
        out.append(Change(Key.STEPS, _v(rec.steps), _v(now.steps)))
    out += _mapping(Key.OVERRIDE, rec.overrides, now.overrides)
    if rec.world_size < now.world_size:
        out.append(Change(Key.WORLD_SIZE, str(rec.world_size), str(now.world_size)))
    return tuple(out)


def _mapping(key: Key, then: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    return [Change(key, _v(then.get(k)), _v(now.get(k)), k) for k in sorted(set(then) | set(now))
            if then.get(k) != now.get(k) or (k in then) != (k in now)]


def _v(value: Any) -> str:
    return "unset" if value is None else str(value)


def split(records: Iterable[PhaseRecord], points: Iterable[PhasePoint]) -> tuple[list[PhaseRecord], list[Outdated]]:
    """``records`` (of the runbook's points) whose runs are of the points as the runbook asks them
    now, in their order, and those that are not."""
    by_id = {p.test_id: p for p in points}
    current, outdated = [], []
    for r in records:
        point = by_id.get(r.test_id)
        found = changes(r, point) if point is not None else ()
        if found:
            outdated.append(Outdated(r, found))
        else:
            current.append(r)
    return current, outdated
