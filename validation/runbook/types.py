"""Runbook and hardware-profile types: what validation/runbook.py reads from YAML."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from validation import PROFILE_DIR, RUNBOOK_DIR
from validation.errors import RunbookError
from validation.judge.gates import Gate

if TYPE_CHECKING:
    from validation.runbook.trainer_spec import TrainerSpec

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Launcher:
    """``python -m <module>`` or ``torchrun --standalone --nproc_per_node=N -m <module>``.
    ``torchrun_args`` pass rendezvous options through (multi-node) and replace --standalone."""

    kind: str = "python"
    nproc: int = 1
    module: str = "nsa.train"
    torchrun_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Phase:
    name: str
    kind: str
    description: str = ""
    markers: tuple[str, ...] = ()
    launcher: Launcher = Launcher()
    config: str = "tiny"
    overrides: Mapping[str, Scalar] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    steps: int = 20
    timeout_s: float = 600.0
    sweep: Mapping[str, tuple[Scalar, ...]] = field(default_factory=dict)
    gates: tuple[Gate, ...] = ()
    tests: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    min_gpus: int = 0
    golden_steps: int = 0
    """Compare the loss of steps 1..N with the golden curve (validation/store/goldens.py); 0: no golden."""

    def points(self) -> list[dict[str, Scalar]]:
        """The sweep's cartesian product in YAML order ([{}] without a sweep)."""
        if not self.sweep:
            return [{}]
        keys = list(self.sweep)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.sweep[k] for k in keys))]


@dataclass(frozen=True)
class Runbook:
    name: str
    path: Path
    description: str
    source: str
    profiles: tuple[str, ...]
    phases: tuple[Phase, ...]
    max_parallel: int = 1
    """How many untimed points (pytest, preflight) may run at once; timed points (train,
    profile) always run alone, so no two timings share the machine (plan.batches)."""
    trainer: TrainerSpec | None = None
    """The trainer its train phases launch; None: this project's own (python -m nsa.train)."""

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise RunbookError(f"{self.path}: no phase {name!r}; phases: {', '.join(p.name for p in self.phases)}")

    @property
    def cli_name(self) -> str:
        """How a command line names it: its name when it is runbooks/<name>.yaml, else its absolute path."""
        return _cli_name(self.name, self.path, RUNBOOK_DIR)


@dataclass(frozen=True)
class Hardware:
    accelerator: str = "cpu"
    min_gpus: int = 0
    min_gpu_mem_gb: float = 0.0
    gpu_name: str | None = None
    """Substring expected in the GPU name (e.g. 'A100'); a mismatch is reported, or skipped
    with --hardware-mismatch=skip."""


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    marker: str
    description: str
    hardware: Hardware
    thresholds: Mapping[str, float | None]
    notes: str = ""

    @property
    def cli_name(self) -> str:
        """How a command line names it: its name when it is runbooks/profiles/<name>.yaml, else its
        absolute path."""
        return _cli_name(self.name, self.path, PROFILE_DIR)


def _cli_name(name: str, path: Path, directory: Path) -> str:
    resolved = Path(path).resolve()  # absolute: a command printed here works from any directory
    return name if resolved == (directory / f"{name}.yaml").resolve() else str(resolved)
