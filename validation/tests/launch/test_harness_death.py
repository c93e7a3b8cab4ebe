"""A harness killed with SIGKILL takes its trainers with it (validation/launch/warden.py): a
torchrun agent and its ranks, which run in sessions of their own. A run of a results directory
stops what an earlier harness process of it left running (validation/launch/orphans.py), and
leaves alone what a live one runs. Real processes throughout: the CLI, torchrun, the test
trainers. Every wait is a poll with a generous bound (a loaded machine of 2 cores)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil
import pytest
import yaml

from validation import REPO_ROOT
from validation.launch import orphans
from validation.launch.tree import RUN_TOKENS, alive, carries, with_token
from validation.tests.conftest import FAKE, train_phase, write_runbook

pytestmark = [pytest.mark.faults]

#: how long anything of the run may take to start (torchrun imports torch) or to appear in files
START_S = 120.0
#: how long the processes of a dead harness may take to be gone
GONE_S = 20.0


def _wait_for(what: str, pred: Callable[[], bool], timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.1)


def _cli(runbook: Path, results: Path, token: str, **env: str) -> subprocess.Popen:
    """``nsa-validate run`` of the runbook, its processes found by ``token`` (every process it
    starts inherits it); stderr into a file beside the results (no pipe to keep open)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    with open(results.with_suffix(f".{uuid.uuid4().hex[:6]}.stderr"), "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(runbook), "--profile", "cpu",
                                 "--results-dir", str(results), "--no-report"], cwd=REPO_ROOT,
                                env={**with_token(base, token), "PYTHONPATH": str(REPO_ROOT), **env},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


def _carriers(token: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if p.pid != os.getpid() and carries(p, token)]


