"""``python -m nsa.train --list-keys``: the trainer's config keys as a JSON list of dotted names
(sorted), so that the harness checks a runbook's overrides without importing the trainer; and
``--check-config``: the error each run of a JSON list on stdin would stop with while loading its
config (nsa/contract.py ``CHECK_CONFIG_FLAG``), so that the harness checks their values too.

It is fast on purpose (the harness asks once per runbook it loads): the config dataclasses are
plain Python, but the packages that hold two of them, ``nsa.attention`` and ``nsa.model``, import
torch and build the model in their ``__init__``. So those two config modules are loaded here from
their files and registered under their own names; ``nsa.train.config``'s ``from ..model.config
import ModelConfig`` then finds them in ``sys.modules`` without running either package's
``__init__``. The keys are the ones ``nsa.train.config.config_keys()`` gives after a full import
(tests/unit/test_train_keys.py checks both, and that torch stays out of the process); a run's
config is checked by the loader a run uses (``nsa.train.config.check_run_config``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

#: torch-free config modules inside torch-importing packages, in the order they import each other
_LEAVES = ("nsa.attention.config", "nsa.model.config")
_NSA_ROOT = Path(__file__).resolve().parents[1]


def _load_leaf(name: str) -> None:
    if name in sys.modules:  # imported already (the package too, perhaps): use that one
        return
    path = _NSA_ROOT.joinpath(*name.split(".")[1:]).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _config_module():
    """nsa.train.config, its torch-importing packages' config modules loaded from their files."""
    for name in _LEAVES:
        _load_leaf(name)
    from . import config

    return config


def config_keys() -> list[str]:
    """Every dotted key an override may set, sorted."""
    return sorted(_config_module().config_keys())


def _strings(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def check_runs(runs: object) -> list[str | None]:
    """Of each run ({config, steps, overrides, env}: nsa/contract.py ``CHECK_CONFIG_FIELDS``) the
    error it would stop with while loading its config, or None; ValueError for a request of
    another shape."""
    from ..contract import CHECK_CONFIG_FIELDS

    if not isinstance(runs, list):
        raise ValueError("expected a JSON list of runs")
    check = _config_module().check_run_config
    out = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or set(run) - set(CHECK_CONFIG_FIELDS):
            raise ValueError(f"run {i}: expected an object of {', '.join(CHECK_CONFIG_FIELDS)}")
        config, steps = run.get("config"), run.get("steps")
        overrides, env = run.get("overrides") or {}, run.get("env") or {}
        if not (config is None or isinstance(config, str)) or not (steps is None or type(steps) is int) \
                or not _strings(overrides) or not _strings(env):
            raise ValueError(f"run {i}: config is a string, steps an integer, overrides and env objects of strings")
        out.append(check(config, steps, overrides, env))
    return out


def check_main() -> int:
    """``--check-config``: the runs from stdin, their answers as a JSON list on stdout; exit 2
    (a one-line error) for a request that is not such a list."""
    try:
        answers = check_runs(json.load(sys.stdin))
    except ValueError as exc:  # json.JSONDecodeError is one
        print(f"error: --check-config: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        print(json.dumps(answers), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main() -> int:
    try:
        print(json.dumps(config_keys()), flush=True)
    except BrokenPipeError:  # `--list-keys | head -c 50`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    return 0
