"""Launchers of several nodes in a runbook: torchrun agents meeting at a c10d rendezvous on this
host, and Slurm's srun of torchrun; every bad value refused with the file and the key named."""
from __future__ import annotations

import pytest
import yaml

from validation.errors import RunbookError
from validation.launch import slurm
from validation.machine import detect
from validation.runbook.describe import describe
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.runbook.types import Rendezvous
from validation.session.point import cannot_launch, why_skip

NODES = {"kind": "torchrun", "nproc": 1, "nnodes": 2, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 20}}
SLURM = {"kind": "slurm", "nodes": 2, "nproc_per_node": 4, "rdzv": {"join_timeout_s": 60},
         "srun_args": ["--partition=gpu", "--gres=gpu:4"]}


def _rb(launcher, **phase):
    return {"name": "t", "profiles": ["cpu"],
            "phases": [{"name": "p", "kind": "train", "stall_s": 100, "timeout_s": 300, "launcher": launcher, **phase}]}


def _load(tmp_path, data):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_runbook(path)


def test_two_nodes_on_this_host(tmp_path):
    [point] = expand(_load(tmp_path, _rb(NODES)), load_profile("cpu"))
    launcher = point.phase.launcher
    assert (launcher.kind, launcher.nnodes, launcher.nproc, launcher.world_size) == ("torchrun", 2, 1, 2)
    assert launcher.rdzv == Rendezvous(20.0, endpoint="localhost:0") and launcher.nodes
    assert point.nproc == 2 and {"distributed", "multi_node"} <= set(point.markers) and "slurm" not in point.markers


def test_slurm_nodes_and_processes_per_node(tmp_path):
    rb = _load(tmp_path, _rb(SLURM))
    [point] = expand(rb, load_profile("cpu"))
    launcher = point.phase.launcher
    assert (launcher.kind, launcher.nnodes, launcher.nproc, point.nproc) == ("slurm", 2, 4, 8)
    assert launcher.rdzv == Rendezvous(60.0) and launcher.srun_args == ("--partition=gpu", "--gres=gpu:4")
    assert {"multi_node", "slurm"} <= set(point.markers) and point.slurm
    assert "slurm 2 nodes x4 (c10d on the first node, port from the job id, join 60s)" in "\n".join(
        describe(rb, load_profile("cpu"), "goldens.yaml"))


def test_slurm_takes_torchrun_args_for_every_agent(tmp_path):
    [point] = expand(_load(tmp_path, _rb({**SLURM, "torchrun_args": ["--max-restarts=1"]})), load_profile("cpu"))
    assert point.phase.launcher.torchrun_args == ("--max-restarts=1",)


def test_slurm_gpus_are_the_allocations_not_this_machines(tmp_path):
    gpu = {"name": "g", "marker": "g", "hardware": {"accelerator": "cuda"}, "thresholds": {}}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gpu))
    for launcher, local in ((SLURM, 0), (NODES, 2)):
        data = {**_rb(launcher), "profiles": ["g"]}
        [point] = expand(_load(tmp_path, data), load_profile(tmp_path / "g.yaml"))
        assert point.min_gpus == local


def test_a_phase_inherits_the_defaults_nodes(tmp_path):
    data = {"name": "t", "profiles": ["cpu"], "defaults": {"launcher": NODES, "stall_s": 60, "timeout_s": 300},
            "phases": [{"name": "p", "kind": "train", "launcher": {"nproc": 2}}]}
    [point] = expand(_load(tmp_path, data), load_profile("cpu"))
    assert (point.phase.launcher.nnodes, point.phase.launcher.nproc, point.nproc) == (2, 2, 4)


