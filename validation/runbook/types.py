"""Runbook, hardware-profile and trainer-entry types: what validation/runbook/load.py and
trainer_spec.py read from YAML."""
from __future__ import annotations

import enum
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from nsa.contract import PROFILE_STEPS_ENV
from validation import PROFILE_DIR, REPO_ROOT, RUNBOOK_DIR
from validation.errors import RunbookError
from validation.judge.gates import Gate
from validation.runbook.schema import MODULE, NAME, TEXT_ONLY, Limit, Stale, key

Scalar = str | int | float | bool
PHASE_KINDS = ("train", "preflight", "pytest", "profile", "resume")
ACCELERATORS = ("cuda", "cpu")
#: a phase without its own stall allowance stalls after timeout_s / STALL_SHARE without progress
STALL_SHARE = 4



def sweep_part(key: str, value: Scalar) -> str:
    """'lr=0.001': how a sweep point names one of its parameters in its id and its directory (the
    key's last part, the value as text, characters unsafe in a path or a pytest id as '_')."""
    return re.sub(r"[^A-Za-z0-9_.=,-]", "_", f"{key.split('.')[-1]}={value}")

@dataclass(frozen=True)
class Rendezvous:
    """torchrun's c10d rendezvous of a launch of several nodes (one torchrun agent per node)."""

    join_timeout_s: float = key(meaning="seconds the nodes wait for each other", required=True, minimum=1.0,
                                stale=Stale.ALLOWANCE, limit=Limit.JOIN)
    """How long an agent waits for the others to join (torchrun's ``join_timeout``): a node that
    never joins is found this long after the first agent started, not at the phase timeout."""
    endpoint: str = key("", meaning="torchrun: host:port on this host (localhost or 127.x; port 0: a free one at "
                                    "launch)", stale=Stale.NEVER, note="where the agents meet")
    """'' under Slurm: the allocation's first node."""
    port: int | None = key(None, meaning="slurm: the port on the first node (default: from the job id, "
                                         "20000-28999)", minimum=1, stale=Stale.NEVER, note="where the agents meet")
    """None: derived from the job id at launch."""


