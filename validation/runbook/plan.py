"""A runbook x profile expands into phase points: one phase at one point of its sweep, with its
gates' thresholds resolved from the profile. A point is the unit that runs, is stored and is
shown as one pytest test."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from nsa.config import ConfigError, resolve_config_path
from validation import REPO_ROOT
from validation.contract.adapters import ADAPTERS
from validation.errors import RunbookError
from validation.judge.gates import Gate
from validation.judge.profile_names import GOLDEN_RTOL
from validation.judge.record import TRAINER_KINDS
from validation.judge.resume import RTOL_KEY as RESUME_RTOL
from validation.judge.metrics import declared_unprovided
from validation.runbook.types import Phase, Profile, Runbook, Scalar, sweep_part

#: pytest markers implied by what a phase needs (added to the phase's own markers)
PROFILE_GPU_MARKERS = ("gpu",)


#: how the trainer entry a record keeps names a param of one of the point's overrides:
#: 'params.train.lr' (PhasePoint.trainer_asked)
TRAINER_PARAM = "params."


@dataclass(frozen=True)
class PhasePoint:
    runbook: Runbook
    profile: Profile
    phase: Phase
    params: dict[str, Scalar]
    index: int = 0
    """Position of this point in the phase's sweep (findings read sweeps in this order)."""

    @property
    def slug(self) -> str:
        """Filesystem- and pytest-id-safe name of the sweep point ('default' without a sweep)."""
        if not self.params:
            return "default"
        return ",".join(sweep_part(k, v) for k, v in self.params.items())

    @property
    def test_id(self) -> str:
        return f"{self.runbook.name}/{self.profile.name}/{self.phase.name}/{self.slug}"

    def key(self) -> dict[str, Any]:
        return {"runbook": self.runbook.name, "profile": self.profile.name, "phase": self.phase.name,
                "params": {k: self.params[k] for k in sorted(self.params)}}

    @property
    def overrides(self) -> dict[str, Scalar]:
        return self.phase.point_overrides(self.params)

    @property
    def env(self) -> dict[str, str]:
        """The phase's environment, the sweep's ``env.*`` parameters and, for a profile phase, the
        contract's profile request (the trainer profiles that many steps once steady)."""
        return self.phase.point_env(self.params)

    @property
    def nproc(self) -> int:
        """The trainer's processes, every node's together (its world size)."""
        return self.phase.launcher.world_size if self.phase.kind in TRAINER_KINDS else 1

    def launcher_asked(self) -> dict[str, str]:
        """How the launcher starts the trainer apart from its world size (``nproc``), as a record
        keeps it (judge/asked.py): one process or torchrun, how many nodes, the options passed
        through. The rendezvous's endpoint and port say only where the agents meet; its join
        timeout is an allowance, compared as one (store/stale.py)."""
        launcher = self.phase.launcher
        return _given({"kind": launcher.kind, "nodes": str(launcher.nnodes),
                       "torchrun_args": " ".join(launcher.torchrun_args), "srun_args": " ".join(launcher.srun_args)})

    def trainer_asked(self) -> dict[str, str]:
        """The trainer the point launches, as a record keeps it: this project's trainer's module,
        or the runbook's ``trainer:`` entry as far as it makes this point's run what it is (its
        root, entry, args, config template, how steps, out_dir and this point's overrides reach
        it, its env, its adapter, which of the point's gate metrics it cannot provide, and for a
        resume point how it stops and resumes). Its name is only how reports call it."""
        spec = self.runbook.trainer
        if spec is None:
            return {"module": self.phase.launcher.module}
        out = {"root": spec.root.describe(), "entry": " ".join(spec.entry), "args": " ".join(spec.args),
               "config": f"{spec.config.template} (as {_via(spec.config.pass_as)})" if spec.config else "none",
               "steps": _via(spec.steps), "out_dir": _via(spec.out_dir), "adapter": spec.adapter}
        out.update({f"{TRAINER_PARAM}{k}": _via(spec.params.get(k)) for k in self.overrides})
        out.update({f"env.{k}": str(v) for k, v in spec.env.items()})
        metrics = {g.metric for g in self.gates()}
        out["not provided"] = ", ".join(sorted(m for m in unprovided_metrics(self) if m in metrics)) or "none"
        if self.phase.kind == "resume":
            out["resume"] = (f"stop_after {_via(spec.resume.stop_after)}, from {_via(spec.resume.resume_from)}"
                             if spec.resume else "none")
        return _given(out)

    def config_digest(self) -> str | None:
        """The config file the trainer reads, by its name and the first 16 hex digits of its SHA-256
        ('tiny.yaml 4add133e2ed029eb'): this project's trainer's preset or YAML file (in this
        repository, its working directory), or a ``trainer:`` entry's config template (relative to
        its root); None where there is none or it cannot be read here. An edited file makes another
        run of the point."""
        spec = self.runbook.trainer
        if spec is None:
            try:
                path = resolve_config_path(self.phase.config, cwd=REPO_ROOT)
            except ConfigError:
                return None
        elif spec.config is not None:
            root, _ = spec.root.resolve()
            if root is None:
                return None
            path = root / spec.config.template
        else:
            return None
        try:
            return f"{path.name} {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
        except OSError:
            return None

    def pytest_asked(self) -> dict[str, str]:
        """A pytest point's tests and arguments, as a record keeps them."""
        return _given({"tests": " ".join(self.phase.tests), "pytest_args": " ".join(self.phase.pytest_args)})

    @property
    def slurm(self) -> bool:
        """A train point that Slurm runs, on the nodes of an allocation rather than this machine."""
        return self.phase.kind in TRAINER_KINDS and self.phase.launcher.kind == "slurm"

    @property
    def timed(self) -> bool:
        """Whether the point measures speed (train and profile phases): it never shares the
        machine with another point."""
        return self.phase.kind in TRAINER_KINDS

    @property
    def min_gpus(self) -> int:
        """GPUs this machine needs for the point: the phase's floor, and one per process on a CUDA
        profile unless Slurm runs it (the GPUs are the allocation's, asked for in srun_args)."""
        if self.profile.hardware.accelerator != "cuda":
            return 0
        local = self.phase.kind in TRAINER_KINDS and not self.slurm
        return max(self.phase.min_gpus, self.nproc if local else 0)

    @property
    def markers(self) -> tuple[str, ...]:
        ms = [self.phase.name, self.profile.marker, *self.phase.markers]
        if self.profile.hardware.accelerator == "cuda":
            ms.append("gpu")
            if self.min_gpus >= 2:
                ms.append("multi_gpu")
        if self.nproc > 1:
            ms.append("distributed")
        if self.phase.kind in TRAINER_KINDS and self.phase.launcher.nodes:
            ms.append("multi_node")
        if self.slurm:
            ms.append("slurm")
        return tuple(dict.fromkeys(ms))

    def gates(self) -> list[Gate]:
        """The phase's gates with thresholds taken from the profile. A gate naming a threshold
        the profile lacks is a runbook error; a null threshold stays None ('to be measured')."""
        out = []
        for g in self.phase.gates:
            if g.threshold_ref is None:
                out.append(g)
                continue
            if g.threshold_ref not in self.profile.thresholds:
                raise RunbookError(
                    f"{self.runbook.path}: phase {self.phase.name}: gate {g.metric} uses threshold "
                    f"{g.threshold_ref!r}, which profile {self.profile.path} does not define "
                    f"(thresholds: {', '.join(sorted(self.profile.thresholds))})")
            out.append(Gate(g.metric, g.op, self.profile.thresholds[g.threshold_ref], g.window,
                            g.threshold_ref, g.description))
        if self.phase.golden_steps and GOLDEN_RTOL not in self.profile.thresholds:
            raise RunbookError(
                f"{self.runbook.path}: phase {self.phase.name} sets golden_steps, but profile {self.profile.path} "
                f"has no {GOLDEN_RTOL} threshold (a number, or null = to be measured)")
        spec = self.runbook.trainer
        runs = spec is None or spec.supports_phase(self.phase.kind)  # else the point is a SKIP, judged by nothing
        if self.phase.kind == "resume" and runs and RESUME_RTOL not in self.profile.thresholds:
            raise RunbookError(
                f"{self.runbook.path}: phase {self.phase.name} is a resume phase, but profile {self.profile.path} "
                f"has no {RESUME_RTOL} threshold (a number, 0 for bit-identical, or null = to be measured)")
        return out


