"""Opt-in: a runbook phase with ``launcher: {kind: slurm}`` through the harness's CLI, as a user
types it, against a running Slurm whose node is this host (scripts/slurm/single_host.sh).

``python -m pytest -m slurm tests/integration/test_slurm_launcher.py -v -s``: skipped, with the
reason, unless ``-m`` names slurm and Slurm answers (tests/integration/conftest.py). Three runs of
the test trainer (tests/trainers/native_train.py) as srun of torchrun in an allocation the
harness asks for (salloc --no-shell): a healthy phase (GO, the job id in the record, the
allocation released, each rank's pid in nodes.json); a hung rank (the stall watch takes every
rank's stack with its node, then scancel); a run interrupted with SIGINT (scancel, exit 130, no
process, job or run directory left); and a job someone else scancels (stopped by Slurm, no crash).
"""
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

from validation.contract.nodes import read_nodes
from validation.store.results import ResultStore

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
NATIVE = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
JOIN_S, STALL_S = 10, 25


def _runbook(tmp_path: Path, slurm: dict, steps: int, nodes: int = 1, nproc: int = 2) -> Path:
    data: dict[str, Any] = {
        "name": "slurm_nodes", "profiles": ["cpu"], "trainer": NATIVE,
        "defaults": {"steps": steps, "timeout_s": 240, "stall_s": STALL_S, "env": {"OMP_NUM_THREADS": 1}},
        "phases": [{"name": "srun_phase", "kind": "train",
                    "launcher": {"kind": "slurm", "nodes": nodes, "nproc_per_node": nproc, "rdzv": {"join_timeout_s": JOIN_S},
                                 "srun_args": slurm["srun_args"]},
                    "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1},
                              {"metric": "idle_ranks", "op": "==", "threshold": 0}]}]}
    path = tmp_path / "slurm_nodes.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _harness(tmp_path: Path, runbook: Path, fault: str = "") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TEST_TRAINER_FAULT"))}
    if fault:
        env["TEST_TRAINER_FAULT"] = fault
    argv = [sys.executable, "-m", "validation", "run", "--runbook", str(runbook), "--results-dir",
            str(tmp_path / "results"), "--no-plots"]
    print("$", " ".join(argv) + (f"  (TEST_TRAINER_FAULT={fault})" if fault else ""))
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _jobs(name_part: str) -> list[list[str]]:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i %j %T"], capture_output=True,
                         text=True, timeout=30).stdout
    return [line.split() for line in out.splitlines() if name_part in line or not name_part]


def _job_state(job: str) -> str:
    out = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    return out