@dataclass(frozen=True)
class Launcher:
    """``python -m <module>``; ``torchrun --standalone --nproc_per_node=N -m <module>``, or with
    ``nnodes`` > 1 one torchrun agent per node on this host, meeting at ``rdzv``; or ``srun`` of
    torchrun in a Slurm allocation (kind slurm: ``nnodes`` nodes, one agent each).
    ``torchrun_args`` pass options through to torchrun: a single node's replace --standalone, and
    with ``nnodes`` or under Slurm every agent gets them beside the rendezvous's options."""

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
    """One phase of a runbook. Each field made by ``key`` is a key of ``phases[]`` (and, with
    ``defaults=``, of ``defaults:``), declared once here (validation/runbook/schema.py)."""

    name: str = key(meaning="the phase's name; it is a pytest marker too (`pytest -m NAME`)", required=True,
                    pattern=NAME, stale=Stale.NEVER, note="another name is another point")
    kind: str = key(meaning="train (the trainer), profile (a train run asked for profile.json), resume (an "
                            "uninterrupted run against one stopped and resumed from its checkpoint), pytest (this "
                            "project's own tests) or preflight (git SHA, collect_env, nvidia-smi)",
                    required=True, choices=PHASE_KINDS, stale=Stale.EXACT)
    description: str = key("", meaning="one line for people", empty=TEXT_ONLY, stale=Stale.NEVER,
                           note="text for people")
    markers: tuple[str, ...] = key((), meaning="more pytest markers, each registered in pytest.ini",
                                   stale=Stale.NEVER, note="pytest's selection, not what runs")
    launcher: Launcher = key(Launcher(), meaning="how the trainer starts: python, or torchrun with nproc processes",
                             defaults="see `phases[].launcher`", stale=Stale.EXACT,
                             note="its kind, nodes and options passed through; the processes it asks for (world "
                                  "size); not the rendezvous's endpoint and port (where the agents meet)")
    config: str = key("tiny", meaning="this project's trainer: a preset name, or the name of a YAML file in the "
                                      "checkout (the trainer runs there and reads it from there)", pattern=MODULE,
                      defaults="see `phases[].config`", stale=Stale.EXACT,
                      note="its name and its file's contents")
    overrides: Mapping[str, Scalar] = key(
        factory=dict, meaning="dotted config keys of the trainer (checked against its --list-keys, or a runbook "
                              "trainer's params), and their values (checked by its --check-config where it answers "
                              "it: this project's trainer does)",
        defaults="dotted config keys and values, merged under each phase's own", stale=Stale.EXACT,
        note="with the sweep point's parameters")
    env: Mapping[str, str] = key(
        factory=dict, meaning="environment variables (names starting NSA_, NCCL_, TORCH_, PYTORCH_, CUDA_, OMP_, MKL_, "
                              "TRITON_, or CONFIG)",
        defaults="environment variables, merged under each phase's own", stale=Stale.EXACT,
        note="with the sweep point's env.* parameters")
    steps: int = key(20, meaning="optimizer steps the trainer is asked for; a run that completes fewer is a FAIL",
                     minimum=1, defaults="see `phases[].steps`", stale=Stale.EXACT)
    timeout_s: float = key(600.0, meaning="hard limit of the point in seconds: the harness takes stacks, kills the "
                                          "tree, records FAIL",
                           minimum=1.0, defaults="see `phases[].timeout_s`", stale=Stale.ALLOWANCE, limit=Limit.RUN)
    stall_s: float | None = key(
        None, meaning="train and profile phases: no new step for this long after the first is a stall (stacks of every "
                "rank, the tree killed, FAIL), and so is a rank whose heartbeats show no new step for this long while "
                "another rank's go past it; default a quarter of timeout_s",
        minimum=1.0, defaults="see `phases[].stall_s`", stale=Stale.ALLOWANCE, limit=Limit.QUIET)
    """Counted from the launch, so it must cover the trainer's start-up; None: ``stall_after_s``."""
    startup_s: float | None = key(
        None, meaning="train and profile phases: the stall allowance until a first step is done (imports, "
                "compilation, graph capture: records of step 1 begun do not end it); default stall_s",
        minimum=1.0, defaults="see `phases[].startup_s`", stale=Stale.ALLOWANCE, limit=Limit.START)
    """None: ``stall_after_s``."""
    sweep: Mapping[str, tuple[Scalar, ...]] = key(
        factory=dict, meaning="parameters to sweep: {dotted.key: [values]} or {env.NAME: [values]}; the points are "
                              "their cartesian product in YAML order",
        stale=Stale.THROUGH, note="a point's parameters are its overrides and env")
    gates: tuple[Gate, ...] = key((), meaning="checks of the point's metrics against thresholds", stale=Stale.ADDED,
                                  note="a new metric or window; a changed threshold is re-checked from the stored "
                                       "value")
    tests: tuple[str, ...] = key((), meaning="pytest phases: test paths inside this repository", stale=Stale.EXACT)
    pytest_args: tuple[str, ...] = key((), meaning="pytest phases: allowed extra arguments (-k, -m, -x, -q, -v, "
                                                   "--maxfail=N, --hypothesis-seed=N)", stale=Stale.EXACT)
    min_gpus: int = key(0, meaning="GPUs a point needs at least (a CUDA profile's point needs one per process too)",
                        minimum=0, defaults="GPUs a point needs at least", stale=Stale.THROUGH,
                        note="the machine that ran it, against the point's hardware minimum now")
    golden_steps: int = key(0, meaning="train phases: compare the loss of steps 1..N with the golden curve within "
                                       "the profile's golden_loss_rtol",
                            minimum=0, stale=Stale.ADDED, note="one asked over other steps is re-checked against the "
                                                               "golden file")
    """0: no golden (validation/store/goldens.py)."""
    profile_steps: int = key(0, meaning="profile phases: steps the trainer profiles once steady (1..steps), asked "
                                        "through the contract's CONTRACT_PROFILE_STEPS",
                             minimum=0, stale=Stale.THROUGH, note="CONTRACT_PROFILE_STEPS in the point's env")
    """``steps`` is the whole run, warm-up included."""
    resume_after: int = key(0, meaning="resume phases: the step after which the interrupted run stops (1..steps-1); "
                                       "it resumes from its checkpoint for the rest and is compared step by step "
                                       "with an uninterrupted run",
                            minimum=0, stale=Stale.EXACT)
    repeats: int = key(1, meaning="train phases: runs of each point; the report shows the mean with its 95% "
                                  "confidence interval, and a best setting or a regression only where the intervals "
                                  "separate; with golden_steps, the runs' losses are also gated against each other "
                                  "(repeat_loss_rel_diff <= golden_loss_rtol)",
                       minimum=1, stale=Stale.MORE)
    """validation/judge/interval.py."""

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

    def point_overrides(self, params: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """The overrides of the point of sweep parameters ``params``: the phase's, and its config keys."""
        out = dict(self.overrides)
        out.update({k: v for k, v in params.items() if not k.startswith("env.")})
        return out

    def point_env(self, params: Mapping[str, Scalar]) -> dict[str, str]:
        """The environment of the point of sweep parameters ``params``: the phase's, the sweep's
        ``env.*`` parameters and, for a profile phase, the contract's profile request (the trainer
        profiles that many steps once steady)."""
        out = dict(self.env)
        for k, v in params.items():
            if k.startswith("env."):
                out[k[4:]] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        if self.kind == "profile":
            out[PROFILE_STEPS_ENV] = str(self.profile_steps)
        return out


def override_text(value: Scalar) -> str:
    """An override's value as a module trainer's command line gives it (``--override k=v``):
    true or false for a boolean, else its text."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Runbook:
    name: str
    path: Path
    description: str
    source: str
    profiles: tuple[str, ...]
    phases: tuple[Phase, ...]
    max_parallel: int = key(1, meaning="untimed single-process points (pytest, preflight) the CLI may run at once; "
                                       "a timed point (train, profile) always runs alone", minimum=1)
    """Timed points run alone so that no two timings share the machine (plan.batches)."""
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
    """A profile's ``hardware:``: what its points need; each field is a key of it."""

    accelerator: str = key("cpu", meaning="cuda or cpu", required=True, choices=ACCELERATORS)
    min_gpus: int = key(0, meaning="GPUs at least", minimum=0)
    min_gpu_mem_gb: float = key(0.0, meaning="memory per GPU at least", minimum=0.0)
    gpu_name: str | None = key(None, meaning="a substring of the GPU's name (H100): another GPU runs and is reported, "
                                             "or skips with --hardware-mismatch=skip", pattern=NAME)
    peak_bf16_tflops: float | None = key(None, meaning="the GPU's dense bf16 peak in TFLOP/s, from its data sheet: mfu "
                                                       "divides by it (without it mfu is UNMEASURED)", minimum=1.0)
    """One device's dense peak (the vendor's number, without sparsity)."""

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
    requires: tuple[str, ...] = ()
    """Top-level Python packages it imports that a machine may lack (validation.launch.foreign.missing_package)."""

    def supports_phase(self, kind: str) -> bool:
        return kind in self.phases
