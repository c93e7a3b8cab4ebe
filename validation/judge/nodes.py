"""Each node of a launch of several nodes, as the findings read it: its host, its agent's log and
how the agent ended (its exit, the last error torchrun's agent itself reported), which ranks ran
on it, how long its ranks' steps took and how late they came.

Ranks are placed on nodes by what the launch saw of each node's workers (nodes.json), else by
the heartbeats' ``host`` (when every node has its own) or ``node`` (torchrun's node rank). How
late a node comes: for each step, each rank's time of entering each stage it reports, less the
earliest rank's; a rank's lateness is the median over steps of its largest such delay, a node's
that of its latest rank. In lock-step training every rank waits for the slowest in the
collectives, so step times agree and only lateness tells the straggler, where the trainer
writes a stage record before its collectives (nsa.train does: forward, backward, optimizer).
"""
from __future__ import annotations

import signal
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from validation.contract.nodes import NodeLaunch, NodesLaunch, read_nodes
from validation.contract.stacks import read_index
from validation.contract.torchrun_log import (AgentSeen, AttemptEnd, RankFailure, agent_said, attempt_ends,
                                              rank_failures, worker_said)


@dataclass(frozen=True)
class NodeEvidence:
    index: int
    log: str
    """Its agent's stderr, relative to the run directory."""
    host: str | None = None
    exit_code: int | None = None
    """Its agent's exit code; None: killed by the harness, or not known."""
    ended_s: float | None = None
    """Seconds from the launch to its agent's exit, where known."""
    group_rank: int | None = None
    ranks: list[int] = field(default_factory=list)
    """Its ranks; [] when none of its workers ran (it never joined, or none were seen)."""
    said: str | None = None
    """The last error its agent itself reported, else its own last line (never a worker's:
    contract/torchrun_log/said.py ``agent_said``)."""
    step_time_s: float | None = None
    """Median step time of its ranks."""
    lateness_s: float | None = None
    """How late its latest rank enters the stages of a step (the module's docstring)."""
    state: str | None = None
    """Its agent's process state when the harness stopped it still running ('stopped', 'sleeping',
    ...; validation/contract/nodes.py); None when it exited, or not known."""
    devices: str | None = None
    """The CUDA_VISIBLE_DEVICES the harness gave its agent; None where it gave none."""
    worker_said: str | None = None
    """The exception of the last traceback a worker of it wrote into its log without a rank prefix
    (before its process group, or a handler of its own printing it; ``worker_said``); None where
    there is none. A ``[rankN]:`` traceback is that rank's failure, read as such."""

    @property
    def name(self) -> str:
        return f"node {self.index}"


@dataclass(frozen=True)
class NodesEvidence:
    launcher: str
    rdzv_endpoint: str
    join_timeout_s: float
    nodes: list[NodeEvidence]
    slurm_job_id: str | None = None
    slurm_step: str | None = None
    slurm_stopped: str | None = None
    """How Slurm ended the step without the harness asking (validation/contract/nodes.py)."""

    def of_rank(self, rank: int) -> NodeEvidence | None:
        return next((n for n in self.nodes if rank in n.ranks), None)

    @property
    def one_host(self) -> bool:
        """Every node's agent ran on one host, as the launch names it (none unnamed)."""
        hosts = {n.host for n in self.nodes}
        return len(hosts) == 1 and None not in hosts

    @classmethod
    def from_json(cls, data: Any) -> NodesEvidence | None:
        if not data:
            return None
        return cls(**{**data, "nodes": [NodeEvidence(**n) for n in data["nodes"]]})


def node_logs(out_dir: Path) -> list[Path]:
    """Every node's agent log of a launch of several nodes ([] for a run of one node)."""
    launch = read_nodes(out_dir)
    return [out_dir / n.stderr for n in launch.nodes] if launch is not None else []


def node_failures(out_dir: Path) -> dict[int, RankFailure]:
    """How each rank ended, read from every node's agent log (torchrun reports each rank's end in
    its own node's log, ``agent_seen`` beside it); empty for a run of one node."""
    failures: dict[int, RankFailure] = {}
    for log in node_logs(out_dir):
        failures.update(rank_failures(log, seen=agent_seen(out_dir, log)))
    return failures


