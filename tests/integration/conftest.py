"""The opt-in Slurm tests' fixture: ``slurm`` skips, with the reason, unless ``-m`` names slurm (a
plain ``pytest`` never submits jobs to a cluster it happens to find), Slurm's commands are on
PATH, the controller answers and a node is idle (scripts/slurm/single_host.sh starts a
single-host Slurm here)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time

import pytest


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


SLURM_TOOLS = ("sinfo", "srun", "squeue", "scancel", "scontrol")


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest) -> dict:
    """Skip unless opted in and a Slurm node is idle; return {'kill_wait': s, 'srun_args': [...]}."""
    words = set(re.findall(r"[A-Za-z_]\w*", request.config.option.markexpr or ""))
    if "slurm" not in words:
        pytest.skip("opt-in: select with -m slurm (these tests submit Slurm jobs)")
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not on PATH); "
                    "scripts/slurm/single_host.sh installs and starts a single-host Slurm")
    states: list[list[str]] = []
    deadline = time.monotonic() + 15  # a node finishing a job shows "completing" for a moment
    while True:
        try:
            info = _run(["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=20)
        except subprocess.TimeoutExpired:
            pytest.skip("sinfo did not answer within 20 s (is slurmctld running? scripts/slurm/single_host.sh)")
        if info.returncode != 0:
            pytest.skip(f"sinfo failed (is slurmctld running? scripts/slurm/single_host.sh): {info.stderr.strip()}")
        states = [line.split() for line in info.stdout.splitlines() if line.strip()]
        if any(len(s) == 2 and s[1] == "idle" for s in states) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if not any(len(s) == 2 and s[1] == "idle" for s in states):
        pytest.skip(f"no idle Slurm node (sinfo: {'; '.join(' '.join(s) for s in states) or 'no nodes'})")
    conf = _run(["scontrol", "show", "config"]).stdout
    m = re.search(r"^KillWait\s*=\s*(\d+)", conf, re.M)
    return {"kill_wait": int(m.group(1)) if m else 30,
            "srun_args": shlex.split(os.environ.get("NSA_SLURM_SRUN_ARGS", ""))}
