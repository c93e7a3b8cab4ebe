"""The three processes of a resume point, and how each trainer is told to stop and to resume.

``reference`` runs all of the phase's steps uninterrupted; ``first`` runs the same command but
stops after ``resume_after`` steps, leaving a checkpoint (its schedule still spans every step);
``second`` resumes from the first half's output directory for the rest, writing into its own.
This project's trainer takes both as config keys (``train.run_steps``, ``train.resume``:
launch/kinds.py); a runbook's own trainer as its ``trainer.resume`` entry says (launch/foreign.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from validation.contract.adapters import ADAPTERS
from validation.runbook.plan import PhasePoint
from validation.runbook.types import Phase

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