def agent_seen(out_dir: Path, log: Path, exit_code: int | None = None) -> AgentSeen:
    """What the harness saw of the torchrun agent whose log is ``log`` (AgentSeen): of a node of a
    launch of several, its agent's exit, the workers on it the harness found running as it stopped
    the run (the stacks it took), and its first global rank, its node rank times the processes per
    node (nodes.json); of a launch of one agent, ``exit_code`` (the run's, which is its agent's), its
    workers found running, and rank 0 first. Nothing of a log that is no node's of the launch."""
    taken = read_index(out_dir)
    launch = read_nodes(out_dir)
    if launch is None:
        return AgentSeen(exit_code, frozenset(t.pid for t in taken if t.rank is not None), 0)
    node = next((n for n in launch.nodes if n.stderr == log.name), None)
    if node is None:
        return AgentSeen()
    first = node.group_rank * launch.nproc_per_node if node.group_rank is not None else None
    running = frozenset(t.pid for t in taken if t.rank is not None and t.node == node.index)
    return AgentSeen(node.exit_code, running, first, node.index, launch.nproc_per_node)


def launch_attempts(out_dir: Path, stderr_path: Path, exit_code: int | None = None) -> list[AttemptEnd]:
    """Each failed attempt of the launch's workers by its agents' logs (``attempt_ends``): of a launch
    of several nodes, every node's, node by node, each agent counting its own attempts (one whose
    workers another node's failure ended starts them again with no failure line of its own); of a
    launch of one agent, its log's (``stderr_path``)."""
    logs = node_logs(out_dir) or [stderr_path]
    return [a for log in logs for a in attempt_ends(log, agent_seen(out_dir, log, exit_code))]


def killed_agents(launcher: str, nodes: Sequence[NodeLaunch | NodeEvidence], stopped: bool
                  ) -> list[NodeLaunch | NodeEvidence]:
    """The nodes whose torchrun agent itself a signal ended (its exit code < 0: kill -9 of the agent,
    the kernel's OOM killer, the node going down), first to end first. Under Slurm the task ends
    srun reports include the harness's own cancel, so there only a run the harness did not stop
    (``stopped``: its stall watch or timeout) counts."""
    if launcher != "torchrun" and stopped:
        return []
    killed = [n for n in nodes if n.exit_code is not None and n.exit_code < 0]
    return sorted(killed, key=lambda n: n.ended_s if n.ended_s is not None else float("inf"))


def killed_agent(launcher: str, nodes: Sequence[NodeLaunch | NodeEvidence], stopped: bool) -> NodeLaunch | NodeEvidence | None:
    """The first node to end of ``killed_agents``; None where none was."""
    return next(iter(killed_agents(launcher, nodes, stopped)), None)


def signal_name(num: int) -> str:
    """'SIGKILL' of 9; 'signal 64' of a number no signal has here."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def agent_killed(launcher: str, nodes: Sequence[NodeLaunch | NodeEvidence], stopped: bool) -> str | None:
    """'node 1's torchrun agent was killed by SIGKILL' where ``killed_agent`` finds one; else None."""
    node = killed_agent(launcher, nodes, stopped)
    return None if node is None else f"node {node.index}'s torchrun agent was killed by {signal_name(-node.exit_code)}"


def launch_agent_killed(out_dir: Path, stopped: bool) -> str | None:
    """``agent_killed`` of the launch that nodes.json records (None for a run of one node)."""
    launch = read_nodes(out_dir)
    return agent_killed(launch.launcher, launch.nodes, stopped) if launch is not None else None


def slurm_stopped(out_dir: Path) -> str | None:
    """How Slurm ended the run's step without the harness asking; None where it did not, or the
    run was no Slurm launch."""
    launch = read_nodes(out_dir)
    return launch.slurm_stopped if launch is not None else None


