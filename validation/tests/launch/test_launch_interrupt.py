"""Interrupt hygiene through the real CLI: SIGINT at 16 different moments of a torchrun point's
start and run, from the harness's own start-up, through torchrun's before it spawns its
workers, to mid-training. After each, no process of the run survives (the test looks for its
own token, which every process of the run inherits, and for the run's directory in command
lines), and store and artifacts agree: the interrupted point has no record and no run directory.

Two runs go side by side (each SIGINT waits for an event of its own run), which keeps the test's
wall time near half the sum of the runs' start-ups.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from validation import REPO_ROOT
from validation.launch.tree import RUN_TOKENS

pytestmark = [pytest.mark.faults, pytest.mark.distributed]

RUNBOOK = {"name": "interrupt", "profiles": ["cpu"],
           "defaults": {"launcher": {"kind": "torchrun", "nproc": 2, "module": "validation.tests.hang_trainer"},
                        "steps": 1_000_000, "timeout_s": 300, "env": {"NSA_STEP_S": "0.01", "OMP_NUM_THREADS": 1}},
           "phases": [{"name": "torchrun_point", "kind": "train"}]}
#: (event, seconds after it), each seen in the files of the run: the harness entering the point
#: (its lock), launching torchrun (the log it opens first; torchrun then takes a second or more to
#: import torch and spawn the workers), rank 0's worker running (its env.json), and training
#: under way (rows in the CSV)
MOMENTS = [("point", 0.0), ("point", 0.05),
           ("launch", 0.0), ("launch", 0.05), ("launch", 0.2), ("launch", 0.5), ("launch", 1.0), ("launch", 1.5),
           ("launch", 2.0), ("launch", 2.5),
           ("worker", 0.0), ("worker", 0.05),
           ("step 1", 0.0), ("step 20", 0.0), ("step 100", 0.0), ("step 300", 0.0)]
EVENT_TIMEOUT_S = 90.0
#: how long the harness may take to exit after the SIGINT (its trees killed first)
EXIT_BOUND_S = 20.0


@dataclass
class Outcome:
    moment: str
    rc: int
    agents: int
    workers: int
    exit_s: float
    survivors: list[str]
    records: int
    run_dirs: list[str]


POINT = Path("runs", "interrupt", "cpu", "torchrun_point", "default")
_FILE = {"launch": "*/trainer.stderr.log", "worker": "*/env.json"}


def _happened(event: str, results: Path) -> bool:
    """Whether the run has reached ``event``, from its files (cheap enough to ask every 10 ms)."""
    point = results / POINT
    if event == "point":
        return point.with_name("default.lock").exists()
    if event.startswith("step"):
        need = int(event.split()[1])
        return any(len(csv.read_bytes().splitlines()) > need for csv in point.glob("*/training.csv"))
    return any(point.glob(_FILE[event]))


def _launched(cli: subprocess.Popen) -> tuple[int, int]:
    """How many torchrun agents and workers run below the harness (when the SIGINT is sent)."""
    lines = []
    for p in psutil.Process(cli.pid).children(recursive=True):
        try:
            lines.append(" ".join(p.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    agents = sum("torch.distributed.run" in c for c in lines)
    return agents, sum("validation.tests.hang_trainer" in c for c in lines) - agents


def _survivors(token: str, root: Path) -> list[str]:
    """Live processes of the run: its token in their environment, or its directory in their
    command line."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            ours = token in p.environ().get(RUN_TOKENS, "").split(",") or str(root) in " ".join(p.info["cmdline"] or ())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if ours:
            out.append(f"{p.pid}: {' '.join(p.info['cmdline'] or ())[:160]}")
            p.kill()  # nothing left for the next run; the test fails on the list
    return out


def _interrupt_once(root: Path, event: str, delay: float) -> Outcome:
    root.mkdir(parents=True)
    token = f"interrupt-test-{uuid.uuid4().hex}"
    (root / "rb.yaml").write_text(yaml.safe_dump(RUNBOOK))
    results = root / "results"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NSA_")}, RUN_TOKENS: token,
           "PYTHONPATH": str(REPO_ROOT)}
    cli = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(root / "rb.yaml"), "--profile",
                            "cpu", "--results-dir", str(results), "--no-report"], cwd=REPO_ROOT, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while not _happened(event, results):
            assert cli.poll() is None, f"the harness exited before {event}: {cli.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, f"no {event} within {EVENT_TIMEOUT_S:g}s"
            time.sleep(0.01)
        time.sleep(delay)
        agents, workers = _launched(cli)
        sent = time.monotonic()
        cli.send_signal(signal.SIGINT)
        cli.communicate(timeout=EXIT_BOUND_S + 30)
        exit_s = time.monotonic() - sent
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    store = results / "results.json"
    records = len(json.loads(store.read_text())["records"]) if store.is_file() else 0
    point = results / POINT
    run_dirs = sorted(str(p.relative_to(results)) for p in point.iterdir()) if point.is_dir() else []
    return Outcome(f"{event} +{delay:g}s", cli.returncode, agents, workers, exit_s, _survivors(token, root), records,
                   run_dirs)


def test_sigint_at_16_moments_of_a_torchrun_point_leaves_nothing_behind(tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda im: _interrupt_once(tmp_path / f"run{im[0]}", *im[1]), enumerate(MOMENTS)))
    bad = [o for o in outcomes if o.survivors or o.records or o.run_dirs or o.exit_s > EXIT_BOUND_S
           or o.rc != 128 + signal.SIGINT]
    assert not bad, "\n".join(map(str, bad))
    # the moments span the start: torchrun before it spawned its workers, and its workers running
    assert {(o.agents > 0, o.workers > 0) for o in outcomes} >= {(True, False), (True, True)}, outcomes
