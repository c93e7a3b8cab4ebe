"""A train point's trainer started the way its runbook's launcher says: ``python``, torchrun on
one node, one torchrun agent per node on this host (validation/launch/nodes.py), or srun of
torchrun in a Slurm allocation (validation/launch/slurm.py). Each way is watched and killed as
one process tree (validation/launch/process.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

from validation.launch import commands, nodes, slurm
from validation.launch import process as runner
from validation.launch.commands import Target
from validation.launch.watch import Watch
from validation.runbook.types import Launcher


def run_trainer(launcher: Launcher, target: Target, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
                timeout_s: float, out_dir: Path, on_poll: Callable[[float], None] | None,
                watch: Watch) -> runner.ProcResult:
    """Run the trainer ``target`` with ``args`` into ``out_dir`` (its logs there too)."""
    how = dict(env=env, cwd=cwd, timeout_s=timeout_s, out_dir=out_dir, on_poll=on_poll, watch=watch)
    if launcher.kind == "slurm":
        return slurm.run(launcher, target, args, **how)
    if launcher.nodes:
        return nodes.run_local(launcher, target, args, **how)
    argv = (commands.torchrun_argv(target, launcher.nproc, args, launcher.torchrun_args) if launcher.kind == "torchrun"
            else commands.python_argv(target, args))
    return runner.run(argv, env=env, cwd=cwd, timeout_s=timeout_s, log_dir=out_dir, on_poll=on_poll, watch=watch)
