"""Command lines and environments of the processes the harness starts: python or torchrun
(``python -m torch.distributed.run``, no PATH lookup) from argument lists, never a shell."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from validation import REPO_ROOT


def child_env(extra: Mapping[str, str], root: Path = REPO_ROOT) -> dict[str, str]:
    """The parent's environment without inherited NSA_*/CONFIG (the runbook is the source of
    truth for those), plus the runbook's variables and what the harness needs; ``root`` (the
    trainer's own checkout) comes first on PYTHONPATH, and of the inherited PYTHONPATH only
    what is not this repository (:func:`inherited_path`)."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("NSA_") or k == "CONFIG")}
    env.update(extra)
    env["PYTHONPATH"] = pythonpath(root)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal leaves a Python traceback in stderr
    return env


def pythonpath(root: Path) -> str:
    """The PYTHONPATH a trainer rooted at ``root`` runs with: its root, then the inherited entries
    it keeps (:func:`inherited_path`)."""
    return os.pathsep.join([str(root), *inherited_path(root)])


def inherited_path(root: Path) -> list[str]:
    """The harness's own PYTHONPATH entries a trainer rooted at ``root`` inherits: all of them for
    this project's trainer, and for another trainer all but this repository, which the harness's
    environment often carries (``PYTHONPATH=<checkout> python -m validation``, the fault tests):
    its ``nsa`` package would shadow a trainer's own ``nsa`` that is not at its root (a src layout
    appended to sys.path, an installed package). Nothing a foreign trainer runs needs this
    repository; other entries (a sitecustomize folder, a site's own paths) go on."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if root.resolve() == REPO_ROOT:
        return entries
    return [e for e in entries if Path(e).resolve() != REPO_ROOT]


Target = str | Sequence[str]
"""A module name (run as ``-m module``) or an entry argv of its own (``['/root/scripts/train.py']``)."""


def _entry(target: Target) -> list[str]:
    return ["-m", target] if isinstance(target, str) else [str(t) for t in target]


def _torchrun_entry(target: Target) -> list[str]:
    """The target after torchrun's options: '--' ends them, or torchrun's parser would read a
    trainer flag that abbreviates one of its own (--nproc, --node, --log) as that option, or
    refuse it as ambiguous, before the trainer starts."""
    return ["-m", "--", target] if isinstance(target, str) else ["--", *map(str, target)]


def python_argv(target: Target, args: Sequence[str]) -> list[str]:
    return [sys.executable, *_entry(target), *args]


def torchrun_argv(target: Target, nproc: int, args: Sequence[str], torchrun_args: Sequence[str] = ()) -> list[str]:
    """torchrun, invoked as ``python -m torch.distributed.run`` (the same program, no PATH lookup).
    Rendezvous options from the runbook replace --standalone, so a phase scales to several nodes."""
    rdzv = list(torchrun_args) or ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *rdzv, f"--nproc_per_node={nproc}", *_torchrun_entry(target),
            *args]


def nodes_torchrun_argv(target: Target, nproc: int, args: Sequence[str], *, nnodes: int, endpoint: str,
                        rdzv_id: str, join_timeout_s: float, torchrun_args: Sequence[str] = ()) -> list[str]:
    """One node's torchrun agent of a launch of ``nnodes`` nodes meeting at a c10d rendezvous:
    the same argv on every node (c10d ignores --node_rank: a node's rank is its place in the
    rendezvous); ``join_timeout`` is how long an agent waits for the others (torchrun's default
    is 600 s; its ``timeout`` option is read by the static and etcd backends only). The runbook's
    other torchrun options (``torchrun_args``: --max-restarts, --monitor-interval, ...) go to every
    agent; the runbook check refuses the rendezvous options among them, which these set."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={rdzv_id}",
            f"--rdzv_conf=join_timeout={math.ceil(join_timeout_s)}", *torchrun_args, *_torchrun_entry(target), *args]
