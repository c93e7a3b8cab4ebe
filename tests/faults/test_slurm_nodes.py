"""Which rank ran on which node of a launch through the Slurm launcher (srun of torchrun), with
Slurm's commands stood in for by tests/faults/fake_slurm.py: two nodes x one process, every node
this host, each task started outside srun's process tree as slurmstepd starts it.

nodes.json under Slurm once kept no ranks, no node rank and no agent pid (the launcher never
looked at the step's processes: they are not srun's descendants). With every node on one host
the heartbeats' ``host`` cannot tell the nodes apart, and their ``node`` (torchrun's node rank)
maps to a launch node only through the node rank nodes.json records: a healthy run's nodes
finding said 'no rank ran' of both nodes, and a hung rank's finding named no node ('a node
hung ... rank 1 in hang_forever'). And a step Slurm cancels without the harness asking (the fake's
stand-in for someone's scancel) is no crash of the trainer.

Test trainer outside the nsa package: tests/trainers/native_train.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

from tests.faults import _util as U
from tests.faults import fake_slurm
from validation.contract.nodes import read_nodes
from validation.judge.findings import Severity, find, recommendations
from validation.judge.record import Status

pytestmark = [pytest.mark.faults, pytest.mark.distributed, pytest.mark.multi_node]

NATIVE = {"name": "native", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
JOIN_S, STALL_S = 6, 16
#: startup_s of the launch whose every rank hangs before its first step: its stall is declared only
#: once startup_s has passed, so the test waits it out whole. Its ranks need only be running by
#: then (agents joined, ranks spawned and listed in nodes.json), which took under 10 s on two cores
#: with four busy loops beside it; the shared U.STARTUP_S would make it wait a minute.
HUNG_AT_START_STARTUP_S = 30.0


@pytest.fixture
def fake_allocation(tmp_path, monkeypatch):
    """Slurm's commands on PATH, the harness inside a two-node allocation of the fake Slurm."""
    monkeypatch.delenv("TEST_TRAINER_FAULT", raising=False)
    bin_dir = fake_slurm.install(tmp_path / "slurm_bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4343")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")


def _run(tmp_path: Path, steps: int, startup_s: float = U.STARTUP_S):
    rec = _record(tmp_path, steps, startup_s)
    return rec, read_nodes(tmp_path / "results" / rec.out_dir)


