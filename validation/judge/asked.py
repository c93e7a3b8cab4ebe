"""What the runbook asked of a point when it ran: the keys that decide what its result means.

A record is judged by the runbook as it is when the report is written (validation/store/stale.py):
a stored run of 6 steps is no result of a point that now asks for 60, nor one run with other
overrides, config, environment or world size. The record keeps what was asked, so that the
comparison needs no guess from what the run left (its ``world_size`` is env.json's, which may
exceed the processes launched; a resume point that failed stores its failed half's steps).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Asked:
    steps: int | None = None
    """The phase's steps (None: a phase kind that runs no trainer)."""
    config: str = ""
    overrides: dict[str, Scalar] = field(default_factory=dict)
    """The phase's overrides and the sweep point's parameters."""
    env: dict[str, str] = field(default_factory=dict)
    """The environment the runbook set for the point (the phase's, the sweep's env.* parameters)."""
    world_size: int = 1
    """The processes the launcher was asked for, every node's together."""
    gates: tuple[str, ...] | None = None
    """Each gate the run was asked to pass, as its metric and window (gate_key); a changed threshold
    is re-checked from the stored value (store/thresholds.py), a gate not here has none. None: a
    record of a harness that kept none."""

    @staticmethod
    def gate_key(gate: Any) -> str:
        """'toks_per_s_mean (last 5 steps)' of a judge.gates.Gate: what a stored value means."""
        return f"{gate.metric} ({gate.window.describe()})"

    @classmethod
    def of(cls, point: Any, trainer_kinds: tuple[str, ...]) -> Asked:
        """What ``point`` (a runbook.plan.PhasePoint) asks, as a record keeps it."""
        return cls(point.phase.steps if point.phase.kind in trainer_kinds else None, point.phase.config,
                   dict(point.overrides), dict(point.env), point.nproc,
                   tuple(sorted(cls.gate_key(g) for g in point.gates())))

    @classmethod
    def from_json(cls, data: Any) -> Asked | None:
        """A stored ``asked`` mapping; None in records of harnesses that kept none."""
        if not isinstance(data, dict):
            return None
        steps, gates = data.get("steps"), data.get("gates")
        return cls(int(steps) if steps is not None else None, str(data.get("config") or ""),
                   dict(data.get("overrides") or {}), {str(k): str(v) for k, v in (data.get("env") or {}).items()},
                   int(data.get("world_size") or 1), tuple(map(str, gates)) if gates is not None else None)