@pytest.mark.parametrize("launcher, key, words", [
    ({**NODES, "rdzv": None}, "launcher.rdzv", "empty (`rdzv:` with nothing after it"),
    ({k: v for k, v in NODES.items() if k != "rdzv"}, "launcher.rdzv", "nnodes > 1 needs a rendezvous"),
    ({**NODES, "nnodes": 1}, "launcher.rdzv", "for nnodes > 1"),
    ({**NODES, "rdzv": {"endpoint": "node0.cluster:29500", "join_timeout_s": 20}}, "launcher.rdzv.endpoint",
     "across machines use kind: slurm"),
    ({**NODES, "rdzv": {"endpoint": "localhost:70000", "join_timeout_s": 20}}, "launcher.rdzv.endpoint",
     "localhost:PORT"),
    ({**NODES, "rdzv": {"endpoint": "localhost:0"}}, "launcher.rdzv.join_timeout_s", "required key is missing"),
    ({**NODES, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 20, "backend": "etcd"}}, "launcher.rdzv.backend",
     "not one of c10d"),
    ({**NODES, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 20, "port": 1}}, "launcher.rdzv.port",
     "unknown key"),
    ({**NODES, "torchrun_args": ["--rdzv_backend=static"]}, "launcher.torchrun_args", "nnodes and rdzv set"),
    ({**NODES, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 95}}, "launcher.rdzv.join_timeout_s",
     "the stall watch would end a rendezvous"),
    ({"kind": "python", "nnodes": 2}, "launcher.nnodes", "a key of kind torchrun launchers"),
    ({**SLURM, "nproc": 2}, "launcher.nproc", "kind slurm takes kind, nodes, nproc_per_node"),
    ({k: v for k, v in SLURM.items() if k != "rdzv"}, "launcher.rdzv", "required: rdzv: {join_timeout_s"),
    ({**SLURM, "rdzv": {"join_timeout_s": 60, "endpoint": "localhost:1"}}, "launcher.rdzv.endpoint", "unknown key"),
    ({**SLURM, "rdzv": {"join_timeout_s": 60, "port": 70000}}, "launcher.rdzv.port", "not a TCP port"),
    ({**SLURM, "srun_args": ["-p gpu"]}, "launcher.srun_args[0]", "long options"),
    ({**SLURM, "srun_args": ["--partition=gpu; id"]}, "launcher.srun_args[0]", "long options"),
    ({**SLURM, "srun_args": ["--export=NONE"]}, "launcher.srun_args[0]", "set by the harness"),
    ({**SLURM, "nodes": 0}, "launcher.nodes", "expected an integer >= 1"),
    ({**SLURM, "torchrun_args": ["--rdzv_endpoint=node0:29500"]}, "launcher.torchrun_args",
     "the harness sets the rendezvous of a Slurm launch"),
    ({**SLURM, "torchrun_args": "--max-restarts=1"}, "launcher.torchrun_args", "expected a list of --option=value"),
])
def test_a_bad_launcher_names_file_and_key(tmp_path, launcher, key, words):
    with pytest.raises(RunbookError) as exc:
        _load(tmp_path, _rb(launcher))
    msg = str(exc.value)
    assert str(tmp_path / "rb.yaml") in msg and f"phases[0].{key}:" in msg and words in msg, msg


def test_the_join_timeout_is_checked_against_the_inherited_stall_time(tmp_path):
    data = {"name": "t", "profiles": ["cpu"], "defaults": {"launcher": NODES, "timeout_s": 100},
            "phases": [{"name": "p", "kind": "train"}]}  # stall time: a quarter of 100 s, below 20 + 10
    with pytest.raises(RunbookError, match=r"defaults\.launcher \(for phases\[0\]\)\.rdzv\.join_timeout_s: .*25 s"):
        _load(tmp_path, data)


def test_a_slurm_point_is_skipped_where_slurm_is_not_installed(tmp_path, monkeypatch):
    [point] = expand(_load(tmp_path, _rb(SLURM)), load_profile("cpu"))
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None if name in ("srun", "salloc") else "/bin/" + name)
    assert why_skip(point, detect()) == "Slurm is not installed here (salloc, srun not on PATH): the point runs as srun"
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/bin/" + name)
    assert why_skip(point, detect()) is None


def test_a_slurm_point_needing_more_nodes_than_the_allocation_it_runs_in_cannot_launch(tmp_path, monkeypatch):
    """Inside salloc -N1 a two-node point's srun fails at once ('Only allocated 1 nodes asked
    for 2'), which the shared-directory check took for a results directory not on a shared
    filesystem; the point is refused before anything runs, naming the key and the allocation."""
    [point] = expand(_load(tmp_path, _rb(SLURM)), load_profile("cpu"))
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/bin/" + name)
    monkeypatch.setattr(slurm, "_query", lambda argv: "RUNNING\n" if argv[0] == "squeue" else "")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert cannot_launch(point) == ("launcher.nodes is 2, but job 5, the Slurm allocation the harness runs in, has 1 "
                                    "node (SLURM_JOB_NUM_NODES): ask for 2 nodes (salloc --nodes=2) or lower "
                                    "launcher.nodes")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert cannot_launch(point) is None
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert cannot_launch(point) is None  # outside an allocation the harness asks for its own


def test_a_slurm_point_in_an_allocation_that_has_ended_cannot_launch(tmp_path, monkeypatch):
    """A SLURM_JOB_ID left in the shell by an allocation that has ended made every srun fail
    ('Slurm job 22 has expired'), which the shared-directory check reported as a results
    directory not on a shared filesystem; the point is refused before anything runs."""
    [point] = expand(_load(tmp_path, _rb(SLURM)), load_profile("cpu"))
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/bin/" + name)
    monkeypatch.setenv("SLURM_JOB_ID", "22")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    for state, said in (("", "Slurm knows no such job"), ("COMPLETED\n", "COMPLETED")):
        monkeypatch.setattr(slurm, "_query", lambda argv, state=state: state if argv[0] == "squeue" else "")
        assert cannot_launch(point) == (f"SLURM_JOB_ID=22, the Slurm allocation the harness runs in, is not a running "
                                        f"job ({said}): run inside a live allocation, or unset SLURM_JOB_ID and the "
                                        "harness asks for its own")
    monkeypatch.setattr(slurm, "_query", lambda argv: "RUNNING\n" if argv[0] == "squeue" else "")
    assert cannot_launch(point) is None
