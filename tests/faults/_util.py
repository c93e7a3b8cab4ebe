"""Helpers of the fault-injection suite: run the REAL trainer (``python -m nsa.train``, alone or
under torchrun) and the REAL harness CLI (``python -m validation``) as subprocesses with hard
timeouts, write tmp runbooks, and check that nothing is left running or lost afterwards.

Every launch here starts its own session (process group) and, on timeout, the whole group is
SIGKILLed and the test fails: pytest itself never hangs on a fault.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from validation.contract.files import read_training_csv
from validation.judge.findings import find
from validation.judge.findings.finding import Finding
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions
from validation.store.results import ResultStore
from validation.tests.conftest import default_sigint

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

#: watchdog settings of every faulted run (short: CPU CI), and the bound the issue sets on the
#: stall and kill paths: watchdog limit + 30 s
WATCHDOG_S = 10.0
STALL_BOUND_S = WATCHDOG_S + 30.0
#: the harness's allowance before a faulted run's first step (a runbook's startup_s): every rank
#: importing torch at once on a loaded two-core CI box takes longer than these tests' stall times,
#: and no test of a stall after the first step is about a slow start
STARTUP_S = 60.0
#: the trainer's model/data overrides for every run: tiny preset, seq_len 64, synthetic data
TINY = {"data.dataset": "synthetic", "train.seq_len": 64, "train.batch_size": 2, "train.device": "cpu",
        "watchdog.timeout_s": WATCHDOG_S, "watchdog.poll_s": 0.5, "watchdog.grace_s": 3}


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without NSA_*/CONFIG (a stray NSA_FAULT must not leak into a
    run), single-threaded BLAS (2-core CI), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("NSA_") or k == "CONFIG")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    env.update(extra or {})
    return env


@dataclass
class Proc:
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    elapsed: float
    pid: int


def launch(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
           cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            preexec_fn=default_sigint)


def finish(proc: subprocess.Popen, *, timeout: float, started: float) -> Proc:
    """Wait for ``proc``; past ``timeout`` kill its whole group and fail the test."""
    try:
        out, err = proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(proc.args)} did not finish in {timeout:g}s (killed);\n"
                             f"stderr tail:\n{err[-3000:]}") from None
    return Proc(list(proc.args), proc.returncode, out, err, time.monotonic() - started, proc.pid)


def run(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> Proc:
    started = time.monotonic()
    return finish(launch(argv, timeout=timeout, env=env), timeout=timeout, started=started)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def trainer_argv(out_dir: Path, steps: int, overrides: dict[str, Any] | None = None, nproc: int = 1,
                 config: str = "tiny") -> list[str]:
    ov = {**TINY, "dist.mode": "ddp" if nproc > 1 else "single", **(overrides or {})}
    args = ["-m", "nsa.train", "--config", config, "--out-dir", str(out_dir), "--steps", str(steps),
            "--override", " ".join(f"{k}={v}" for k, v in ov.items())]
    if nproc > 1:
        return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return [PY, *args]


def harness(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> Proc:
    """``python -m validation ARGS`` (the nsa-validate CLI)."""
    return run([PY, "-m", "validation", *args], timeout=timeout, env=env)


# ------------------------------------------------------------------------------- runbooks
def run_one_point(tmp_path: Path, name: str, trainer: dict[str, Any], phase: dict[str, Any]) -> PhaseRecord:
    """The runbook ``name`` of one phase (its one point, on the cpu profile) run through the session in
    this process, its results under tmp_path/results; nothing of it left running."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "profiles": ["cpu"], "trainer": trainer, "phases": [phase]},
                                   sort_keys=False))
    (point,) = expand(load_runbook(path), load_profile("cpu"))
    rec = AcceptanceSession(SessionOptions(tmp_path / "results")).run_point(point)
    assert_no_orphans(str(tmp_path))
    return rec


