"""``python -m nsa.train --list-keys``: the trainer's config keys as a JSON list of dotted names
(sorted), so that the harness checks a runbook's overrides without importing the trainer.

It is fast on purpose (the harness asks once per runbook it loads): the config dataclasses are
plain Python, but the packages that hold two of them, ``nsa.attention`` and ``nsa.model``, import
torch and build the model in their ``__init__``. So those two config modules are loaded here from
their files and registered under their own names; ``nsa.train.config``'s ``from ..model.config
import ModelConfig`` then finds them in ``sys.modules`` without running either package's
``__init__``. The keys are the ones ``nsa.train.config.config_keys()`` gives after a full import
(tests/unit/test_train_keys.py checks both, and that torch stays out of the process).
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


def config_keys() -> list[str]:
    """Every dotted key an override may set, sorted."""
    for name in _LEAVES:
        _load_leaf(name)
    from .config import config_keys as keys

    return sorted(keys())


def main() -> int:
    try:
        print(json.dumps(config_keys()), flush=True)
    except BrokenPipeError:  # `--list-keys | head -c 50`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    return 0
