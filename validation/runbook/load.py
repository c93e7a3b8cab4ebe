"""Runbooks and hardware profiles: YAML (``yaml.safe_load``'s loader, a key written twice being an
error: nsa/yaml_unique.py) -> frozen dataclasses.

A runbook is the seed runbook as data: phases with a launcher, config, overrides, env, steps,
timeout, a parameter sweep and gates. A hardware profile carries the minimum hardware and the
thresholds that gates refer to by name (``threshold: {profile: min_toks_per_s}``).

Everything read from disk is checked here, before anything runs: unknown keys are rejected with
the file and the dotted key named; names that end up in paths, override strings or environment
variables must match conservative patterns, so nothing a runbook says can escape the results
directory or smuggle a second argument into the trainer's command line.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Mapping

from nsa.config import ConfigError, list_presets, resolve_config_path
from nsa.contract import CHECK_CONFIG_FLAG, LIST_KEYS_FLAG
from validation import PROFILE_DIR, REPO_ROOT, RUNBOOK_DIR
from validation.contract.adapters import ADAPTERS
from validation.errors import RunbookError
from validation.judge.metrics import METRICS
from validation.judge.profile_names import BOUNDS, HARNESS_READ
from validation.runbook import keys
from validation.judge.record import TRAINER_KINDS
from validation.judge.stability import StabilityRule
from validation.runbook.fields import (
    NAME,
    Reader,
    is_number,
    parse_env,
    parse_launcher,
    parse_overrides,
    parse_phase,
    read_yaml,
)
from validation.runbook.trainer_keys import config_errors, import_error, published_keys
from validation.runbook.trainer_spec import TrainerSpec, parse_trainer
from validation.runbook.types import Hardware, Launcher, Phase, Profile, Runbook, Scalar, override_text, sweep_part

#: refused values named after the first in one loading's message (the rest are counted)
MORE_REFUSED = 4


def load_runbook(path_or_name: str | Path, known_markers: set[str] | None = None) -> Runbook:
    """Load and validate a runbook (a path, or a name under runbooks/)."""
    path = _resolve(path_or_name, RUNBOOK_DIR, "runbook")
    data = read_yaml(path, keys.RUNBOOK)
    r = Reader(path, data, "", keys.RUNBOOK)
    trainer = parse_trainer(path, r.get("trainer"), METRICS, ADAPTERS) if "trainer" in r.data else None
    d = Reader(path, r.get("defaults", {}), "defaults", keys.DEFAULTS)
    # the keys of ``defaults:``: the structured ones read as a phase reads them, the scalars as declared
    defaults = {k.name: d.value(k.name) for k in keys.DEFAULTS.keys if k.type is not None}
    defaults |= {"launcher": parse_launcher(path, d.get("launcher", {}), "defaults.launcher", Launcher()),
                 "overrides": parse_overrides(d, "defaults.overrides", d.get("overrides")),
                 "env": parse_env(d, "defaults.env", d.get("env"))}
    profiles = r.list_("profiles")
    for i, p in enumerate(profiles):
        if isinstance(p, str) and Path(p).suffix in (".yaml", ".yml"):
            r.fail(f"profiles[{i}]", f"{p!r} is a path: profiles names profiles by their name: (one under "
                                     "runbooks/profiles/, or a file of your own given with --profile PATH)")
        if not isinstance(p, str) or not NAME.match(p):
            r.fail(f"profiles[{i}]", f"bad profile name {p!r}")
    raw = r.list_("phases")
    if not raw:
        r.fail("phases", "a runbook needs at least one phase")
    phases = tuple(parse_phase(path, p, f"phases[{i}]", defaults, known_markers) for i, p in enumerate(raw))
    seen: set[str] = set()
    for i, p in enumerate(phases):
        if p.name in seen:
            r.fail(f"phases[{i}].name", f"duplicate phase name {p.name!r}")
        seen.add(p.name)
        own = raw[i].get("overrides") if isinstance(raw[i], dict) else None
        # a key the phase takes from defaults.overrides is named there (unless the phase sets it too)
        inherited = set(defaults["overrides"]) - set(own if isinstance(own, dict) else ()) - set(p.sweep)
        if trainer is None:
            own_config = isinstance(raw[i], dict) and "config" in raw[i]
            _check_config(r, f"phases[{i}].config" if own_config else "defaults.config", p)
            _check_trainer_keys(r, f"phases[{i}]", p, inherited)
        else:
            _check_params(r, f"phases[{i}]", p, trainer, inherited)
    if trainer is None:
        _check_values(r, raw, phases, defaults)
    return Runbook(r.str_("name", pattern=NAME), path, r.str_("description", "") or "",
                   r.str_("source", "") or "", tuple(profiles), phases, r.value("max_parallel"), trainer)


def _key_where(where: str, key: str, inherited: set[str]) -> str:
    """Where an override key was written: the phase's own overrides or sweep, or defaults.overrides."""
    return f"defaults.overrides (override {key})" if key in inherited else f"{where} (override {key})"