def _given(keys: dict[str, str]) -> dict[str, str]:
    """``keys`` without the empty ones (no arguments: the key unset, as a report names it)."""
    return {k: v for k, v in keys.items() if v}


def _via(d: Any) -> str:
    """A runbook.types.Delivery as the runbook writes it ('{flag: --steps}'); 'none' for None."""
    return "none" if d is None else f"{{{d.via}: {d.name}}}"


def unprovided_metrics(point: PhasePoint) -> dict[str, str]:
    """Metrics the runbook's trainer cannot provide, each with why (none for this project's)."""
    spec = point.runbook.trainer
    if spec is None:
        return {}
    return declared_unprovided(spec.name, ADAPTERS[spec.adapter].lacks, spec.metrics)


def expand(runbook: Runbook, profile: Profile, phases: list[str] | None = None) -> list[PhasePoint]:
    """Every point of every (selected) phase, in runbook order; thresholds checked up front."""
    if profile.name not in runbook.profiles:
        raise RunbookError(f"{runbook.path}: profile {profile.name!r} is not one of this runbook's "
                           f"profiles ({', '.join(runbook.profiles)})")
    # each phase named must exist (an unknown one is an error naming the runbook's phases); the
    # selected ones run in the runbook's order, whatever order they were given in
    wanted = {runbook.phase(p).name for p in phases or ()}
    selected = [ph for ph in runbook.phases if not wanted or ph.name in wanted]
    points = [PhasePoint(runbook, profile, ph, params, i) for ph in selected for i, params in enumerate(ph.points())]
    for p in points:
        p.gates()
    return points


def batches(points: list[PhasePoint], jobs: int) -> list[list[PhasePoint]]:
    """Runbook order, with up to ``jobs`` consecutive untimed single-process points run together.
    A timed point (one whose speed a gate or a table reads) and a multi-process (torchrun) point
    always run alone: timings taken beside another point's work measure the neighbour too."""
    out: list[list[PhasePoint]] = []
    batch: list[PhasePoint] = []
    for p in points:
        if p.timed or p.nproc > 1 or jobs <= 1:
            if batch:
                out.append(batch)
                batch = []
            out.append([p])
            continue
        batch.append(p)
        if len(batch) == jobs:
            out.append(batch)
            batch = []
    if batch:
        out.append(batch)
    return out