def _left(tmp_path: Path) -> list[str]:
    me = os.getpid()
    return [" ".join(p.info["cmdline"])[:120] for p in psutil.process_iter(["pid", "cmdline", "status"])
            if p.info["pid"] != me and p.info["status"] != psutil.STATUS_ZOMBIE
            and str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def _two_idle_nodes() -> None:
    """Skip unless two nodes are idle (a cluster, or SLURM_SH_NODES=2 scripts/slurm/single_host.sh)."""
    out = subprocess.run(["sinfo", "--noheader", "--Node", "--states=idle", "--format=%N"], capture_output=True,
                         text=True, timeout=30).stdout.split()
    if len(set(out)) < 2:
        pytest.skip(f"two idle Slurm nodes needed, {len(set(out))} idle "
                    "(SLURM_SH_NODES=2 scripts/slurm/single_host.sh emulates two on this host)")


def _record(tmp_path: Path):
    [rec] = ResultStore(tmp_path / "results").records()
    return rec


def test_a_phase_runs_as_srun_of_torchrun(slurm, tmp_path):
    t0 = time.monotonic()
    proc = _harness(tmp_path, _runbook(tmp_path, slurm, steps=12))
    out, _ = proc.communicate(timeout=300)
    took = time.monotonic() - t0
    print(out)
    assert proc.returncode == 0, out
    rec = _record(tmp_path)
    assert rec.status == "PASS" and rec.world_size == 2 and rec.slurm_job_id, rec.reason
    assert rec.command[0] == "srun" and f"--jobid={rec.slurm_job_id}" in rec.command
    assert "--ntasks-per-node=1" in rec.command and "--rdzv_backend=c10d" in rec.command
    run_dir = tmp_path / "results" / rec.out_dir
    launch = read_nodes(run_dir)
    assert launch.launcher == "slurm" and launch.slurm_job_id == rec.slurm_job_id and launch.nodes[0].exit_code == 0
    # the store is on the first node: its Slurm name (the endpoint) is that host (one address, where
    # emulated nodes on one host have names of their own)
    assert socket.gethostbyname(launch.rdzv_endpoint.split(":")[0]) == socket.gethostbyname(launch.nodes[0].host)
    assert launch.slurm_step == f"{rec.slurm_job_id}.1"  # step 0 checked the shared run directory
    ranks = {json.loads(line)["rank"] for r in (0, 1)
             for line in (run_dir / f"heartbeat_rank{r}.jsonl").read_text().splitlines()}
    assert ranks == {0, 1} and (run_dir / "node0.stderr.log").exists() and (run_dir / "srun.stderr.log").exists()
    assert rec.evidence.nodes.nodes[0].ranks == [0, 1]
    # the step's processes, slurmstepd's children, were seen through the run's token
    assert set(launch.nodes[0].ranks) == {0, 1} and launch.nodes[0].pid and launch.nodes[0].group_rank == 0, launch
    assert _job_state(rec.slurm_job_id) in ("CANCELLED", "COMPLETED", ""), "the allocation was not released"
    assert not _left(tmp_path)
    print(f"job {rec.slurm_job_id}: GO in {took:.1f} s of harness wall time ({rec.wall_s:.1f} s for the point)")


def test_a_hung_rank_under_srun_has_its_stack_taken_then_the_step_is_cancelled(slurm, tmp_path):
    proc = _harness(tmp_path, _runbook(tmp_path, slurm, steps=400), fault="hang_rank:1@4")
    out, _ = proc.communicate(timeout=300)
    print(out)
    assert proc.returncode == 1, out
    rec = _record(tmp_path)
    assert rec.status == "FAIL" and rec.reason.startswith("stalled"), rec.reason
    taken = {t.rank: t for t in rec.evidence.taken_stacks}
    assert set(taken) == {0, 1} and all(t.method == "py-spy" and t.node == 0 for t in taken.values()), taken
    assert rec.evidence.stackdumps[1].frames[0].func == "hang_forever"
    run_dir = tmp_path / "results" / rec.out_dir
    stderr = (run_dir / "srun.stderr.log").read_text()
    # scancel --signal=TERM reached torchrun's agent, which stopped its workers (the harness's own
    # kill of what runs here would have been a SIGKILL, which the agent cannot log)
    assert "Received 15 death signal" in (run_dir / "node0.stderr.log").read_text()
    # the agent the harness's cancel ended had no exit of its own: recorded as running, with its state
    [node] = read_nodes(run_dir).nodes
    assert node.exit_code is None and node.state and node.pid and set(node.ranks) == {0, 1}, node
    assert _job_state(rec.slurm_job_id) in ("CANCELLED", ""), _job_state(rec.slurm_job_id)
    assert not _left(tmp_path)
    said = "; ".join(line for line in stderr.splitlines() if line.startswith("srun"))
    print(f"job {rec.slurm_job_id}, step {read_nodes(run_dir).slurm_step}: {rec.reason}; srun said: {said}")


def _harness_in_a_job(slurm, tmp_path):
    """A harness running a long phase in a Slurm job, once a few steps are done: (its process,
    its runs directory, the job id)."""
    proc = _harness(tmp_path, _runbook(tmp_path, slurm, steps=100000))
    runs = tmp_path / "results" / "runs"
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 200 for p in runs.rglob("training.csv")):  # a few steps done
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    [job] = [j[0] for j in _jobs("") if j[2] == "RUNNING" and len(j[1]) == 32]  # named with the run token
    return proc, runs, job


def test_an_interrupted_phase_is_cancelled_and_leaves_nothing(slurm, tmp_path):
    proc, runs, job = _harness_in_a_job(slurm, tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=slurm["kill_wait"] + 60)
    took = time.monotonic() - t0
    print(out)
    assert proc.returncode == 130, out
    assert _job_state(job) in ("CANCELLED", ""), _job_state(job)
    assert not _left(tmp_path)
    assert not [p for p in runs.rglob("*") if p.is_dir() and len(p.name) == 12], "the interrupted run directory is left"
    listed = subprocess.run(["scontrol", "listpids", job], capture_output=True, text=True, timeout=30).stdout
    assert not [ln for ln in listed.splitlines()[1:] if ln.split() and ln.split()[0].isdigit()], listed
    print(f"job {job}: SIGINT -> harness exit 130, job cancelled, nothing left, in {took:.1f} s")


