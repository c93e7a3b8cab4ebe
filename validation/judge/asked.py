"""What the runbook asked of a point when it ran: the keys that decide what its result means.

A record is judged by the runbook as it is when the report is written (validation/store/stale.py):
a stored run of 6 steps is no result of a point that now asks for 60, nor one run with other
overrides, config, environment or world size, another trainer or launcher, fewer repeats, another
resume step, or (where they may have ended it or may end it now) other time allowances. The record
keeps what was asked, so that the comparison needs no guess from what the run left (its
``world_size`` is env.json's, which may exceed the processes launched; a resume point that failed
stores its failed half's steps).

Each field names the runbook key it keeps (``Kept``): the comparison reads that key's ``Stale``
rule from its declaration (validation/runbook/schema.py, a layer above this one, so the rule is
not named here). Every field marked ``optional`` was added
after the first of these records: None is a record of a harness that did not keep it, and is not
compared (never a change made up from a key nobody kept).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable


Scalar = str | int | float | bool

_KEPT = "asked_key"

#: what a point (a runbook.plan.PhasePoint) asks of a field, given whether its kind runs a trainer
Ask = Callable[[Any, bool], Any]


@dataclass(frozen=True)
class Kept:
    """What a field of ``Asked`` keeps, and how the staleness check compares it."""

    key: str
    """The dotted runbook key of a phase whose declared ``Stale`` rule compares it ('': none, the
    ``trainer:`` entry; store/stale.py gives its rule)."""
    label: str
    """The word the report names a change of it by."""
    ask: Ask
    load: Callable[[Any], Any]
    """A stored value (not None) as the field holds it."""
    optional: bool = True
    """None is not kept (a key added after the first records), never compared."""
    kinds: tuple[str, ...] = ()
    """Compared only where the run's kind and the point's are one of these (none: every kind)."""
    also: tuple[str, ...] = ()
    """More keys it keeps, each declared with ``key``'s rule."""
    read_now: bool = False
    """What the point asks is read from outside the runbook (a file's contents): None now is
    unknown (the file unreadable here), never a change."""


