"""A phase run as two nodes x one process on this host: two torchrun agents meeting at a c10d
rendezvous on localhost, the test trainer (tests/trainers/native_train.py) averaging its loss over
gloo. GO when healthy; the right finding, naming the node, when one node never joins (within the
join timeout and a few seconds, not at the phase timeout), when one node's rank hangs (the stall
watch, every rank's stack with its node), when one node's rank is killed (and how the other node
ended), when one node straggles; and nothing left running after any of them."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from validation import REPO_ROOT
from validation.contract.nodes import NODE_ENV, NODES_FILE, read_nodes
from validation.judge.findings import Severity, find, recommendations
from validation.launch import nodes as local_nodes
from validation.launch.process import Command
from validation.report.tables import reproduce_rows
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.runbook.types import Launcher, Rendezvous
from validation.session.session import AcceptanceSession, SessionOptions

pytestmark = [pytest.mark.distributed, pytest.mark.multi_node]

NATIVE = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
JOIN_S = 6
#: the stall time the runbook check allows beside JOIN_S (join + 10 s for the agents)
STALL_S = 16
#: before the first step: four processes importing torch at once on a loaded two-core CI box take
#: longer than STALL_S, and no test here is about a slow start
STARTUP_S = 60
#: seconds beyond the join timeout (or the stall time) within which the harness must report
SLACK_S = 10.0
FAULT = "TEST_TRAINER_FAULT"


def _runbook(tmp_path: Path, steps: int) -> Path:
    data: dict[str, Any] = {
        "name": "nodes", "profiles": ["cpu"], "trainer": NATIVE,
        "defaults": {"steps": steps, "timeout_s": 120, "stall_s": STALL_S, "startup_s": STARTUP_S,
                     "env": {"OMP_NUM_THREADS": 1}},
        "phases": [{"name": "two_nodes", "kind": "train", "gates": [
            {"metric": "loss_finite", "op": "==", "threshold": 1},
            {"metric": "idle_ranks", "op": "==", "threshold": 0}],
            "launcher": {"kind": "torchrun", "nproc": 1, "nnodes": 2,
                         "rdzv": {"endpoint": "localhost:0", "join_timeout_s": JOIN_S}}}]}
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path / "nodes.yaml"


class TwoNodes:
    """One point of two nodes x one process, run through the session in this process."""

    def __init__(self, tmp_path: Path, steps: int = 8):
        self.results = tmp_path / "results"
        [self.point] = expand(load_runbook(_runbook(tmp_path, steps)), load_profile("cpu"))
        started = time.time()
        self.rec = AcceptanceSession(SessionOptions(self.results)).run_point(self.point)
        self.reported = time.time()
        self.took = self.reported - started
        self.dir = self.results / self.rec.out_dir
        self.findings = find([self.rec])
        self.nodes = read_nodes(self.dir)
        assert_nothing_left(tmp_path)

    def finding(self, kind: str) -> str:
        [f] = [f for f in self.findings if f.kind == kind]
        return f.title + "\n" + "\n".join(f.detail)

    def node_of(self, rank: int) -> int:
        [node] = [n.index for n in self.nodes.nodes if rank in n.ranks]
        return node

    def beats(self, rank: int) -> list[dict]:
        return [json.loads(line) for line in (self.dir / f"heartbeat_rank{rank}.jsonl").read_text().splitlines()]


def assert_nothing_left(tmp_path: Path) -> None:
    """No process whose command line names the test's directory (agents, workers) is alive."""
    me = psutil.Process().pid
    left = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["pid"] != me and p.info["status"] != psutil.STATUS_ZOMBIE and str(tmp_path) in " ".join(
                p.info["cmdline"] or []):
            left.append(p)
    for p in left:
        p.kill()
    assert not left, f"left running: {[(p.pid, ' '.join(p.info['cmdline'])[:120]) for p in left]}"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> TwoNodes:
    """One healthy two-node point for the tests that only read it (its record, run directory and
    report rows): each launch is four processes importing torch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(FAULT, raising=False)
        return TwoNodes(tmp_path_factory.mktemp("healthy"))


def test_two_healthy_nodes_are_go_with_each_rank_placed_on_its_node(healthy):
    run = healthy
    assert run.rec.status == "PASS", run.rec.reason
    assert run.rec.world_size == 2 and run.rec.exit_code == 0
    assert {"node0.stderr.log", "node1.stderr.log", NODES_FILE} <= set(run.rec.evidence.files)
    launch = run.nodes
    assert launch.launcher == "torchrun" and launch.rdzv_endpoint.startswith("localhost:")
    assert not launch.rdzv_endpoint.endswith(":0") and launch.rdzv_id == run.dir.name
    assert sorted(r for n in launch.nodes for r in n.ranks) == [0, 1]
    assert all(n.exit_code == 0 and len(n.ranks) == 1 for n in launch.nodes)
    for n in launch.nodes:  # torchrun's node rank is the one the node's worker wrote in its heartbeats
        [rank] = n.ranks
        assert {b["node"] for b in run.beats(rank)} == {n.group_rank}
    assert "--rdzv_backend=c10d" in run.rec.command and f"--rdzv_conf=join_timeout={JOIN_S}" in run.rec.command
    info = run.finding("nodes")
    assert info.startswith("2 nodes in two_nodes [default]: torchrun, c10d rendezvous at localhost:")
    assert "node 0 (host " in info and "node 1 (host " in info and "agent exit 0" in info
    assert not [f for f in run.findings if f.severity != "info"], [f.title for f in run.findings]
    print(f"\nhealthy: GO, point {run.rec.wall_s:.1f} s; {info}")


@pytest.mark.parametrize("visible, expected", [
    ("0,1,2,3", ["0,1", "2,3"]),  # 2 nodes x 2: each node its own pair, as separate hosts
    ("4, 6", ["4", "6"]),  # a launch already pinned (Slurm's allocation): its GPUs are sliced
    ("0", [None, None]),  # fewer GPUs than ranks: nothing pinned (CPU runs, or a shared GPU by choice)
    ("", [None, None]),
])
def test_each_node_on_a_gpu_host_gets_gpus_of_its_own(visible, expected):
    nproc = 2 if visible.startswith("0,1,2") else 1
    devices = local_nodes.node_devices(2, nproc, {"CUDA_VISIBLE_DEVICES": visible})
    assert devices == expected
    commands = local_nodes.agent_commands(["torchrun"], devices)
    assert [c.env.get("CUDA_VISIBLE_DEVICES") for c in commands] == expected
    assert [c.env[NODE_ENV] for c in commands] == ["0", "1"]


def test_every_agent_of_a_two_node_launch_gets_the_runbooks_torchrun_options(tmp_path, monkeypatch):
    """A runbook's torchrun_args (--max-restarts=1) beside nnodes reached no agent: the runbook check
    accepts them there (refusing only the rendezvous's own options), and the agents ran without
    them, so a phase asking for restarts across nodes never restarted."""
    class Launched(Exception):
        pass

    def run_group(commands, **_):
        raise Launched(commands)

    monkeypatch.setattr(local_nodes.runner, "run_group", run_group)
    launcher = Launcher("torchrun", 1, "nsa.train", ("--max-restarts=1",), 2,
                        Rendezvous(join_timeout_s=JOIN_S, endpoint="localhost:0"))
    with pytest.raises(Launched) as launched:
        local_nodes.run_local(launcher, "nsa.train", ["--steps", "2"], env={}, cwd=tmp_path, timeout_s=60,
                              out_dir=tmp_path, on_poll=None, watch=None)
    argvs = [c.argv for c in launched.value.args[0]]
    assert len(argvs) == 2
    for argv in argvs:
        assert "--max-restarts=1" in argv and argv.index("--max-restarts=1") < argv.index("--"), argv


def test_a_cpu_host_pins_no_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(local_nodes, "no_gpu_here", lambda: True)  # no device node: torch is not asked
    assert local_nodes.node_devices(2, 1, {}) == [None, None]
    monkeypatch.setattr(local_nodes, "no_gpu_here", lambda: False)
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert local_nodes.node_devices(2, 1, {}) == [None, None]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert local_nodes.node_devices(2, 1, {}) == ["0", "1"]


def test_the_reports_process_line_of_a_two_node_point_runs_every_node_as_printed(tmp_path, healthy):
    """The report's 'process' line held one agent's command: pasted, that lone agent waited the
    join timeout for a second node and failed (RendezvousTimeoutError). Then every agent's, ended by
    a bare `wait`: the line exited 0 when a node's agent failed, and its agents met at the run's
    port, which another process may hold by the time it is pasted."""
    run = healthy
    assert run.rec.status == "PASS", run.rec.reason
    [row] = reproduce_rows([run.rec])
    stored = {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()}
    env = {k: v for k, v in os.environ.items() if k != FAULT}
    host, port = run.nodes.rdzv_endpoint.rsplit(":", 1)
    with socket.create_server(("127.0.0.1", int(port))):  # the run's port, another process's now
        out = subprocess.run(["bash", "-c", row["process"]], cwd=tmp_path, capture_output=True, text=True,
                             timeout=JOIN_S + 60, env=env)
    assert out.returncode == 0, row["process"] + "\n" + out.stderr[-3000:]
    [new] = re.findall(r"^writing into (\S+)$", out.stderr, re.M)  # a new directory: the stored run stays as it was
    assert {p.name: p.read_bytes() for p in run.dir.iterdir() if p.is_file()} == stored
    assert {p.name for p in Path(new).glob("heartbeat_rank*.jsonl")} == {"heartbeat_rank0.jsonl", "heartbeat_rank1.jsonl"}
    crashed = subprocess.run(["bash", "-c", row["process"]], cwd=tmp_path, capture_output=True, text=True,
                             timeout=JOIN_S + 60, env={**env, FAULT: "crash@2"})
    assert crashed.returncode == 1, row["process"] + "\n" + crashed.stderr[-3000:]
    assert "node 0's torchrun agent exited 1" in crashed.stderr, crashed.stderr[-3000:]
    assert_nothing_left(run.results.parent)


def test_a_node_that_never_joins_is_named_at_the_join_timeout(tmp_path, monkeypatch):
    """Node 1's agent dies before it reaches the rendezvous (as a node whose start fails): node
    0 waits the join timeout, then gives up; the finding names node 1 and its log."""
    monkeypatch.delenv(FAULT, raising=False)
    real = local_nodes.agent_commands

    def node_1_down(argv: list[str], devices) -> list[Command]:
        first, second = real(argv, devices)
        down = [sys.executable, "-c", "import sys; sys.exit('node 1: cannot start (injected by the test)')"]
        return [first, Command(down, second.log_name, second.env)]

    monkeypatch.setattr(local_nodes, "agent_commands", node_1_down)
    run = TwoNodes(tmp_path)
    assert run.rec.status == "FAIL" and not run.rec.timed_out and run.rec.stalled_s is None, run.rec.reason
    # neither the verdict nor a crash finding claims a crash of a trainer whose ranks never started
    assert run.rec.reason == "trainer ended before its first step (exit code 1)", run.rec.reason
    assert [f.kind for f in run.findings if f.severity == Severity.CRITICAL] == ["node_missing"], run.findings
    node0 = run.nodes.nodes[0]
    assert JOIN_S <= node0.ended_s <= JOIN_S + SLACK_S, node0
    assert run.rec.wall_s <= JOIN_S + SLACK_S, f"reported {run.rec.wall_s:.1f}s after the launch"
    text = run.finding("node_missing")
    assert text.startswith("node 1 never joined the rendezvous in two_nodes [default]: no rank started"), text
    assert f"join timeout {JOIN_S} s): node 0 after" in text and "RendezvousTimeoutError" in text, text
    assert "node 1 never joined: its agent exit 1 after" in text and "node 1: cannot start" in text, text
    assert "log node1.stderr.log" in text
    assert any("A node never joined the rendezvous" in line for line in recommendations(run.findings))
    print(f"\nnever joins (join timeout {JOIN_S} s): node 0 gave up {node0.ended_s:.1f} s after the launch, "
          f"recorded {run.rec.wall_s:.1f} s after it; {text}")


def test_a_node_whose_rank_hangs_is_named_with_every_ranks_stack(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT, "hang_rank:1@4")
    run = TwoNodes(tmp_path, steps=40)
    assert run.rec.status == "FAIL" and run.rec.reason.startswith("stalled"), run.rec.reason
    last = max(b["time"] for r in (0, 1) for b in run.beats(r))
    assert run.reported - last <= STALL_S + SLACK_S, f"reported {run.reported - last:.1f}s after the last progress"
    hung, other = run.node_of(1), run.node_of(0)
    taken = {t.rank: t for t in run.rec.evidence.taken_stacks}
    assert set(taken) == {0, 1} and taken[1].node == hung and taken[0].node == other
    assert f"rank 1 (RANK), node {hung}" in (run.dir / taken[1].path).read_text()
    text = run.finding("node_hung")
    assert text.startswith(f"node {hung} hung in two_nodes [default] (no progress for "), text
    assert f"node {hung}'s rank 1 in hang_forever" in text, text
    assert f"waiting for it: node {other}'s rank 0 in all_reduce" in text, text
    stall = run.finding("stall")  # the harness's stall finding says each rank's node through its stack
    assert f"node {hung}, taken by the harness" in stall
    print(f"\nhang (stall_s {STALL_S}): recorded {run.reported - last:.1f} s after the last heartbeat; {text}")


def test_a_node_whose_rank_is_killed_is_named_with_how_the_other_ended(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT, "kill_rank:1@4")
    run = TwoNodes(tmp_path, steps=40)
    assert run.rec.status == "FAIL" and run.rec.exit_code == 1 and not run.rec.timed_out, run.rec.reason
    killed_at = max(b["time"] for b in run.beats(1))
    assert run.reported - killed_at <= SLACK_S, f"reported {run.reported - killed_at:.1f}s after the kill"
    killed, other = run.node_of(1), run.node_of(0)
    text = run.finding("node_failed")
    assert text.startswith(f"node {killed}'s rank 1 was killed by SIGKILL in two_nodes [default] "
                           f"(log node{killed}.stderr.log); the other nodes: node {other}: rank 0"), text
    assert "agent exit 1 after" in text.split("\n")[0], text
    assert run.rec.evidence.stderr_log == f"node{killed}.stderr.log"  # the node that failed first
    print(f"\nkill: recorded {run.reported - killed_at:.1f} s after rank 1's last heartbeat; {text}")


def test_a_straggler_node_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT, "slow_rank:1@2")
    run = TwoNodes(tmp_path)
    assert run.rec.status == "PASS", run.rec.reason
    slow = run.node_of(1)
    text = run.finding("straggler")
    assert text.startswith(f"straggler node {slow} in two_nodes [default]: its rank(s) 1 enter each step's "
                           "stages "), text
    lateness = {n.index: n.lateness_s for n in run.rec.evidence.nodes.nodes}
    assert lateness[slow] >= 0.15 and lateness[1 - slow] < 0.05, lateness
    print(f"\nstraggler: {text}")


@pytest.mark.parametrize("moment", ["launch", "step 5"])
def test_ctrl_c_during_a_two_node_point_leaves_no_process_and_no_run_directory(tmp_path, monkeypatch, moment):
    """SIGINT to the CLI while the agents meet (their logs just opened) and mid-training: exit
    130, no process of either node left, the interrupted point's run directory removed."""
    monkeypatch.delenv(FAULT, raising=False)
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(_runbook(tmp_path, 100000)),
                             "--results-dir", str(results), "--no-plots"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != FAULT})
    deadline = time.monotonic() + 90
    while not _reached(results, moment):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert_nothing_left(tmp_path)
    assert not [p for p in (results / "runs").rglob("*") if p.is_dir() and len(p.name) == 12], "run directory left"
    print(f"\nCtrl-C at {moment}: exit 130, nothing left")


def _reached(results: Path, moment: str) -> bool:
    if moment == "launch":
        return any(results.rglob("node1.stderr.log"))
    rows = [p.read_text().count("\n") for p in results.rglob("training.csv")]
    return bool(rows) and rows[0] > int(moment.split()[1])
