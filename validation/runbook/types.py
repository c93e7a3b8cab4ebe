"""Runbook, hardware-profile and trainer-entry types: what validation/runbook/load.py and
trainer_spec.py read from YAML."""
from __future__ import annotations

import enum
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from validation import PROFILE_DIR, REPO_ROOT, RUNBOOK_DIR
from validation.errors import RunbookError
from validation.judge.gates import Gate

Scalar = str | int | float | bool
#: a phase without its own stall_s stalls after timeout_s / STALL_SHARE without progress
STALL_SHARE = 4


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's c10d rendezvous of a launch of several nodes (one torchrun agent per node)."""

    join_timeout_s: float
    """How long an agent waits for the others to join (torchrun's ``join_timeout``): a node that
    never joins is found this long after the first agent started, not at the phase timeout."""
    endpoint: str = ""
    """``host:port`` of the store (kind torchrun: a loopback host, every agent runs here; port 0:
    a free port chosen at launch); '' under Slurm: the allocation's first node."""
    port: int | None = None
    """Slurm: the store's port on the first node; None: derived from the job id at launch."""


@dataclass(frozen=True)
class Launcher:
    """``python -m <module>``; ``torchrun --standalone --nproc_per_node=N -m <module>``, or with
    ``nnodes`` > 1 one torchrun agent per node on this host, meeting at ``rdzv``; or ``srun`` of
    torchrun in a Slurm allocation (kind slurm: ``nnodes`` nodes, one agent each).
    ``torchrun_args`` pass options through to a single node's torchrun and replace --standalone."""

    kind: str = "python"
    nproc: int = 1
    """Processes per node."""
    module: str = "nsa.train"
    torchrun_args: tuple[str, ...] = ()
    nnodes: int = 1
    rdzv: Rendezvous | None = None
    """Set for several nodes (torchrun) and for Slurm."""
    srun_args: tuple[str, ...] = ()
    """Slurm: srun options of the site (partition, account, time, GPUs), passed as they are."""

    @property
    def world_size(self) -> int:
        """Processes of the run, all nodes together."""
        return self.nnodes * self.nproc if self.kind in ("torchrun", "slurm") else 1

    @property
    def nodes(self) -> bool:
        """Whether the run is launched as nodes meeting at a rendezvous (several agents, or Slurm)."""
        return self.rdzv is not None


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
    stall_s: float | None = None
    """Train phases: no new step (heartbeats, training CSV) for this long is a stall, and the
    harness takes every rank's stack and kills the run; counted from the launch, so it must
    cover the trainer's start-up. None: a quarter of timeout_s (``stall_after_s``)."""
    startup_s: float | None = None
    """Phases that run the trainer: the time allowed before its first step (imports, model build,
    compilation, graph capture), after which no step is a stall too. None: ``stall_s``."""
    sweep: Mapping[str, tuple[Scalar, ...]] = field(default_factory=dict)
    gates: tuple[Gate, ...] = ()
    tests: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    min_gpus: int = 0
    golden_steps: int = 0
    """Compare the loss of steps 1..N with the golden curve (validation/store/goldens.py); 0: no golden."""
    profile_steps: int = 0
    """Profile phases: steps the trainer profiles once steady (the harness asks through the
    contract's CONTRACT_PROFILE_STEPS); ``steps`` is the whole run, warm-up included."""
    resume_after: int = 0
    """Resume phases: the first half stops after this many of ``steps`` (checkpointing), the
    second resumes from it for the rest; both are compared with an uninterrupted run of ``steps``."""
    repeats: int = 1
    """Train phases: runs of each point, judged one by one and reported as a mean with a
    confidence interval (validation/judge/interval.py)."""

    @property
    def stall_after_s(self) -> float:
        """The stall time in force: the phase's ``stall_s``, else a quarter of its timeout."""
        return self.stall_s if self.stall_s is not None else self.timeout_s / STALL_SHARE

    @property
    def startup_after_s(self) -> float:
        """The time in force before the first step: ``startup_s``, else the stall time."""
        return self.startup_s if self.startup_s is not None else self.stall_after_s

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
    peak_bf16_tflops: float | None = None
    """One device's dense bf16 peak, TFLOP/s (the vendor's number, without sparsity): what mfu
    divides by. None: mfu is UNMEASURED on this profile."""

    @property
    def peak_flops(self) -> float | None:
        """peak_bf16_tflops in FLOP/s."""
        return None if self.peak_bf16_tflops is None else self.peak_bf16_tflops * 1e12


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


class Via(enum.StrEnum):
    """How one value reaches the trainer."""

    FLAG = "flag"      # appended to the command line: FLAG VALUE
    ENV = "env"        # an environment variable
    CONFIG = "config"  # a dotted key set in the per-point copy of its YAML config


@dataclass(frozen=True)
class Delivery:
    via: Via
    name: str
    """The flag (--steps), the variable (CONFIG) or the dotted config key (train.steps)."""


@dataclass(frozen=True)
class ConfigFile:
    template: str
    """The trainer's YAML config, relative to its root; copied per point with keys set."""
    pass_as: Delivery | None
    """How the copy's path reaches the trainer (flag or env); None when args use {config}."""


@dataclass(frozen=True)
class RootDir:
    env: str | None = None
    """An environment variable the user sets to the trainer's checkout."""
    path: str | None = None
    """Or a directory relative to this repository."""

    def describe(self) -> str:
        return f"${self.env}" if self.env else str(self.path)

    def resolve(self) -> tuple[Path | None, str]:
        """(the root, '') or (None, why not)."""
        if self.env:
            value = os.environ.get(self.env, "")
            if not value:
                return None, f"the trainer's root is not set: export {self.env}=/path/to/its/checkout"
            root = Path(value).expanduser()
            if not root.is_absolute():
                root = Path.cwd() / root
        else:
            root = REPO_ROOT / str(self.path)
        if not root.is_dir():
            return None, f"the trainer's root {root} ({self.describe()}) is not a directory"
        return root.resolve(), ""


@dataclass(frozen=True)
class ResumeSpec:
    """How a runbook's trainer is stopped after N steps of its schedule and resumed (the resume
    phase's first and second halves)."""

    stop_after: Delivery
    """Receives N: train the first N steps of the whole run (its schedule spans all of them),
    leave a checkpoint and exit 0."""
    resume_from: Delivery
    """Receives the first half's output directory: continue from its checkpoint, writing into
    this run's own output directory."""


@dataclass(frozen=True)
class TrainerSpec:
    name: str
    root: RootDir
    entry: tuple[str, ...]
    """['-m', module] or [script path relative to root]."""
    args: tuple[str, ...] = ()
    config: ConfigFile | None = None
    steps: Delivery | None = None
    out_dir: Delivery | None = None
    params: Mapping[str, Delivery] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    adapter: str = "native"
    phases: tuple[str, ...] = ("train",)
    metrics: tuple[str, ...] | None = None
    """Metrics it provides; None: every metric its adapter's files allow."""
    resume: ResumeSpec | None = None
    """How it stops and resumes (resume phases); None: it does not say, and resume phases SKIP."""
    tokens_per_step: tuple[str | int, ...] | None = None
    """One rank's tokens per optimizer step as factors: params keys (the point's override values)
    and integers; None: the runbook does not say."""

    def supports_phase(self, kind: str) -> bool:
        return kind in self.phases
