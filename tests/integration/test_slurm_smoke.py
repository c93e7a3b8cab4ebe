"""Opt-in smoke tests against a running Slurm: `srun` of torchrun, and `scancel` leaving no survivor.

Run with ``pytest -m slurm tests/integration/test_slurm_smoke.py`` on a machine whose Slurm runs
jobs on this same host (``scripts/slurm/single_host.sh`` sets one up from Debian's packages).
Skipped, with the reason, unless ``-m`` names ``slurm`` (a plain ``pytest`` never submits jobs to
a cluster it happens to find), where ``sinfo``/``srun``/``scancel`` are not installed, where the
controller does not answer, or where no node is idle. Extra ``srun`` options (partition, account)
come from ``NSA_SLURM_SRUN_ARGS``. The scancel test reads the step's processes on this host, so
it assumes the step runs here (true of the single-host Slurm).

Each test is one short job step of a tiny gloo all-reduce (``scripts/slurm/allreduce_probe.py``);
both take a few seconds when the ranks exit on SIGTERM. The ``slurm`` fixture (its skips) is in
tests/integration/conftest.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "scripts" / "slurm" / "allreduce_probe.py"


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _srun_torchrun(slurm: dict, name: str, out_dir: Path, log, **env: str) -> subprocess.Popen:
    argv = ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", *slurm["srun_args"],
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(PROBE)]
    full_env = dict(os.environ, PROBE_OUT_DIR=str(out_dir), **env)
    return subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _job_id(name: str) -> str:
    return _run(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i"]).stdout.strip()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cleanup(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is None:
        _run(["scancel", "--signal=KILL", f"--name={name}"])
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_srun_torchrun_allreduce(slurm: dict, tmp_path: Path) -> None:
    """`srun -N1 -n1 torchrun --standalone --nproc_per_node=2`: both ranks reduce 1 + 2 = 3 and
    see the same job and step."""
    name = f"nsa-slurm-smoke-{uuid.uuid4().hex[:8]}"
    log_path = tmp_path / "srun.log"
    with open(log_path, "w") as log:
        proc = _srun_torchrun(slurm, name, tmp_path, log)
        try:
            rc = proc.wait(timeout=180)
        finally:
            _cleanup(proc, name)
    out = log_path.read_text()
    assert rc == 0, f"srun exited {rc}:\n{out[-3000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, info in enumerate(ranks):
        assert info["rank"] == r and info["world"] == 2
        assert info["allreduce"] == 3.0, info
        assert info["env"]["SLURM_STEP_ID"] == "0" and info["env"]["SLURM_PROCID"] == "0"
    assert ranks[0]["env"]["SLURM_JOB_ID"] == ranks[1]["env"]["SLURM_JOB_ID"]
    print(f"job {ranks[0]['env']['SLURM_JOB_ID']}: all-reduce {ranks[0]['allreduce']} on both ranks")


def test_scancel_leaves_no_process(slurm: dict, tmp_path: Path) -> None:
    """`scancel <job>` of a running srun-of-torchrun step: srun ends and no process of the step
    (torchrun's agent, its workers in their own sessions) is alive afterwards."""
    name = f"nsa-slurm-cancel-{uuid.uuid4().hex[:8]}"
    log_path = tmp_path / "srun.log"
    with open(log_path, "w") as log:
        proc = _srun_torchrun(slurm, name, tmp_path, log, PROBE_HOLD_S="600")
        try:
            deadline = time.monotonic() + 120
            job = ""
            while time.monotonic() < deadline:
                job = job or _job_id(name)
                if job and all((tmp_path / f"rank{r}.started").exists() for r in (0, 1)):
                    break
                assert proc.poll() is None, f"srun ended early ({proc.returncode}):\n{log_path.read_text()[-3000:]}"
                time.sleep(0.2)
            else:
                pytest.fail(f"job {job or '?'}: the ranks did not start within 120 s:\n{log_path.read_text()[-3000:]}")
            listed = _run(["scontrol", "listpids", job]).stdout.splitlines()[1:]
            pids = {int(f.split()[0]) for f in listed if f.split() and f.split()[0].isdigit()}
            workers = {json.loads((tmp_path / f"rank{r}.started").read_text())["pid"] for r in (0, 1)}
            assert workers <= pids, f"scontrol listpids {job} does not list the workers {workers}: {listed}"
            assert all(os.getsid(w) == w for w in workers), "torchrun's workers should lead their own sessions"
            t0 = time.monotonic()
            subprocess.run(["scancel", job], check=True, timeout=30)
            rc = proc.wait(timeout=slurm["kill_wait"] + 30)
            for _ in range(50):  # srun may return a moment before slurmstepd has reaped the last one
                survivors = sorted(p for p in pids if _alive(p))
                if not survivors:
                    break
                time.sleep(0.1)
            elapsed = time.monotonic() - t0
        finally:
            _cleanup(proc, name)
    assert not survivors, f"alive after scancel of job {job}: {survivors}"
    left = _run(["scontrol", "listpids", job]).stdout.splitlines()[1:]
    assert not [ln for ln in left if ln.split() and ln.split()[0].isdigit()], left
    print(f"job {job}: scancel -> srun exited {rc} and all {len(pids)} processes gone in {elapsed:.1f} s")