def node_evidence(out_dir: Path, heartbeats: dict[int, list[dict[str, Any]]],
                  rank_step_time_s: dict[int, float]) -> NodesEvidence | None:
    """The run's nodes (None for a run of one node): the ranks on each, their pace, and what each
    node's agent said."""
    launch = read_nodes(out_dir)
    if launch is None:
        return None
    # what each node's agent and its workers said last, in its log
    seen = {n.index: agent_seen(out_dir, out_dir / n.stderr) for n in launch.nodes}
    said = {n.index: (agent_said(out_dir / n.stderr, workers_ran=bool(n.ranks), seen=seen[n.index]),
                      worker_said(out_dir / n.stderr, seen=seen[n.index])) for n in launch.nodes}
    placed = _ranks_by_node(launch, heartbeats)
    # how late a node comes is against the other nodes; within one node it says nothing of nodes (a
    # one-node torchrun launch, with no nodes.json, has no such figure either)
    late = lateness(heartbeats) if len(launch.nodes) > 1 else {}
    nodes = []
    for n in launch.nodes:
        ranks = placed.get(n.index, [])
        times = [rank_step_time_s[r] for r in ranks if r in rank_step_time_s]
        lates = [late[r] for r in ranks if r in late]
        agent, worker = said[n.index]
        nodes.append(NodeEvidence(n.index, n.stderr, n.host, n.exit_code, n.ended_s, n.group_rank, ranks, agent,
                                  round(statistics.median(times), 6) if times else None,
                                  round(max(lates), 6) if lates else None, n.state, n.devices, worker))
    return NodesEvidence(launch.launcher, launch.rdzv_endpoint, launch.join_timeout_s, nodes, launch.slurm_job_id,
                         launch.slurm_step, launch.slurm_stopped)


def _ranks_by_node(launch: NodesLaunch, heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, list[int]]:
    out: dict[int, set[int]] = {n.index: set(n.ranks) for n in launch.nodes}
    for rank, recs in heartbeats.items():
        if any(rank in ranks for ranks in out.values()) or not recs:
            continue
        index = _place(recs[-1], launch.nodes)
        if index is not None:
            out[index].add(rank)
    return {i: sorted(r) for i, r in out.items() if r}


def _place(rec: dict[str, Any], nodes: list[NodeLaunch]) -> int | None:
    """The node a heartbeat's writer ran on: by its host where each node has its own, by its
    node rank where the launch saw that node's, the only node where there is one. A host is told
    by its short name where the whole one is not the launch's: Slurm's launch records each node's
    ``hostname --short``, and a trainer's ``socket.gethostname()`` is a FQDN on hosts named so."""
    host = rec.get("host")
    if isinstance(host, str) and host:
        for name in (lambda h: h, _short):
            hosts = [name(n.host) if n.host else None for n in nodes]
            if hosts.count(name(host)) == 1:
                return nodes[hosts.index(name(host))].index
    by_group = {n.group_rank: n.index for n in nodes if n.group_rank is not None}
    if isinstance(rec.get("node"), int) and rec["node"] in by_group:
        return by_group[rec["node"]]
    return nodes[0].index if len(nodes) == 1 else None


def _short(host: str) -> str:
    """A host name's first label ('gpu01' of 'gpu01.cluster.example'); an address as it is."""
    return host if host.replace(".", "").isdigit() or ":" in host else host.split(".", 1)[0]


def _delays(heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, dict[int, list[float]]]:
    """Rank -> step -> its delay entering each stage of the step that every rank reports, after the
    earliest rank; {} with fewer than two ranks."""
    first: dict[int, dict[tuple[int, str], float]] = {}
    for rank, recs in heartbeats.items():
        seen = first.setdefault(rank, {})
        for r in recs:
            step, stage, t = r.get("step"), r.get("stage"), r.get("time")
            if isinstance(step, int) and isinstance(stage, str) and isinstance(t, (int, float)):
                seen.setdefault((step, stage), float(t))
    if len(first) < 2:
        return {}
    common = set.intersection(*(set(s) for s in first.values()))
    delays: dict[int, dict[int, list[float]]] = {rank: {} for rank in first}
    for key in sorted(common):
        earliest = min(s[key] for s in first.values())
        for rank, s in first.items():
            delays[rank].setdefault(key[0], []).append(s[key] - earliest)
    return delays


def lateness(heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Rank -> the median over steps of its largest delay entering a stage after the earliest rank."""
    return {rank: statistics.median(max(d) for d in by_step.values())
            for rank, by_step in _delays(heartbeats).items() if by_step}


def nearness(heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Rank -> the median over steps of its smallest delay entering a stage after the earliest rank,
    over the steps of two stages or more that every rank reports ({} where there is none). Ranks that
    meet in a collective each step leave it together, so a rank late to one stage of a step comes
    to the stage after the collective with the others (the others waited for it); a rank that is
    as late at every stage runs that far behind them, and nothing shows them waiting."""
    out = {}
    for rank, by_step in _delays(heartbeats).items():
        staged = [min(d) for d in by_step.values() if len(d) >= 2]
        if staged:
            out[rank] = statistics.median(staged)
    return out