def write_runbook(path: Path, phases: list[dict[str, Any]], name: str = "faults") -> Path:
    data = {"name": name, "description": "fault-injection suite (tests/faults)", "profiles": ["cpu"],
            "defaults": {"launcher": {"kind": "python"}, "config": "tiny",
                         "overrides": {**TINY, "dist.mode": "single"}, "env": {"OMP_NUM_THREADS": 1},
                         "steps": 6, "timeout_s": 120},
            "phases": phases}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fault_phase(name: str, fault: str = "", nproc: int = 1, steps: int = 6, **extra: Any) -> dict[str, Any]:
    phase: dict[str, Any] = {"name": name, "kind": "train", "steps": steps,
                             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1},
                                       {"metric": "steps_completed", "op": ">=", "threshold": steps}]}
    if nproc > 1:
        phase["launcher"] = {"kind": "torchrun", "nproc": nproc}
        phase["overrides"] = {"dist.mode": "ddp"}
    if fault:
        phase["env"] = {"NSA_FAULT": fault}
    phase.update(extra)
    return phase


#: the stalled-rank fault under each distributed mode: (its name, the matrix row). How rank 0
#: waits for rank 1 differs: DDP's gradient all-reduce runs inside autograd (no collective on its
#: stack), FSDP2 waits in the all-gather of the next layer's parameters
DIST_MODES = {"ddp": ("DDP", "stalled rank"), "fsdp": ("FSDP2", "stalled rank, FSDP2")}


#: the trainer's watchdog on the GPUs, as on CPU: each rank's CUDA context, NCCL communicator and
#: kernels come up in set-up and the first step, under watchdog.startup_s (its default)
NCCL_WATCHDOG_S = WATCHDOG_S
#: the trainer on each rank's GPU, DDP over NCCL (tests/faults/test_nccl_faults.py)
NCCL_OVERRIDES = {"dist.mode": "ddp", "train.device": "cuda", "dist.backend": "nccl",
                  "watchdog.timeout_s": NCCL_WATCHDOG_S}


def nccl_phase(name: str, fault: str, overrides: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """fault_phase under torchrun x2 with the trainer on two CUDA GPUs over NCCL."""
    phase = fault_phase(name, fault, nproc=2, **extra)
    phase["overrides"] = {**NCCL_OVERRIDES, **(overrides or {})}
    return phase


def load_env(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "env.json").read_text())


def load_store(results: Path) -> dict[str, Any]:
    return json.loads((results / "results.json").read_text())


def record(results: Path, phase: str) -> PhaseRecord:
    recs = [r for r in ResultStore(results).records() if r.key.phase == phase]
    assert len(recs) == 1, f"expected one record of phase {phase}, store has {len(recs)}"
    return recs[0]


def read_csv_column(run_dir: Path, column: str) -> dict[int, float]:
    """A run's training.csv column by step."""
    df = read_training_csv(run_dir)
    return dict(zip(df["step"].astype(int), df[column].astype(float)))


def findings_of(results: Path, phase: str) -> list[Finding]:
    return [f for f in find(ResultStore(results).records()) if f.phase == phase]


def finding(results: Path, phase: str, prefix: str) -> Finding:
    """The first finding of ``phase`` whose title starts with ``prefix`` (fails listing the titles)."""
    found = [f for f in findings_of(results, phase) if f.title.startswith(prefix)]
    assert found, f"no '{prefix}' finding for {phase}: {[f.title for f in findings_of(results, phase)]}"
    return found[0]


def finding_text(f: Finding) -> str:
    return f.title + "\n" + "\n".join(f.detail)