def _command(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _kill_all(token: str) -> None:
    """Nothing of a test's run left for the next test, whatever the outcome."""
    for p in _carriers(token):
        try:
            p.kill()
        except psutil.Error:
            pass


def _gone(procs: list[psutil.Process]) -> Callable[[], bool]:
    return lambda: not any(alive(p) for p in procs)


def test_a_sigkilled_harness_takes_a_torchrun_agent_and_its_ranks_with_it(tmp_path):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(yaml.safe_dump({
        "name": "death", "profiles": ["cpu"],
        "defaults": {"launcher": {"kind": "torchrun", "nproc": 2, "module": "validation.tests.hang_trainer"},
                     "steps": 1_000_000, "timeout_s": 600, "env": {"NSA_STEP_S": "0.05", "OMP_NUM_THREADS": 1}},
        "phases": [{"name": "ddp", "kind": "train"}]}))
    results, token = tmp_path / "results", f"death-test-{uuid.uuid4().hex}"
    cli = _cli(runbook, results, token)
    try:
        point = results / "runs" / "death" / "cpu" / "ddp" / "default"
        _wait_for("training", lambda: any(len(c.read_bytes().splitlines()) > 3 for c in point.glob("*/training.csv")))
        trainers = [p for p in _carriers(token) if "validation.tests.hang_trainer" in _command(p)]
        assert len(trainers) == 3, [_command(p) for p in trainers]  # the agent and its 2 ranks
        cli.kill()
        cli.wait()
        _wait_for("end of the trainers", _gone(trainers), GONE_S)
        # the warden too is gone, once done: nothing of the run is left
        _wait_for("end of every process of the run", lambda: not _carriers(token), GONE_S)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        _kill_all(token)


def test_a_run_stops_what_a_dead_harness_of_its_results_directory_left_running(tmp_path):
    """The harness and its warden both SIGKILLed (the OOM killer, a kill of every process): the
    trainer itself dies with the harness (its parent-death signal), the child it started does
    not; the next run of the results directory names it with its point, and stops it."""
    runbook = write_runbook(tmp_path / "rb.yaml", [train_phase("hang", fault="hang", timeout_s=600)], name="left")
    results, token = tmp_path / "results", f"left-test-{uuid.uuid4().hex}"
    cli = _cli(runbook, results, token)
    try:
        point = results / "runs" / "left" / "cpu" / "hang" / "default"
        _wait_for("the trainer's child", lambda: any(point.glob("*/child.pid")))
        child = psutil.Process(int(next(point.glob("*/child.pid")).read_text()))
        [trainer] = [p for p in _carriers(token) if FAKE in _command(p)]
        [warden] = [p for p in _carriers(token) if "validation.launch.warden" in _command(p)]
        warden.kill()
        _wait_for("the warden's end", _gone([warden]), GONE_S)
        cli.kill()
        cli.wait()
        _wait_for("the trainer's end", _gone([trainer]), GONE_S)
        assert alive(child)  # nothing killed it: it is the earlier run's leftover

        healthy = write_runbook(tmp_path / "rb2.yaml", [train_phase("hang")], name="left")
        again = subprocess.run([sys.executable, "-m", "validation", "run", "--runbook", str(healthy), "--profile", "cpu",
                                "--results-dir", str(results), "--no-report"], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=300,
                               env={**{k: v for k, v in os.environ.items() if not k.startswith("NSA_")},
                                    "PYTHONPATH": str(REPO_ROOT)})
        said = [line for line in again.stderr.splitlines() if "left processes running" in line]
        assert len(said) == 1, again.stderr
        assert f"point left/cpu/hang/default (harness pid {cli.pid}, gone): pid {child.pid} " in said[0], said
        assert not alive(child)
        stored = json.loads((results / "results.json").read_text())["records"].values()
        assert [r["status"] for r in stored] == ["PASS"], again.stderr
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        _kill_all(token)


def _gone_harness() -> psutil.Process:
    """A process that has exited, as a harness that died."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = psutil.Process(gone.pid)
    gone.wait()
    return dead


def _owned(results: Path, harness: psutil.Process, token: str) -> subprocess.Popen:
    """A sleeping process marked as a launch of ``harness`` for a point of ``results``."""
    owner = orphans.Owner(harness.pid, harness.create_time(), str(results.resolve()), "rb/cpu/p/default", token)
    env = {**os.environ, RUN_TOKENS: token, orphans.RUN_OWNERS: json.dumps([dataclasses.asdict(owner)])}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)


def test_only_launches_of_a_gone_harness_of_this_results_directory_are_left_running(tmp_path):
    dead = _gone_harness()
    live_token, dead_token, other_token = (f"owned-test-{uuid.uuid4().hex}" for _ in range(3))
    procs = [_owned(tmp_path / "results", psutil.Process(), live_token),  # a live harness shares the directory
             _owned(tmp_path / "results", dead, dead_token),
             _owned(tmp_path / "other", dead, other_token)]  # another results directory
    try:
        _wait_for("the environments", lambda: all(carries(psutil.Process(p.pid), t) for p, t in
                                                  zip(procs, (live_token, dead_token, other_token))), 30)
        [left] = orphans.left_running(tmp_path / "results")
        assert (left.owner.token, left.pids, left.owner.point) == (dead_token, [procs[1].pid], "rb/cpu/p/default")
        assert orphans.stop(left) == []
        procs[1].wait(timeout=GONE_S)
        assert procs[0].poll() is None and procs[2].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_pytest_door_stops_what_a_dead_harness_of_its_results_directory_left_running(tmp_path):
    """`pytest -m <phase>` into a results directory ran its points beside what a dead harness of that
    directory had left running, which `nsa-validate run` stops (the test above): it stops it too, at
    session start, saying so."""
    token = f"left-pytest-test-{uuid.uuid4().hex}"
    dead = _gone_harness()
    left = _owned(tmp_path / "results", dead, token)
    try:
        _wait_for("its environment", lambda: carries(psutil.Process(left.pid), token), 30)
        runbook = write_runbook(tmp_path / "rb.yaml", [train_phase("healthy")], name="left")
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "healthy",
                              "--runbook", str(runbook), "--results-dir", str(tmp_path / "results")], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=300,
                             env={**{k: v for k, v in os.environ.items() if not k.startswith("NSA_")},
                                  "PYTHONPATH": str(REPO_ROOT)})
        said = [line for line in out.stdout.splitlines() if "left processes running" in line]
        assert len(said) == 1, out.stdout + out.stderr
        assert said[0].startswith(f"nsa-validate: warning: an earlier run of {tmp_path / 'results'} left processes "
                                  f"running: point rb/cpu/p/default (harness pid {dead.pid}, gone): pid {left.pid} "), said
        left.wait(timeout=GONE_S)
        assert out.returncode == 0, out.stdout + out.stderr  # the point itself ran, GO
    finally:
        left.kill()
        left.wait()
