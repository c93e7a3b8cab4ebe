"""The report's Reproduce line of a point's process, run as printed, writes into a new directory
it names and leaves the stored run's files, the evidence the report shows, as they were."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from validation import REPO_ROOT
from validation.report.tables import reproduce_rows
from validation.tests.conftest import train_phase


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _run_as_printed(line: str, cwd: Path) -> Path:
    out = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, line + "\n" + out.stderr[-3000:]
    [where] = re.findall(r"^writing into (\S+)$", out.stderr, re.M)
    return Path(where)


def test_a_train_points_process_line_writes_into_a_new_directory(fake_run, tmp_path):
    run = fake_run([train_phase(steps=6)])
    stored = run.results / run.record.out_dir
    before = _files(stored)
    [row] = reproduce_rows(run.records)
    new = _run_as_printed(row["process"], tmp_path)
    assert _files(stored) == before
    assert new != stored and stored not in new.parents
    assert len((new / "training.csv").read_text().splitlines()) == 7  # header and steps 1-6


def test_a_resume_points_three_processes_write_into_a_new_directory(fake_run, tmp_path):
    run = fake_run([{"name": "resume", "kind": "resume", "steps": 6, "resume_after": 3,
                     "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}])
    assert run.record.status == "PASS", run.record.reason
    stored = (run.results / run.record.out_dir).parent  # the point's run: reference, first, second
    before = _files(stored)
    [row] = reproduce_rows(run.records)
    new = _run_as_printed(row["process"], tmp_path)
    assert _files(stored) == before
    assert sorted(p.name for p in new.iterdir()) == ["first", "reference", "second"]
    # the second half resumed from the new first half's checkpoint: it logged steps 4-6
    assert [ln.split(",")[0] for ln in (new / "second" / "training.csv").read_text().splitlines()[1:]] == ["4", "5", "6"]


def test_a_pytest_points_process_line_runs_from_another_directory(fake_run, tmp_path):
    """This project's pytest point (cpu_smoke's sanity) names its tests relative to the checkout:
    pasted from another directory its line gave 'ERROR: file or directory not found:
    tests/unit/...'. It starts with a cd into the checkout, as a runbook trainer's does into its root."""
    run = fake_run([{"name": "sanity", "kind": "pytest", "tests": ["validation/tests/test_layout.py::test_no_import_cycle"],
                     "timeout_s": 120, "gates": [{"metric": "tests_failed", "op": "<=", "threshold": 0}]}])
    assert run.record.status == "PASS", run.record.reason
    assert run.record.cwd == str(REPO_ROOT)
    stored = run.results / run.record.out_dir
    before = _files(stored)
    [row] = reproduce_rows(run.records)
    assert f"&& cd {REPO_ROOT} && " in row["process"], row["process"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    new = _run_as_printed(row["process"], elsewhere)
    assert _files(stored) == before
    assert (new / "junit.xml").is_file()
    # a record stored before pytest points kept their directory gets the line all the same
    [row] = reproduce_rows([replace(run.record, cwd="")])
    assert f"&& cd {REPO_ROOT} && " in row["process"], row["process"]


def test_a_node_launchs_process_line_gives_each_agent_its_nodes_gpus_and_fails_with_a_node(tmp_path):
    """The process line of nodes on one GPU host ran every agent with the GPUs of them all: each
    node's local rank 0 took the same GPU. Each agent is given its node's, after the runbook's
    CUDA_VISIBLE_DEVICES; the line exits with the status of a node's agent that failed."""
    from validation.judge.nodes import NodeEvidence, NodesEvidence
    from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

    # one write each: the two agents share the line's stdout, and print's pieces interleave
    agent = ("import os, sys; seen = os.environ['CUDA_VISIBLE_DEVICES']; "
             "os.write(1, f'agent sees {seen} {sys.argv[1]}\\n'.encode()); sys.exit(3 if seen == '2,3' else 0)")
    nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [NodeEvidence(0, "node0.stderr.log", devices="0,1"),
                                                            NodeEvidence(1, "node1.stderr.log", devices="2,3")])
    rec = PhaseRecord(PointKey("rb", "cpu", "train"), "rb/cpu/train/default", "train", Status.FAIL, "",
                      command=[sys.executable, "-c", agent, "--rdzv_endpoint=localhost:1"],
                      env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, evidence=Evidence(nodes=nodes))
    [row] = reproduce_rows([rec])
    out = subprocess.run(["bash", "-c", row["process"]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, row["process"] + "\n" + out.stderr
    assert sorted(ln.split()[2] for ln in out.stdout.splitlines()) == ["0,1", "2,3"], out.stdout
    assert "--rdzv_endpoint=localhost:1" not in out.stdout  # a port free when it ran, not the run's
    assert out.stderr == "node 1's torchrun agent exited 3\n", out.stderr


def _nodes_line(tmp_path: Path, agent: str) -> str:
    """The Reproduce line of a two-node torchrun launch on this host whose agents run ``agent``."""
    from validation.judge.nodes import NodeEvidence, NodesEvidence
    from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

    nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [NodeEvidence(0, "node0.stderr.log"),
                                                            NodeEvidence(1, "node1.stderr.log")])
    rec = PhaseRecord(PointKey("rb", "cpu", "train"), "rb/cpu/train/default", "train", Status.FAIL, "",
                      command=[sys.executable, "-c", agent, str(tmp_path), "--rdzv_endpoint=localhost:1"],
                      evidence=Evidence(nodes=nodes))
    [row] = reproduce_rows([rec])
    return row["process"]


#: an agent that records its pid and waits forever (as torchrun's agent waits at its rendezvous)
_WAITING_AGENT = ("import os, sys, time; open(os.path.join(sys.argv[1], f'agent{os.getpid()}'), 'w').close(); "
                  "time.sleep(600)")


def _agents(tmp_path: Path, n: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(pids := [int(p.name[5:]) for p in tmp_path.glob("agent*")]) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == n, pids
    return pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c", "sigint-to-the-line"])
def test_ctrl_c_stops_every_node_agent_of_the_line(tmp_path, to_group):
    """Pasted into a terminal, Ctrl-C left a node launch's agents running: background commands of a
    shell without job control ignore SIGINT (torchrun's agent does until its workers start), and the
    subshell went on waiting for them. Ctrl-C (SIGINT to the terminal's foreground process group, or
    to the line's shell alone) now stops every agent, and the line exits 130."""
    line = _nodes_line(tmp_path, _WAITING_AGENT)
    proc = subprocess.Popen(["bash", "-c", line], cwd=tmp_path, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's shell
    try:
        agents = _agents(tmp_path, 2)
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:  # the line's own shell (bash -c runs the subshell as its child)
            for child in psutil.Process(proc.pid).children():
                os.kill(child.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in agents) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in agents if _alive(p)], line + "\n" + err
        assert proc.returncode == 130, line + "\n" + err
    finally:
        for pid in [int(p.name[5:]) for p in tmp_path.glob("agent*")]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_node_launchs_line_still_exits_with_a_failed_agent_and_waits_for_the_others(tmp_path):
    """With its Ctrl-C trap the line still waits for every agent and exits with the first failure."""
    agent = ("import os, sys, time; "
             "open(os.path.join(sys.argv[1], f'agent{os.getpid()}'), 'w').close(); time.sleep(1); sys.exit(5)")
    out = subprocess.run(["bash", "-c", _nodes_line(tmp_path, agent)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 5, out.stderr
    assert out.stderr == "node 0's torchrun agent exited 5\nnode 1's torchrun agent exited 5\n", out.stderr
