"""The config keys a trainer publishes (``python -m <module> --list-keys``: nsa/contract.py
``LIST_KEYS_FLAG``), read without importing the trainer, so that a runbook's overrides are checked
against them when it loads. A module that does not answer the flag publishes nothing, and its
runbook's keys are the trainer's to judge when it runs."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

from nsa.contract import LIST_KEYS_FLAG
from validation import REPO_ROOT

#: seconds a trainer gets to print its keys (this project's answers in about 0.2 s)
TIMEOUT_S = 60.0


@functools.lru_cache(maxsize=None)
def published_keys(module: str) -> frozenset[str] | None:
    """The dotted config keys ``module`` prints for ``--list-keys``, or None when it does not
    answer the flag with a JSON list of strings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        out = subprocess.run([sys.executable, "-m", module, LIST_KEYS_FLAG], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        keys = json.loads(out.stdout)
    except ValueError:
        return None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return None
    return frozenset(keys)
