"""The report's Reproduce line of a point's process, run as printed, writes into a new directory
it names and leaves the stored run's files, the evidence the report shows, as they were."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

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
