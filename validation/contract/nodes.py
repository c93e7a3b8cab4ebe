"""``nodes.json``: what the harness knows of each node of a launch of several nodes (one torchrun
agent per node, meeting at a c10d rendezvous, on this host or through Slurm). The launch stage
writes it into the run directory when the run ends; the judge reads it beside the trainer's files.

A node is named by its index in the launch: the i-th agent the harness started on this host (its
logs ``node{i}.stdout.log`` and ``node{i}.stderr.log``), or Slurm's task i (one task per node,
the same log names). torchrun's own node rank (``GROUP_RANK``) follows from the rendezvous, not
from the launch order (c10d ignores ``--node_rank``), so it is recorded beside the index when a
node's workers said it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

NODES_FILE = "nodes.json"
#: the launch's node index in the environment of every process of a node the harness started here
NODE_ENV = "VALIDATION_NODE"
#: Slurm's task id: one task (one torchrun agent) per node, inherited by the agent's workers
SLURM_TASK_ENV = "SLURM_PROCID"


def node_of(environ: Mapping[str, str]) -> int | None:
    """The node index a process's environment holds, None when it holds none."""
    for var in (NODE_ENV, SLURM_TASK_ENV):
        value = environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def node_log(index: int, stream: str) -> str:
    """``node{i}.stdout.log`` or ``node{i}.stderr.log``."""
    return f"node{index}.{stream}.log"


@dataclass(frozen=True)
class NodeLaunch:
    index: int
    host: str | None = None
    """The machine it ran on, where known."""
    pid: int | None = None
    """Its torchrun agent's process, where it ran on this host (one the harness started, or srun's
    task here)."""
    exit_code: int | None = None
    """Its agent's exit code; None when the harness killed it still running, or it is not known."""
    ended_s: float | None = None
    """Seconds from the launch to its agent's exit; None when not known."""
    group_rank: int | None = None
    """torchrun's node rank (GROUP_RANK) its workers were given; None: no worker of it was seen."""
    ranks: dict[int, int] = field(default_factory=dict)
    """Rank -> pid of each worker seen on it."""
    state: str | None = None
    """Its agent's process state when the harness stopped it still running (psutil's: 'stopped'
    for a SIGSTOP or a debugger, 'sleeping', 'disk-sleep', ...); None when it exited by itself,
    or the harness could not see it (a node under Slurm on another host, or one srun reported the
    end of)."""
    devices: str | None = None
    """The CUDA_VISIBLE_DEVICES the harness gave its agent (nodes on one GPU host, each with GPUs of
    its own); None where it gave none."""

    @property
    def stdout(self) -> str:
        return node_log(self.index, "stdout")

    @property
    def stderr(self) -> str:
        return node_log(self.index, "stderr")


@dataclass(frozen=True)
class NodesLaunch:
    launcher: str
    """'torchrun' (every agent on this host) or 'slurm' (srun of torchrun)."""
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str
    join_timeout_s: float
    nodes: list[NodeLaunch]
    slurm_job_id: str | None = None
    slurm_step: str | None = None
    """``job.step`` of the srun that ran the trainer."""
    slurm_stopped: str | None = None
    """How Slurm ended the step when the harness did not ask it to (scancel by someone else, the
    job's time limit, preemption, a node failure): slurmstepd's banner from a node's log, '*** STEP
    14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***', and the job's state; None otherwise."""


def write_nodes(run_dir: Path, launch: NodesLaunch) -> None:
    tmp = run_dir / (NODES_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(launch), indent=2))
    tmp.replace(run_dir / NODES_FILE)


def read_nodes(run_dir: Path) -> NodesLaunch | None:
    """The run's nodes; None for a run of one node. The file is the harness's own: one that does
    not parse is a harness bug, and raises."""
    path = run_dir / NODES_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    nodes = [NodeLaunch(**{**n, "ranks": {int(r): pid for r, pid in n.get("ranks", {}).items()}})
             for n in data.pop("nodes")]
    return NodesLaunch(**data, nodes=nodes)