def _check_trainer_keys(r: Reader, where: str, phase, inherited: set[str]) -> None:
    """Override and sweep keys must be keys of the trainer's config, as the trainer publishes them
    (validation/runbook/trainer_keys.py): a typo is found when the runbook loads, not point by
    point as crashes."""
    if phase.kind not in TRAINER_KINDS:
        return
    known = published_keys(phase.launcher.module)
    if known is None:
        failed = import_error(phase.launcher.module) if phase.launcher.kind in ("python", "torchrun") else None
        if failed:
            # not a trainer that does not answer --list-keys: one that cannot start on this host
            r.fail(f"{where}.launcher.module", f"the trainer cannot be imported here (python -m "
                                              f"{phase.launcher.module} {LIST_KEYS_FLAG}: {failed}): every point "
                                              "would crash on it")
        return
    for key in [*phase.overrides, *(k for k in phase.sweep if not k.startswith("env."))]:
        if key not in known:
            section = key.split(".", 1)[0]
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            keys = sorted(k for k in known if k.startswith(section + "."))
            r.fail(_key_where(where, key, inherited), f"{key!r} is not a key of the trainer's config; {hint}keys under "
                                                f"{section}: {', '.join(keys) or 'none (no such section)'}")


def _check_values(r: Reader, raw: list, phases: tuple[Phase, ...], defaults: dict) -> None:
    """Every point's config (its config, steps, overrides and environment) as the trainer would
    load it, where the trainer checks runs for the asking (``--check-config``: nsa/contract.py
    ``CHECK_CONFIG_FLAG``, this project's trainer among them): a value of the wrong type or out of
    range is refused when the runbook loads, naming the point and the key, instead of every point
    crashing on it as the trainer's failure. A trainer that does not answer is left to judge the
    values when it runs."""
    asked: dict[str, list[tuple[int, Phase, dict[str, Scalar]]]] = {}
    for i, p in enumerate(phases):
        if p.kind in TRAINER_KINDS and published_keys(p.launcher.module) is not None:
            asked.setdefault(p.launcher.module, []).extend((i, p, params) for params in p.points())
    refused = []
    for module, points in asked.items():
        runs = [{"config": p.config, "steps": p.steps, "env": p.point_env(params),
                 "overrides": {k: override_text(v) for k, v in p.point_overrides(params).items()}}
                for _, p, params in points]
        refused += [(i, n, p, params, module, error) for n, ((i, p, params), error)
                    in enumerate(zip(points, config_errors(module, runs) or ())) if error]
    if not refused:
        return
    # every value refused, each once (a bad default is refused at every point), so that one
    # loading names all there are to mend
    named: dict[tuple[str, str], str] = {}
    for i, _, p, params, module, error in sorted(refused, key=lambda x: x[:2]):
        where = _value_where(i, p, params, error, raw[i] if isinstance(raw[i], dict) else {}, defaults)
        named.setdefault((where, error), module)
    ((where, error), module), *more = named.items()
    also = "".join(f"; also {w}: {e}" for (w, e), _ in more[:MORE_REFUSED])
    if len(more) > MORE_REFUSED:
        also += f"; and {len(more) - MORE_REFUSED} more"
    r.fail(where, f"the trainer refuses it ({module} {CHECK_CONFIG_FLAG}): {error}{also}")