def test_a_job_someone_scancels_is_stopped_by_slurm_not_a_crash(slurm, tmp_path):
    """scancel of the harness's job from outside, halfway: the verdict says Slurm stopped the step
    (slurmstepd's banner in the node's log), not 'trainer crashed (exit code 1)'."""
    proc, _, job = _harness_in_a_job(slurm, tmp_path)
    subprocess.run(["scancel", job], check=True, timeout=30)
    out, _ = proc.communicate(timeout=slurm["kill_wait"] + 60)
    print(out)
    assert proc.returncode == 1, out
    rec = _record(tmp_path)
    assert rec.status == "FAIL" and rec.reason.startswith("stopped by Slurm, not by the trainer or the harness: node 0: "
                                                          f"*** STEP {job}."), rec.reason
    assert " CANCELLED AT " in rec.reason, rec.reason
    deadline = time.monotonic() + 30
    while _job_state(job) == "COMPLETING" and time.monotonic() < deadline:  # Slurm ending the job it cancelled
        time.sleep(0.5)
    assert not _left(tmp_path) and _job_state(job) in ("CANCELLED", ""), _job_state(job)
    print(f"job {job}: scancel from outside -> {rec.reason}")


def test_more_nodes_than_the_partition_has_is_an_error_at_once_not_at_the_phase_timeout(slurm, tmp_path):
    """salloc for more nodes than the partition holds is left pending (PartitionConfig or
    PartitionNodeLimit) for as long as anyone waits: the harness says so, naming the key, instead
    of waiting out the phase's timeout (240 s here) and saying only that no allocation came."""
    nodes = len(subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N"], capture_output=True, text=True,
                               timeout=30).stdout.split()) + 1
    t0 = time.monotonic()
    proc = _harness(tmp_path, _runbook(tmp_path, slurm, steps=12, nodes=nodes))
    out, _ = proc.communicate(timeout=300)
    took = time.monotonic() - t0
    print(out)
    rec = _record(tmp_path)
    assert rec.status == "ERROR" and took < 60, (took, rec.reason)
    assert f"--nodes={nodes}" in rec.reason, rec.reason
    assert re.search(r"pending \(Partition(NodeLimit|Config)\)", rec.reason), rec.reason
    assert "launcher.nodes" in rec.reason, rec.reason
    assert not [j for j in _jobs("") if j[2] == "PENDING"], "the request was left pending"
    assert not _left(tmp_path)
    print(f"nodes: {nodes}: {rec.reason} ({took:.1f} s)")


def test_two_nodes_run_as_one_agent_each_and_a_killed_rank_names_its_node(slurm, tmp_path):
    """Two Slurm nodes, one torchrun agent a node (c10d on the first): a healthy phase is GO with
    each node's rank and pid in nodes.json; then rank 1 SIGKILLs itself at step 4 and the verdict
    names rank 1 and the node it ran on, not the node whose rank failed in the all-reduce after it.
    Runs on two slurmd on one host (SLURM_SH_NODES=2 scripts/slurm/single_host.sh)."""
    _two_idle_nodes()
    proc = _harness(tmp_path, _runbook(tmp_path, slurm, steps=12, nodes=2, nproc=1))
    out, _ = proc.communicate(timeout=300)
    print(out)
    assert proc.returncode == 0, out
    rec = _record(tmp_path)
    assert rec.status == "PASS" and rec.world_size == 2 and "--nodes=2" in rec.command, rec.reason
    launch = read_nodes(tmp_path / "results" / rec.out_dir)
    assert len(launch.nodes) == 2 and all(n.exit_code == 0 and n.pid for n in launch.nodes), launch
    assert sorted(r for n in launch.nodes for r in n.ranks) == [0, 1], launch
    assert not _left(tmp_path)

    faulted = tmp_path / "faulted"
    faulted.mkdir()
    proc = _harness(faulted, _runbook(faulted, slurm, steps=12, nodes=2, nproc=1), fault="kill_rank:1@4")
    out, _ = proc.communicate(timeout=300)
    print(out)
    assert proc.returncode == 1, out
    rec = _record(faulted)
    launch = read_nodes(faulted / "results" / rec.out_dir)
    [node] = [n.index for n in launch.nodes if 1 in n.ranks]
    failure = rec.evidence.rank_failures.get(1)
    assert rec.status == "FAIL" and failure and failure.signal == "SIGKILL", (rec.reason, rec.evidence.rank_failures)
    report = (faulted / "results" / "reports" / "slurm_nodes__cpu.md").read_text()
    assert f"node {node}'s rank 1 was killed by SIGKILL" in report, report
    assert not _left(faulted)
    print(f"job {rec.slurm_job_id}: {rec.reason}; rank 1 ran on node {node}, named in the report")
