"""What the runbook asked of a point when it ran: the keys that decide what its result means.

A record is judged by the runbook as it is when the report is written (validation/store/stale.py):
a stored run of 6 steps is no result of a point that now asks for 60, nor one run with other
overrides, config, environment or world size, another trainer or launcher, fewer repeats, another
resume step, or (where they may have ended it or may end it now) other time allowances. The record
keeps what was asked, so that the comparison needs no guess from what the run left (its
``world_size`` is env.json's, which may exceed the processes launched; a resume point that failed
stores its failed half's steps).

Every key added after the first of these records is optional: None is a record of a harness that
did not keep it, and is not compared (never a change made up from a key nobody kept).
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
    repeats: int | None = None
    """Runs of the point (the phase's ``repeats``)."""
    resume_after: int | None = None
    """The step after which a resume point's first half stopped (0: not a resume phase)."""
    golden_steps: int | None = None
    """Steps compared with the golden curve (0: none)."""
    stall_s: float | None = None
    """The stall allowance in force (the phase's stall_s, else its default): points that run a
    trainer (None for others: nothing watched them)."""
    startup_s: float | None = None
    """The allowance before the first step in force (startup_s, else the stall allowance)."""
    join_timeout_s: float | None = None
    """The rendezvous's join timeout of a launch of several nodes (None: no rendezvous)."""
    launcher: dict[str, str] | None = None
    """How the trainer was launched apart from its world size: kind, nodes, torchrun_args,
    srun_args, those without a value left out (points that run a trainer; None for others)."""
    trainer: dict[str, str] | None = None
    """The trainer the runbook named, as it launches it: this project's module, or a ``trainer:``
    entry's root, entry, args, deliveries, env, adapter and the metrics it cannot provide of the
    point's gates (points that run a trainer; None for others)."""
    pytest: dict[str, str] | None = None
    """A pytest point's tests and pytest_args (None for other kinds)."""

    @staticmethod
    def gate_key(gate: Any) -> str:
        """'toks_per_s_mean (last 5 steps)' of a judge.gates.Gate: what a stored value means."""
        return f"{gate.metric} ({gate.window.describe()})"

    @classmethod
    def of(cls, point: Any, trainer_kinds: tuple[str, ...]) -> Asked:
        """What ``point`` (a runbook.plan.PhasePoint) asks, as a record keeps it."""
        phase = point.phase
        runs_trainer = phase.kind in trainer_kinds
        rdzv = phase.launcher.rdzv if runs_trainer else None
        return cls(phase.steps if runs_trainer else None, phase.config, dict(point.overrides), dict(point.env),
                   point.nproc, tuple(sorted(cls.gate_key(g) for g in point.gates())),
                   repeats=phase.repeats, resume_after=phase.resume_after, golden_steps=phase.golden_steps,
                   stall_s=phase.stall_after_s if runs_trainer else None,
                   startup_s=phase.startup_after_s if runs_trainer else None,
                   join_timeout_s=rdzv.join_timeout_s if rdzv is not None else None,
                   launcher=point.launcher_asked() if runs_trainer else None,
                   trainer=point.trainer_asked() if runs_trainer else None,
                   pytest=point.pytest_asked() if phase.kind == "pytest" else None)

    @classmethod
    def from_json(cls, data: Any) -> Asked | None:
        """A stored ``asked`` mapping; None in records of harnesses that kept none. A key it lacks
        is None (not kept), never its default."""
        if not isinstance(data, dict):
            return None
        steps, gates = data.get("steps"), data.get("gates")
        return cls(int(steps) if steps is not None else None, str(data.get("config") or ""),
                   dict(data.get("overrides") or {}), {str(k): str(v) for k, v in (data.get("env") or {}).items()},
                   int(data.get("world_size") or 1), tuple(map(str, gates)) if gates is not None else None,
                   repeats=_int(data.get("repeats")), resume_after=_int(data.get("resume_after")),
                   golden_steps=_int(data.get("golden_steps")), stall_s=_num(data.get("stall_s")),
                   startup_s=_num(data.get("startup_s")), join_timeout_s=_num(data.get("join_timeout_s")),
                   launcher=_strings(data.get("launcher")), trainer=_strings(data.get("trainer")),
                   pytest=_strings(data.get("pytest")))


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _strings(v: Any) -> dict[str, str] | None:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else None