def _names(message: str, key: str) -> bool:
    """Whether the trainer's error names ``key`` (train.seq_len, NSA_DDP_BUCKET_MB): whole, or for a
    key of a nested section as that section's own check says it (attn.window of model.attn.window)."""
    parts = key.split(".")
    forms = [key] + ([".".join(parts[1:])] if len(parts) > 2 else [])
    return any(re.search(rf"(?<![\w.]){re.escape(f)}(?!\w)", message) for f in forms)


def _value_where(i: int, phase: Phase, params: dict[str, Scalar], error: str, raw: dict, defaults: dict) -> str:
    """Where the runbook set what the trainer's ``error`` names: a sweep point's parameter, the
    phase's own override or variable, or defaults'; the phase (and point) where it names none of them."""
    point = f" point {','.join(sweep_part(k, v) for k, v in params.items())}" if params else ""
    for key in (k for k in params if _names(error, k.removeprefix("env."))):
        return f"phases[{i}]{point} ({'sweep ' + key if key.startswith('env.') else 'override ' + key})"
    own_overrides, own_env = raw.get("overrides"), raw.get("env")
    for key in (k for k in phase.overrides if _names(error, k)):
        inherited = key in defaults["overrides"] and not (isinstance(own_overrides, dict) and key in own_overrides)
        return f"{'defaults.overrides' if inherited else f'phases[{i}]'} (override {key})"
    for name in (n for n in phase.env if _names(error, n)):
        inherited = name in defaults["env"] and not (isinstance(own_env, dict) and name in own_env)
        return f"{'defaults' if inherited else f'phases[{i}]'}.env.{name}"
    return f"phases[{i}]{point}"


def _check_config(r: Reader, where: str, phase) -> None:
    """This project's trainer's config (a preset name, or a YAML file's name: the key's pattern
    takes no folder) must be there for it when the runbook loads: the trainer runs from the
    checkout (validation/launch/kinds.py) and reads the file from there, so a missing one failed
    every point as a crash instead."""
    if phase.kind not in TRAINER_KINDS:
        return
    try:
        resolve_config_path(phase.config, cwd=REPO_ROOT)
    except ConfigError as exc:
        if Path(phase.config).suffix not in (".yaml", ".yml"):
            r.fail(where, str(exc))
        beside = r.path.parent / phase.config
        hint = (f"; {beside} beside the runbook is not read (the runbook's folder is not where the trainer "
                "looks)" if beside.is_file() and beside.resolve() != (REPO_ROOT / phase.config).resolve() else "")
        r.fail(where, f"config file {phase.config!r} not found: looked for {REPO_ROOT / phase.config}. This "
                      f"project's trainer runs from the checkout ({REPO_ROOT}) and reads its config file from there: "
                      f"put the file there, or name a preset ({', '.join(list_presets())}){hint}")


def _check_params(r: Reader, where: str, phase, trainer: TrainerSpec, inherited: set[str]) -> None:
    """Every override and sweep key of a phase must be a parameter the named trainer takes; the
    module and config of this project's trainer mean nothing to it."""
    if phase.kind not in ("train", "resume"):
        return
    if phase.launcher.module != Launcher.module or phase.config != Phase.config:
        r.fail(f"{where}", f"launcher.module and config name this project's trainer; trainer {trainer.name} "
                           "runs trainer.script/module with trainer.config")
    for key in [*phase.overrides, *(k for k in phase.sweep if not k.startswith("env."))]:
        if key not in trainer.params:
            r.fail(_key_where(where, key, inherited), f"trainer {trainer.name} takes no parameter {key!r}; say how it "
                                                f"reaches it under trainer.params (its params: "
                                                f"{', '.join(trainer.params) or 'none'})")


