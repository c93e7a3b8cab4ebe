"""Several nodes on this host: one torchrun agent per node, all started here, meeting at a c10d
rendezvous on a loopback endpoint. A faithful test of what a cluster does (the rendezvous, a node
that never joins, a node's rank that hangs or is killed) without a second machine; across
machines, validation/launch/slurm.py starts the same agents through srun.

Every process of node i carries the node's index in its environment (``NODE_ENV``, inherited by
its workers; Slurm's task id plays that part under srun; validation/contract/nodes.py), so that the harness
can say which node a rank or a stack belongs to; its agent logs to ``node{i}.stdout.log`` and
``node{i}.stderr.log``. What the harness saw of each node goes to ``nodes.json``
(validation/contract/nodes.py).
"""
from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import psutil

from validation.contract.nodes import NODE_ENV, NodeLaunch, NodesLaunch, node_of, write_nodes
from validation.launch import commands
from validation.launch import process as runner
from validation.launch.commands import Target
from validation.launch.stacks import is_agent
from validation.launch.tree import ProcessTree, alive
from validation.launch.watch import Watch
from validation.machine import no_gpu_here
from validation.runbook.types import Launcher

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (another process may still take it before the agents do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def endpoint(text: str) -> str:
    """The runbook's ``host:port``, a free port in place of port 0."""
    host, port = text.rsplit(":", 1)
    return f"{host}:{free_port('127.0.0.1' if host == 'localhost' else host) if port == '0' else port}"


class RankSeen:
    """What the tree's polls showed of each node: rank -> pid of its workers, the node rank
    (GROUP_RANK) torchrun gave them, and its torchrun agent's pid where the agent is not a process
    the harness launched (srun's task on this host). A worker's environment is read once; a process
    without a RANK is looked at again (a worker forked but not yet exec'd still shows its agent's).

    The processes looked at are the launched processes' descendants (``ProcessTree.known``), which
    is where a local launch's agents and workers are; srun's tasks are children of Slurm's
    slurmstepd, not of srun, and only the launch's token finds them (``ProcessTree.members``, a
    scan of every process on this host: ``every_s`` apart at most)."""

    def __init__(self, processes: Callable[[ProcessTree], list[psutil.Process]] = ProcessTree.known,
                 every_s: float = 0.0) -> None:
        self.ranks: dict[int, dict[int, int]] = {}
        self.group: dict[int, int] = {}
        self.agents: dict[int, int] = {}
        self._agents: dict[int, psutil.Process] = {}
        self._processes, self._every_s = processes, every_s
        self._last: float | None = None
        self._read: set[int] = set()

    def __call__(self, tree: ProcessTree) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self._every_s:
            return
        self._last = now
        launched = {r.pid for r in tree.roots}
        for p in self._processes(tree):
            if p.pid in self._read or p.pid in launched:
                continue
            try:
                env = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # gone, or not readable yet: looked at again at the next poll
            node, rank, group = node_of(env), env.get("RANK", ""), env.get("GROUP_RANK", "")
            if node is not None and not rank and _own_agent(p):
                self._read.add(p.pid)
                self.agents.setdefault(node, p.pid)
                self._agents.setdefault(node, p)
            if node is None or not rank.isdigit():
                continue
            self._read.add(p.pid)
            self.ranks.setdefault(node, {}).setdefault(int(rank), p.pid)
            if group.isdigit():
                self.group[node] = int(group)


    def agent_states(self) -> dict[int, str]:
        """Node -> its seen agent's process state now ('stopped' for a SIGSTOP or a debugger,
        'sleeping', ...), of the agents still running."""
        out = {}
        for node, p in self._agents.items():
            with contextlib.suppress(psutil.Error):
                if alive(p):
                    out[node] = p.status()
        return out


def _own_agent(p: psutil.Process) -> bool:
    """A torchrun agent, not a worker it forked that has not exec'd yet (which shows the agent's
    command line and environment until it does)."""
    try:
        parent = p.parent()
        return is_agent(p) and not (parent is not None and is_agent(parent))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def node_devices(nnodes: int, nproc: int, env: Mapping[str, str]) -> list[str | None]:
    """Each node's CUDA_VISIBLE_DEVICES: on a host with a GPU for every rank, node i gets the i-th
    ``nproc`` of the GPUs the launch sees (``CUDA_VISIBLE_DEVICES`` of ``env``, else all), as the
    nodes of a cluster each have their own; every node's worker of local rank 0 would otherwise
    take the same GPU, which NCCL refuses. None for every node on a host with fewer (CPU runs)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
    elif no_gpu_here():
        gpus = []
    else:
        import torch  # device_count reads NVML: no CUDA context in the harness

        gpus = [str(i) for i in range(torch.cuda.device_count())]
    if len(gpus) < nnodes * nproc:
        return [None] * nnodes
    return [",".join(gpus[i * nproc:(i + 1) * nproc]) for i in range(nnodes)]


def agent_commands(argv: list[str], devices: Sequence[str | None]) -> list[runner.Command]:
    """One torchrun agent per node, each with its node index, its own logs and its GPUs where
    ``devices`` (a CUDA_VISIBLE_DEVICES or None for each node: node_devices) gives them."""
    return [runner.Command(argv, f"node{i}", {NODE_ENV: str(i), **({"CUDA_VISIBLE_DEVICES": d} if d else {})})
            for i, d in enumerate(devices)]


def run_local(launcher: Launcher, target: Target, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
              timeout_s: float, out_dir: Path, on_poll: Callable[[float], None] | None,
              watch: Watch) -> runner.ProcResult:
    """Every node's agent started here, watched as one tree; ``nodes.json`` written at the end.
    The rendezvous id is the run's directory name (its run id): unique per run."""
    rdzv = launcher.rdzv
    at = endpoint(rdzv.endpoint)
    devices = node_devices(launcher.nnodes, launcher.nproc, env)
    argv = commands.nodes_torchrun_argv(target, launcher.nproc, args, nnodes=launcher.nnodes, endpoint=at,
                                        rdzv_id=out_dir.name, join_timeout_s=rdzv.join_timeout_s,
                                        torchrun_args=launcher.torchrun_args)
    seen = RankSeen()
    result = runner.run_group(agent_commands(argv, devices), env=env, cwd=cwd, timeout_s=timeout_s,
                              log_dir=out_dir, on_poll=on_poll, watch=watch, on_tree=seen)
    host = socket.gethostname()
    parts = {part.log_name: part for part in result.parts}
    nodes = [NodeLaunch(i, host, part.pid, part.exit_code, part.ended_s, seen.group.get(i), seen.ranks.get(i, {}),
                        part.state, devices[i])
             for i, part in enumerate(parts[f"node{i}"] for i in range(launcher.nnodes))]
    write_nodes(out_dir, NodesLaunch("torchrun", launcher.nproc, at, out_dir.name, rdzv.join_timeout_s, nodes))
    return result
