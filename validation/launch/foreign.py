"""One point of a runbook's ``trainer:`` (validation/trainer_spec.py) as a launch plan, built once:
the argument list, the environment, the per-point copy of the trainer's YAML config, the commits
of the trainer's tree and of the harness, and the run's tokens per step.

Nothing here goes through a shell: placeholders are replaced inside single arguments, and
every value the runbook gives was checked against a conservative pattern when it loaded.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nsa.atomic import write_atomic
from nsa.provenance import source_revision
from validation import REPO_ROOT
from validation.errors import RunbookError
from validation.launch import commands
from validation.launch import process as runner
from validation.launch.legs import Leg
from validation.runbook.plan import PhasePoint
from validation.runbook.types import Delivery, ResumeSpec, TrainerSpec, Via
from validation.runbook.types import Scalar

CONFIG_COPY = "trainer_config.yaml"


@dataclass(frozen=True)
class Launch:
    entry: list[str]
    """The trainer's entry (``['-m', module]`` or its script), after ``python`` or torchrun's options."""
    args: list[str]
    env: dict[str, str]
    """What the harness sets on top of the inherited environment (launch/commands.child_env makes
    the whole environment, the trainer's root first on PYTHONPATH)."""
    cwd: Path
    """The trainer's root."""
    trainer_sha: str | None
    trainer_sha_source: str
    """The commit of the trainer's tree and where it was read (git describe, or its SOURCE_SHA stamp)."""
    harness_sha: str | None
    harness_sha_source: str
    """The harness's own commit, read the same way."""
    tokens_per_step: int | None
    """The run's global tokens per optimizer step, where the runbook gives its factors."""

    @property
    def set_env(self) -> dict[str, str]:
        """What the harness set on top of the inherited environment, as the record shows it: its
        PYTHONPATH whole (``commands.pythonpath``), so that a Reproduce line finds what the run
        imported from its inherited entries (a trainer's packages installed under a folder on
        PYTHONPATH)."""
        return {**self.env, "PYTHONPATH": commands.pythonpath(self.cwd)}


def build(point: PhasePoint, spec: TrainerSpec, root: Path, out_dir: Path, trainer_dir: Path,
          leg: Leg | None = None) -> Launch:
    """The launch of one point (``leg``: of one process of a resume point); the config copy (if
    any) is written into ``out_dir``, and the commits are read with their git logs there. A
    template that is missing or not a mapping is a RunbookError naming it."""
    entry = list(spec.entry) if spec.entry[0] == "-m" else [str(_inside(root, spec.entry[0], "trainer.script"))]
    values: dict[str, str] = {"steps": str(point.phase.steps), "out_dir": str(trainer_dir), "nproc": str(point.nproc)}
    sets: list[tuple[Delivery, str]] = [(d, values[w]) for w, d in (("steps", spec.steps), ("out_dir", spec.out_dir)) if d]
    sets += [(spec.params[k], _text(v)) for k, v in point.overrides.items()]
    sets += _resume_sets(spec.resume, leg)
    tokens = tokens_per_step(point, spec)
    if spec.config is not None:
        values["config"] = str(_write_config(root, spec, out_dir, [(d.name, v) for d, v in sets if d.via == Via.CONFIG]))
        if spec.config.pass_as is not None:
            sets.append((spec.config.pass_as, values["config"]))
    args = [_fill(a, values) for a in spec.args]
    env = {**spec.env, **point.env}
    for d, v in sets:
        if d.via == Via.FLAG:
            args += [d.name, v]
        elif d.via == Via.ENV:
            env[d.name] = v
    sha, source = revision(root, out_dir, "trainer_git")
    own_sha, own_source = revision(REPO_ROOT, out_dir, "harness_git")
    return Launch(entry, args, env, root, sha, source, own_sha, own_source, tokens)


def _resume_sets(spec: ResumeSpec | None, leg: Leg | None) -> list[tuple[Delivery, str]]:
    """The values that stop or resume a runbook's trainer, each with how it reaches it."""
    if leg is None or spec is None:
        return []
    out = []
    if leg.stop_after is not None:
        out.append((spec.stop_after, str(leg.stop_after)))
    if leg.resume_from is not None:
        out.append((spec.resume_from, str(leg.resume_from)))
    return out


def tokens_per_step(point: PhasePoint, spec: TrainerSpec) -> int | None:
    """The run's global tokens per optimizer step from the runbook's factors (trainer.tokens_per_step)
    times the world size; None where it gives none, or a key the point leaves to the trainer's
    own default (which the harness does not know)."""
    if spec.tokens_per_step is None:
        return None
    total = point.nproc
    for f in spec.tokens_per_step:
        v = f if isinstance(f, int) else point.overrides.get(f)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
            return None
        total *= int(v)
    return total


def missing_file(spec: TrainerSpec, root: Path) -> str | None:
    """Why a file the trainer's command names (its script or module, its config template) is not
    there, or None. Checked before a point runs: a misspelt name is no run of the trainer, and
    its record must not replace one that is."""
    if spec.entry[0] == "-m" and (why := _missing_module(spec.entry[1], root)):
        return why
    named = [("trainer.script", spec.entry[0])] if spec.entry[0] != "-m" else []
    if spec.config is not None:
        named.append(("trainer.config.template", spec.config.template))
    for key, rel in named:
        try:
            _inside(root, rel, key)
        except RunbookError as exc:
            return str(exc)
    return None


def _missing_module(module: str, root: Path) -> str | None:
    """Why ``python -m module`` cannot start with the trainer's root on its path (the harness's
    own interpreter runs it), or None: a module or package under the root, else an installed
    top-level package (found without importing anything)."""
    parts = module.split(".")
    where = root.joinpath(*parts)
    if where.with_suffix(".py").is_file() or where.is_dir():
        return None
    if len(parts) == 1 and importlib.util.find_spec(module) is not None:
        return None
    if len(parts) > 1 and not root.joinpath(parts[0]).exists() and importlib.util.find_spec(parts[0]) is not None:
        return None  # a module of an installed package: importing its parents to look is the trainer's to do
    return (f"trainer.module: {module!r} is neither a module under the trainer's root {root} nor an installed "
            "package of this Python")


def missing_package(spec: TrainerSpec, root: Path) -> str | None:
    """Why the trainer cannot import a package its runbook entry requires (trainer.requires), or
    None: each must be a package or module under the trainer's root (its PYTHONPATH) or installed
    in this Python, which launches it (found without importing anything)."""
    missing = [name for name in spec.requires
               if not (root.joinpath(name).is_dir() or root.joinpath(name).with_suffix(".py").is_file()
                       or importlib.util.find_spec(name) is not None)]
    if not missing:
        return None
    names = ", ".join(repr(m) for m in missing)
    return (f"trainer {spec.name} requires {names} (trainer.requires), neither under its root {root} nor installed in "
            f"this Python ({sys.executable})")


def revision(root: Path, out_dir: Path, log_name: str) -> tuple[str | None, str]:
    """The commit of the tree at ``root`` (git describe there, or its SOURCE_SHA stamp)."""
    def git(*args: str) -> str | None:
        proc = runner.run(["git", "-C", str(root), *args], env=commands.child_env({}), cwd=root, timeout_s=20,
                          log_dir=out_dir, log_name=log_name)
        return proc.stdout_path.read_text().strip() if proc.exit_code == 0 else None

    return source_revision(root, git)


def _text(v: Scalar) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _fill(arg: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        arg = arg.replace("{" + name + "}", value)
    return arg


def _inside(root: Path, rel: str, key: str) -> Path:
    path = (root / rel).resolve()
    if root not in path.parents or not path.is_file():
        raise RunbookError(f"{key}: {rel!r} is not a file inside the trainer's root {root}")
    return path


def _write_config(root: Path, spec: TrainerSpec, out_dir: Path, keys: list[tuple[str, str]]) -> Path:
    """The template with each dotted key set (numbers and booleans as YAML reads them), written
    atomically beside the point's artifacts."""
    template = _inside(root, spec.config.template, "trainer.config.template")
    try:
        data = yaml.safe_load(template.read_text())
    except yaml.YAMLError as exc:
        raise RunbookError(f"{template}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise RunbookError(f"{template}: expected a mapping at the top level (trainer.config.template)")
    for dotted, value in keys:
        node: Any = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RunbookError(f"{template}: cannot set {dotted}: {part} is not a mapping")
        node[leaf] = yaml.safe_load(value) if value else value
    path = out_dir / CONFIG_COPY
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return path