def _record(tmp_path: Path, steps: int, startup_s: float = U.STARTUP_S, stall_s: float = STALL_S,
            env: dict | None = None, **launcher):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    phase = {"name": "srun_nodes", "kind": "train", "steps": steps, "timeout_s": 120, "stall_s": stall_s,
             "startup_s": startup_s, "env": {"OMP_NUM_THREADS": 1, **(env or {})},
             "launcher": {"kind": "slurm", "nodes": 2, "nproc_per_node": 1,
                          "rdzv": {"port": port, "join_timeout_s": JOIN_S}, **launcher},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    return U.run_one_point(tmp_path, "slurm_nodes", NATIVE, phase)


def test_a_slurm_launch_records_each_nodes_ranks_and_agent(tmp_path, fake_allocation):
    rec, launch = _run(tmp_path, steps=6)
    assert rec.status == Status.PASS, rec.reason
    # c10d gives ranks in the order the agents join, so either task may hold rank 0
    assert sorted(r for n in launch.nodes for r in n.ranks) == [0, 1] and all(len(n.ranks) == 1 for n in launch.nodes), \
        launch
    agents = [n.pid for n in launch.nodes]
    assert all(agents) and agents[0] != agents[1] and not set(agents) & {p for n in launch.nodes for p in
                                                                             n.ranks.values()}, launch
    for node in launch.nodes:  # each rank's pid and node rank are its own: its heartbeats carry them
        [(rank, pid)] = node.ranks.items()
        first = json.loads((tmp_path / "results" / rec.out_dir / f"heartbeat_rank{rank}.jsonl").open().readline())
        assert (first["pid"], first["node"]) == (pid, node.group_rank), (first, launch)
    [info] = [f for f in find([rec]) if f.kind == "nodes"]
    for node, line in zip(launch.nodes, info.detail):
        assert line.startswith(f"node {node.index} (host ") and f"rank {[*node.ranks][0]} last heartbeat step 6" in line, \
            info.detail


def test_a_slurm_launchs_torchrun_args_reach_every_agent(tmp_path, fake_allocation, monkeypatch):
    """A Slurm launcher took no torchrun_args, so a run under Slurm could not ask torchrun for
    --max-restarts. Every rank crashing at step 2 of every attempt, one restart allowed: both nodes'
    agents restart their workers once, and the verdict names the attempt that was restarted. With
    the rendezvous's store shared with the workers (torch's default), the restarted workers often
    hang in init_process_group (docs/guides/multi-node.md): the phase turns that off, and its stall
    watch leaves the restart its start-up time."""
    monkeypatch.setenv("TEST_TRAINER_FAULT", "crash@2")
    rec = _record(tmp_path, steps=6, stall_s=STALL_S + U.STARTUP_S, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": 1},
                  torchrun_args=["--max-restarts=1"])
    assert rec.status == Status.FAIL and rec.reason.startswith("trainer crashed"), rec.reason
    restarted = {a.node for a in rec.evidence.attempts if a.attempt == 1 and a.restarted}
    assert restarted == {0, 1}, rec.evidence.attempts
    assert "earlier attempts, each followed by torchrun starting the workers again" in "\n".join(
        line for f in find([rec]) for line in f.detail), [f.detail for f in find([rec])]


def test_a_hung_rank_under_slurm_is_named_with_its_node(tmp_path, fake_allocation, monkeypatch):
    monkeypatch.setenv("TEST_TRAINER_FAULT", "hang_rank:1@4")
    rec, launch = _run(tmp_path, steps=400)
    assert rec.status == Status.FAIL and rec.stalled_s is not None, rec.reason
    [hung_node] = [n.index for n in launch.nodes if 1 in n.ranks]
    # the node Slurm's task id (SLURM_PROCID) gave the hung rank's stack, taken from its process
    assert {t.rank: t.node for t in rec.evidence.taken_stacks}[1] == hung_node, rec.evidence.taken_stacks
    [hung] = [f for f in find([rec]) if f.kind == "node_hung"]
    assert hung.title.startswith(f"node {hung_node} hung in srun_nodes [default] (no progress for "), hung.title
    assert f"node {hung_node}'s rank 1 in hang_forever" in hung.title, hung.title
    assert f"waiting for it: node {1 - hung_node}'s rank 0" in hung.title, hung.title


def test_a_step_slurm_cancelled_is_no_crash_of_the_trainer(tmp_path, fake_allocation, monkeypatch):
    """Someone's scancel of the job halfway (2026-11-27, Slurm 22.05 here): the report said 'crash in
    srun_phase [default]: exit code 1' with advice to read the traceback and fix it, while slurmstepd
    had written '*** STEP 14.1 ON vm CANCELLED AT ... ***' into the node's log and the agent had
    only stopped its workers on Slurm's SIGTERM."""
    monkeypatch.setenv(fake_slurm.CANCEL_ENV, "10")
    rec, launch = _run(tmp_path, steps=100000)
    assert rec.status == Status.FAIL and rec.stalled_s is None and not rec.timed_out, rec.reason
    assert rec.reason.startswith("stopped by Slurm, not by the trainer or the harness: node 0: *** STEP 4343.1 ON "), \
        rec.reason
    # srun's exit: 1 where the agent stopped its workers on Slurm's SIGTERM, 143 where the SIGTERM came
    # while the agent was still starting (a loaded box) and ended it
    assert " CANCELLED AT " in rec.reason and re.search(r"\*\*\* \(exit code (1|143)\)$", rec.reason), rec.reason
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["slurm_stopped"], [f.title for f in found]
    [f] = [f for f in found if f.kind == "slurm_stopped"]
    assert f.title.startswith("Slurm ended the step in srun_nodes [default], not the trainer and not the harness: "
                              "node 0: *** STEP 4343.1 ON "), f.title
    [advice] = recommendations(found)
    assert "scancel" in advice and "traceback" not in advice, advice


def test_ranks_that_hang_before_their_first_heartbeat_under_slurm_are_no_unfinished_rendezvous(
        tmp_path, fake_allocation, monkeypatch):
    """Every rank hung before its first heartbeat under real Slurm (2026-11-27): with nodes.json's
    rank maps empty, the report's critical finding was 'the nodes never completed the rendezvous
    ... no rank started', and its advice about an agent stuck before any rank started, beside the
    stall finding holding both ranks' stacks."""
    monkeypatch.setenv("TEST_TRAINER_FAULT", "hang_all@1")
    rec, launch = _run(tmp_path, steps=400, startup_s=HUNG_AT_START_STARTUP_S)
    assert rec.status == Status.FAIL and rec.stalled_s is not None, rec.reason
    assert sorted(r for n in launch.nodes for r in n.ranks) == [0, 1], launch
    found = find([rec])
    kinds = [f.kind for f in found if f.severity == Severity.CRITICAL]
    assert "stall" in kinds and not {"node_stuck", "rendezvous_unanswered"} & set(kinds), [f.title for f in found]
    assert not [f for f in found if "rendezvous" in f.title], [f.title for f in found]
    [hung] = [f for f in found if f.kind == "node_hung"]  # every rank hung: both nodes named
    assert hung.title.startswith("node 0, node 1 hung in srun_nodes [default]"), hung.title


def test_a_killed_rank_under_slurm_is_named_with_its_node(tmp_path, fake_allocation, monkeypatch):
    """Rank 1 SIGKILLed: its node is the one named, and the record's log is that node's (with
    nodes.json's rank maps empty, 'rank 1 (node unknown) was killed by SIGKILL')."""
    monkeypatch.setenv("TEST_TRAINER_FAULT", "kill_rank:1@4")
    rec, launch = _run(tmp_path, steps=400)
    assert rec.status == Status.FAIL and rec.reason.startswith("trainer crashed"), rec.reason
    run_dir = tmp_path / "results" / rec.out_dir
    # the node whose torchrun agent reported rank 1's end (its failure summary: 'rank : 1 (local_rank: 0)')
    [killed] = [i for i in (0, 1) if re.search(r"rank\s+: 1 \(local_rank", (run_dir / f"node{i}.stderr.log").read_text())]
    [f] = [f for f in find([rec]) if f.kind == "node_failed"]
    assert f.title.startswith(f"node {killed}'s rank 1 was killed by SIGKILL in srun_nodes [default] "
                              f"(log node{killed}.stderr.log); the other nodes: node {1 - killed}: rank 0"), f.title
    assert rec.evidence.stderr_log == f"node{killed}.stderr.log", rec.evidence.stderr_log


def _no_name_on(tmp_path: Path, monkeypatch, task: int) -> None:
    """``getent`` on PATH that finds no host on the node of ``task`` (SLURM_PROCID), as a node whose
    resolver does not know the name would; the system's on the others."""
    bin_dir = tmp_path / "resolver_bin"
    bin_dir.mkdir()
    real = shutil.which("getent")
    (bin_dir / "getent").write_text(f'#!/bin/sh\n[ "$SLURM_PROCID" = {task} ] && exit 2\nexec {real} "$@"\n')
    (bin_dir / "getent").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("host, unresolved", [("localhost", [1]), ("nsa-no-such-node.invalid", [0, 1])])
def test_a_rendezvous_host_a_node_cannot_resolve_is_named_before_the_trainer(tmp_path, fake_allocation, monkeypatch,
                                                                             host, unresolved):
    """Slurm's first node by a name that does not resolve on some node: its torchrun agent would
    wait out the join timeout, the point a stall or a 'never joined' with no word of why. The
    shared-directory step looks the name up on every node: an ERROR before the trainer, naming
    each such node and the name (node 1 by a resolver of its own here; '.invalid' on every node)."""
    monkeypatch.setenv(fake_slurm.NODELIST_ENV, f"{host},vmn1")
    if unresolved == [1]:
        _no_name_on(tmp_path, monkeypatch, 1)
    rec = _record(tmp_path, steps=6)
    assert rec.status == Status.ERROR, rec.reason
    short = socket.gethostname().split(".")[0]
    nodes = ", ".join(f"node {i} ({short})" for i in unresolved)
    assert f"the rendezvous host '{host}' (the first node of job 4343) does not resolve on {nodes}: " in rec.reason, \
        rec.reason
    assert f"`getent hosts {host}` found nothing there" in rec.reason, rec.reason
    assert rec.wall_s < JOIN_S, rec.wall_s  # before any agent waited for the rendezvous
    assert not list((tmp_path / "results" / rec.out_dir).glob("node*.stderr.log")), "the trainer was launched"
