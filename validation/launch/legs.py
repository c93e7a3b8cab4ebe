"""The three processes of a resume point, and how each trainer is told to stop and to resume.

``reference`` runs all of the phase's steps uninterrupted; ``first`` runs the same command but
stops after ``resume_after`` steps, leaving a checkpoint (its schedule still spans every step);
``second`` resumes from the first half's output directory for the rest, writing into its own.
This project's trainer takes both as config keys (``train.run_steps``, ``train.resume``); a
runbook's own trainer as its ``trainer.resume`` entry says (validation/runbook/trainer_spec.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from validation.contract.adapters import ADAPTERS
from validation.runbook.plan import PhasePoint
from validation.runbook.types import Delivery, Phase, ResumeSpec, Scalar

#: this project's trainer: stop after N steps (checkpointing), and resume from a run directory
OWN_STOP_AFTER = "train.run_steps"
OWN_RESUME_FROM = "train.resume"


@dataclass(frozen=True)
class Leg:
    name: str
    """Its directory inside the point's run directory."""
    label: str
    steps_expected: int
    """The last step the harness asks it to complete."""
    stop_after: int | None = None
    resume_from: Path | None = None
    """The directory it resumes from (set once the first half has run)."""

    def resuming(self, directory: Path) -> Leg:
        return replace(self, resume_from=directory)


def legs(phase: Phase) -> tuple[Leg, Leg, Leg]:
    n, total = phase.resume_after, phase.steps
    return (Leg("reference", f"uninterrupted run (steps 1-{total})", total),
            Leg("first", f"first half (steps 1-{n}, stopped)", n, stop_after=n),
            Leg("second", f"resumed second half (steps {n + 1}-{total})", total))


def resume_source(point: PhasePoint, first_out: Path) -> Path:
    """Where the second half resumes from: the first half's output directory as its trainer wrote
    it (a runbook trainer with an adapter writes into a directory of its own inside it)."""
    spec = point.runbook.trainer
    return first_out if spec is None else ADAPTERS[spec.adapter].trainer_dir(first_out)


def own_overrides(leg: Leg | None) -> dict[str, Scalar]:
    """The config keys that stop or resume this project's trainer."""
    if leg is None:
        return {}
    out: dict[str, Scalar] = {}
    if leg.stop_after is not None:
        out[OWN_STOP_AFTER] = leg.stop_after
    if leg.resume_from is not None:
        out[OWN_RESUME_FROM] = str(leg.resume_from)
    return out


def foreign_sets(spec: ResumeSpec | None, leg: Leg | None) -> list[tuple[Delivery, str]]:
    """The values that stop or resume a runbook's trainer, each with how it reaches it."""
    if leg is None or spec is None:
        return []
    out = []
    if leg.stop_after is not None:
        out.append((spec.stop_after, str(leg.stop_after)))
    if leg.resume_from is not None:
        out.append((spec.resume_from, str(leg.resume_from)))
    return out
