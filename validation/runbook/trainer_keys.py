"""The config keys a trainer publishes (``python -m <module> --list-keys``: nsa/contract.py
``LIST_KEYS_FLAG``), read without importing the trainer, so that a runbook's overrides are checked
against them when it loads; and its answer on the runs' config values (``--check-config``:
``CHECK_CONFIG_FLAG``), so that a value it would refuse is found then too. A module that does not
answer a flag publishes nothing, and what the flag would have checked is the trainer's to judge
when it runs."""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

from nsa.contract import CHECK_CONFIG_FLAG, LIST_KEYS_FLAG
from validation import REPO_ROOT

#: seconds a trainer gets to print its keys (this project's answers in about 0.2 s)
TIMEOUT_S = 60.0


def _run(module: str, flag: str, request: str | None = None) -> subprocess.CompletedProcess | None:
    """``python -m module flag`` (``request`` on its stdin) run as the harness runs it (from the
    checkout, no inherited NSA_* or CONFIG); None where it could not be run or timed out."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("NSA_") or k == "CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        return subprocess.run([sys.executable, "-m", module, flag], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S,
                              **({"input": request} if request is not None else {"stdin": subprocess.DEVNULL}))
    except (OSError, subprocess.TimeoutExpired):
        return None


@functools.lru_cache(maxsize=None)
def _run_cached(module: str, flag: str) -> subprocess.CompletedProcess | None:
    return _run(module, flag)


def _ask(module: str, flag: str, request: str | None = None) -> object:
    """What ``module`` prints as JSON for ``flag`` (``request`` on its stdin); None where it fails
    or prints no JSON."""
    out = _run(module, flag, request) if request is not None else _run_cached(module, flag)
    if out is None or out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout)
    except ValueError:
        return None


#: the last line Python prints where ``python -m module`` cannot import it or what it imports
_IMPORT_FAILED = re.compile(r"^(?:[\w.]+\.)?(?:ModuleNotFoundError|ImportError): .+|^\S*python\S*: No module named .+")


def import_error(module: str) -> str | None:
    """The line ``python -m module --list-keys`` failed with where it failed to import (the module,
    or a module it imports: ``ModuleNotFoundError: No module named 'x'``), else None. Such a module
    is not one that does not answer the flag: every point launched on this host would crash on it."""
    out = _run_cached(module, LIST_KEYS_FLAG)
    if out is None or out.returncode == 0:
        return None
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    return lines[-1] if lines and _IMPORT_FAILED.match(lines[-1]) else None


@functools.lru_cache(maxsize=None)
def published_keys(module: str) -> frozenset[str] | None:
    """The dotted config keys ``module`` prints for ``--list-keys``, or None when it does not
    answer the flag with a JSON list of strings."""
    keys = _ask(module, LIST_KEYS_FLAG)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return None
    return frozenset(keys)


def config_errors(module: str, runs: list[dict[str, object]]) -> list[str | None] | None:
    """Of each run (nsa/contract.py ``CHECK_CONFIG_FIELDS``) the error ``module`` says it would stop
    with while loading its config (None: none), or None when it does not answer ``--check-config``
    with a list of as many strings or nulls."""
    answers = _config_errors(module, json.dumps(runs, sort_keys=True))
    return None if answers is None else list(answers)


@functools.lru_cache(maxsize=None)
def _config_errors(module: str, request: str) -> tuple[str | None, ...] | None:
    """Asked once per process for one request: a runbook is loaded more than once in a session."""
    answers = _ask(module, CHECK_CONFIG_FLAG, request)
    if not isinstance(answers, list) or len(answers) != len(json.loads(request)) or \
            not all(a is None or isinstance(a, str) for a in answers):
        return None
    return tuple(answers)