def kept(key: str, ask: Ask, load: Callable[[Any], Any], *, label: str = "", default: Any = None,
         factory: Any = None, optional: bool = True, kinds: tuple[str, ...] = (), also: tuple[str, ...] = (),
         read_now: bool = False) -> Any:
    meta = {_KEPT: Kept(key, label or key, ask, load, optional, kinds, also, read_now)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _strings(v: Any) -> dict[str, str] | None:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else None


def _gate_keys(point: Any, _: bool) -> tuple[str, ...]:
    return tuple(sorted(Asked.gate_key(g) for g in point.gates()))


def _join_timeout(point: Any, runs_trainer: bool) -> float | None:
    rdzv = point.phase.launcher.rdzv if runs_trainer else None
    return rdzv.join_timeout_s if rdzv is not None else None


@dataclass(frozen=True)
class Asked:
    steps: int | None = kept("steps", lambda p, t: p.phase.steps if t else None, int, optional=False)
    """The phase's steps (None: a phase kind that runs no trainer)."""
    config: str = kept("config", lambda p, t: p.phase.config, str, default="", optional=False)
    overrides: dict[str, Scalar] = kept("overrides", lambda p, t: dict(p.overrides), dict, label="override",
                                        factory=dict, optional=False)
    """The phase's overrides and the sweep point's parameters."""
    env: dict[str, str] = kept("env", lambda p, t: dict(p.env), _strings, factory=dict, optional=False)
    """The environment the runbook set for the point (the phase's, the sweep's env.* parameters)."""
    world_size: int = kept("launcher", lambda p, t: p.nproc, int, label="world size", default=1, optional=False)
    """The processes the launcher was asked for, every node's together."""
    gates: tuple[str, ...] | None = kept("gates", _gate_keys, lambda v: tuple(map(str, v)), label="gate")
    """Each gate the run was asked to pass, as its metric and window (gate_key); a changed threshold
    is re-checked from the stored value (store/thresholds.py), a gate not here has none. None: a
    record of a harness that kept none."""
    launcher: dict[str, str] | None = kept("launcher", lambda p, t: p.launcher_asked() if t else None, _strings)
    """How the trainer was launched apart from its world size: kind, nodes, torchrun_args,
    srun_args, those without a value left out (points that run a trainer; None for others)."""
    trainer: dict[str, str] | None = kept("", lambda p, t: p.trainer_asked() if t else None, _strings,
                                          label="trainer")
    """The trainer the runbook named, as it launches it: this project's module, or a ``trainer:``
    entry's root, entry, args, deliveries, env, adapter and the metrics it cannot provide of the
    point's gates (points that run a trainer; None for others)."""
    pytest: dict[str, str] | None = kept("tests", lambda p, t: p.pytest_asked() if p.phase.kind == "pytest" else None,
                                         _strings, label="pytest", also=("pytest_args",))
    """A pytest point's tests and pytest_args (None for other kinds)."""
    repeats: int | None = kept("repeats", lambda p, t: p.phase.repeats, int, kinds=("train",))
    """Runs of the point (the phase's ``repeats``)."""
    resume_after: int | None = kept("resume_after", lambda p, t: p.phase.resume_after, int, kinds=("resume",))
    """The step after which a resume point's first half stopped (0: not a resume phase)."""
    golden_steps: int | None = kept("golden_steps", lambda p, t: p.phase.golden_steps, int)
    """Steps compared with the golden curve (0: none)."""
    stall_s: float | None = kept("stall_s", lambda p, t: p.phase.stall_after_s if t else None, float)
    """The stall allowance in force (the phase's stall_s, else its default): points that run a
    trainer (None for others: nothing watched them)."""
    startup_s: float | None = kept("startup_s", lambda p, t: p.phase.startup_after_s if t else None, float)
    """The allowance before the first step in force (startup_s, else the stall allowance)."""
    join_timeout_s: float | None = kept("launcher.rdzv.join_timeout_s", _join_timeout, float)
    """The rendezvous's join timeout of a launch of several nodes (None: no rendezvous)."""
    config_digest: str | None = kept("config", lambda p, t: p.config_digest() if t else None, str,
                                     label="config file (name, SHA-256)", read_now=True)
    """What the config file the trainer reads held (runbook.plan.PhasePoint.config_digest): a file
    edited since the run, under the same name, asks another run. None: no file, or not kept."""

    @staticmethod
    def fields() -> tuple[tuple[str, Kept], ...]:
        """Each field's name and what it keeps, in declaration order."""
        return tuple((f.name, f.metadata[_KEPT]) for f in dataclasses.fields(Asked))

    @staticmethod
    def gate_key(gate: Any) -> str:
        """'toks_per_s_mean (last 5 steps)' of a judge.gates.Gate: what a stored value means."""
        return f"{gate.metric} ({gate.window.describe()})"

    @staticmethod
    def gate_parts(key: str) -> tuple[str, str]:
        """The metric and the window of a ``gate_key``: 'toks_per_s_mean (last 5 steps)' ->
        ('toks_per_s_mean', 'last 5 steps')."""
        metric, _, window = key.partition(" (")
        return metric, window[:-1]

    @classmethod
    def of(cls, point: Any, trainer_kinds: tuple[str, ...]) -> Asked:
        """What ``point`` (a runbook.plan.PhasePoint) asks, as a record keeps it."""
        runs_trainer = point.phase.kind in trainer_kinds
        return cls(**{name: k.ask(point, runs_trainer) for name, k in cls.fields()})

    @classmethod
    def from_json(cls, data: Any) -> Asked | None:
        """A stored ``asked`` mapping; None in records of harnesses that kept none. A key it lacks
        (or, of the first keys, stores empty) takes the field's default: None (not kept) for every
        optional one."""
        if not isinstance(data, dict):
            return None
        values = {name: k.load(data[name]) for name, k in cls.fields()
                  if (data.get(name) is not None if k.optional else data.get(name))}
        return cls(**values)