def assert_no_go_after(seeded: Any, rec: PhaseRecord, p: Proc) -> None:
    """After a faulted rank run through the harness (``seeded``: the suite's fixture): harness exit
    1 (NO-GO), the report names both runs, env.json records the fault, nothing orphaned or lost."""
    assert p.rc == 1, f"harness exit {p.rc}, expected 1 (NO-GO):\n{p.stderr[-2000:]}"
    report = (seeded.results / "reports" / "faults__cpu.md").read_text()
    assert "**Status: NO-GO**" in report
    assert "| healthy | default |" in report, "the earlier run is missing from the report"
    env = json.loads((seeded.results / rec.out_dir / "env.json").read_text())
    assert env["fault_injection"] == rec.env["NSA_FAULT"], "env.json must record the active fault"
    assert_no_orphans(str(seeded.root))
    seeded.intact()


# ---------------------------------------------------------------------------- nothing lost
def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> digest)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_no_orphans(marker: str, within_s: float = 10.0) -> None:
    """No live process has ``marker`` (a test's unique tmp dir) in its command line. Zombies
    (already dead, awaiting their reaper) have an empty cmdline and do not count."""
    deadline = time.monotonic() + within_s
    while True:
        alive = processes_with(marker)
        if not alive:
            return
        if time.monotonic() > deadline:
            for pid in alive:  # leave nothing behind for the next test, then fail this one
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"orphaned processes still running {within_s:g}s after the run: {alive}")
        time.sleep(0.2)


def processes_with(marker: str) -> dict[int, str]:
    me = os.getpid()
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if marker in cmd and state != "Z":
            out[int(d.name)] = cmd[:200]
    return out


def assert_nan_halt_named(seeded: Any, rec: PhaseRecord, p: Proc, bound_s: float) -> tuple[float, Finding]:
    """The NaN fault (``nan:rank=0:step=3``) judged right: FAIL 'non-finite loss at step 3', no stall
    (not the watchdog, no stall finding), rank 0 and step 3 named, halted before the optimizer step
    (the CSV stops at step 2), within ``bound_s`` of the fault, NO-GO. Returns the seconds from the
    fault to the end and the finding."""
    assert rec.status == "FAIL", rec
    assert "non-finite loss at step 3" in rec.reason, rec.reason
    assert "watchdog" not in rec.reason, "a NaN halt is not a watchdog stall"
    took = fault_to_end_s(seeded.results / rec.out_dir, 0, 3, "forward")
    assert took <= bound_s, f"{took:.1f}s from the fault to the end"
    titles = [f.title for f in findings_of(seeded.results, rec.phase)]
    assert not any(t.startswith("stall") for t in titles), titles
    f = finding(seeded.results, rec.phase, f"non-finite loss in {rec.phase}")
    assert "step 3" in f.title and "rank 0" in f.title, f.title
    # the verdict line and the report's summary name the rank, as for every other rank fault: not
    # only its place in a list of losses (which, in a world of several, the reader must count)
    assert [(r.rank, r.step) for r in f.diagnosis.ranks] == [(0, 3)], f.diagnosis
    line = verdict_line(rec)
    assert line.startswith("rank 0 had a non-finite loss (last heartbeat step 3, stage halt): loss nan at step 3 — "
                           "non-finite loss at step 3"), line
    report = (seeded.results / "reports" / "faults__cpu.md").read_text()
    assert f"failed: {rec.phase} [default] (rank 0 had a non-finite loss" in report, report[:800]
    assert rec.metrics.steps_completed == 2  # no NaN row logged
    assert_no_go_after(seeded, rec, p)
    return took, f


def fault_to_end_s(out_dir: Path, rank: int, step: int, stage: str) -> float:
    """Seconds from the fault (the faulted rank's first heartbeat at that step and stage) to the
    last write in the run's directory (torchrun's summary, or the harness's kill note): the
    fault's resolution time, without the start-up that a loaded CI box stretches."""
    t_fault = None
    for line in (out_dir / f"heartbeat_rank{rank}.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step") == step and rec.get("stage") == stage:
            t_fault = rec["time"]
            break
    assert t_fault is not None, f"rank {rank} never reached step {step} stage {stage}"
    t_end = max(p.stat().st_mtime for p in out_dir.rglob("*") if p.is_file())
    return t_end - t_fault