#: how alike (difflib's ratio) a threshold name and one the harness reads must be to count as a
#: typo of it: 'max_toks_regresion' and 'spike_windw' are 0.97, 'max_toks_cv' and 'max_mem_growth_gb'
#: against any of them below 0.7
NEAR_MISS = 0.85


def load_profile(path_or_name: str | Path) -> Profile:
    path = _resolve(path_or_name, PROFILE_DIR, "profile")
    data = read_yaml(path, keys.PROFILE)
    r = Reader(path, data, "", keys.PROFILE)
    h = Reader(path, r.get("hardware"), "hardware", keys.HARDWARE)
    hw = Hardware(**{k.name: h.value(k.name) for k in keys.HARDWARE.keys})
    thr = r.get("thresholds")
    if not isinstance(thr, Mapping):
        r.fail("thresholds", "expected a mapping of name: number (or null = to be measured)")
    thresholds: dict[str, float | None] = {}
    for k, v in thr.items():
        if not isinstance(k, str) or not NAME.match(k):
            r.fail(f"thresholds.{k}", "bad threshold name")
        near = difflib.get_close_matches(k, HARNESS_READ, n=1, cutoff=NEAR_MISS) if k not in HARNESS_READ else []
        if near:
            r.fail(f"thresholds.{k}", f"did you mean {near[0]}? {k} is read by nothing unless a gate names it, and "
                                      f"so close to {near[0]}, which the harness reads, that it reads as a typo of it "
                                      f"(the names the harness reads: {', '.join(HARNESS_READ)})")
        if v is not None and not is_number(v):
            r.fail(f"thresholds.{k}", f"expected a finite number or null (to be measured), got {v!r}")
        thresholds[k] = None if v is None else float(v)
        bounds = BOUNDS.get(k)
        if v is not None and bounds is not None and not bounds.holds(float(v)):
            r.fail(f"thresholds.{k}", f"must be {bounds.text()}, got {v!r}")
    try:
        StabilityRule.of(thresholds)
    except ValueError as exc:
        r.fail("thresholds", str(exc))
    return Profile(r.str_("name", pattern=NAME), path, r.str_("marker", pattern=NAME),
                   r.str_("description", "") or "", hw, thresholds, r.str_("notes", "") or "")


def runbook_profile(rb: Runbook, name: str) -> Profile:
    """A profile the runbook names under ``profiles``; one that does not exist is an error naming
    the runbook's file and the key (a name there is checked only when used: --profile may give
    a YAML path of that name instead)."""
    where = f"{rb.path}: profiles[{rb.profiles.index(name)}]"
    if not (PROFILE_DIR / f"{name}.yaml").is_file():
        raise RunbookError(f"{where}: no profile {name!r} under {PROFILE_DIR} (profiles there: "
                           f"{', '.join(available(PROFILE_DIR))}); a profile file of your own is given with "
                           f"--profile PATH, its name: {name!r}")
    try:
        return load_profile(name)
    except RunbookError as exc:
        raise RunbookError(f"{where}: {exc}") from None


def _resolve(path_or_name: str | Path, directory: Path, what: str) -> Path:
    p = Path(path_or_name)
    if p.suffix in (".yaml", ".yml"):
        p = p.expanduser()  # `--runbook=~/my.yaml`: the shell leaves a ~ after '=' alone
        if not p.exists() and p.parent == Path(".") and (directory / f"{p.stem}.yaml").is_file():
            # `--runbook cpu_smoke.yaml` outside the checkout: a path, so not the built-in one
            raise RunbookError(f"{p}: file not found in {Path.cwd()}; the {what} {p.stem!r} under {directory} is "
                               f"named without its suffix: --{what} {p.stem}")
        return p
    if not NAME.match(str(path_or_name)):
        raise RunbookError(f"{path_or_name!r}: not a YAML path or a name under {directory}")
    path = directory / f"{p}.yaml"
    if not path.is_file():
        raise RunbookError(f"no {what} {str(path_or_name)!r} under {directory}; {what}s: "
                           f"{', '.join(available(directory))} (or give a YAML path)")
    return path


def available(directory: Path = RUNBOOK_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))
