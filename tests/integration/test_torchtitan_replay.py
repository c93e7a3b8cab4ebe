"""torchtitan judged end to end on CPU from what a real run wrote: torchtitan needs CUDA, so a
stand-in (tests/trainers/torchtitan_replay.py) plays back the output recorded from torchtitan
0.2.2 on one H200 (validation/tests/evidence/torchtitan_*) under torchrun, as the runbook's
trainer: its log line by line into the harness's capture, its TensorBoard events and
flight-recorder dump into its dump folder, and its end (exit 0, SIGKILL, or stopped for good).
The harness launches it, watches its log for progress, converts it through the torchtitan
adapter and judges it: the run to GO passes its gates (the cpu profile's short stability windows
also flag its loss bump at step 24), and each fault is the right NO-GO."""
from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Status
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions
from validation.store.results import ResultStore

TRAINER: dict[str, Any] = {
    "name": "torchtitan", "root": "tests/trainers", "script": "torchtitan_replay.py",
    "args": ["--metrics.enable_tensorboard", "--metrics.log_freq", "1"],
    "steps": {"flag": "--training.steps"}, "out_dir": {"flag": "--job.dump_folder"},
    "params": {"replay.case": {"flag": "--evidence"}}, "format": "torchtitan"}
GATES = [{"metric": "loss_finite", "op": "==", "threshold": 1},
         {"metric": "steps_completed", "op": ">=", "threshold": 30},
         {"metric": "toks_per_s_mean", "op": ">", "threshold": 0, "window": "last 10 steps"},
         {"metric": "mem_alloc_gb_max", "op": ">", "threshold": 0}]


def _point(name: str, case: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "train", "overrides": {"replay.case": case}, "gates": GATES, **extra}


def _runbook(path: Path, phases: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "torchtitan_replay", "profiles": ["cpu"], "trainer": TRAINER,
        "defaults": {"launcher": {"kind": "torchrun", "nproc": 1}, "steps": 30, "timeout_s": 150,
                     "stall_s": 10, "startup_s": 120, "env": {"OMP_NUM_THREADS": 1}},
        "phases": phases}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("torchtitan")
    rb = _runbook(tmp / "torchtitan_replay.yaml", [
        _point("go", "go"), _point("short", "go", steps=40), _point("nan", "nan", steps=20),
        _point("kill", "kill"), _point("hang", "hang")])
    points = expand(load_runbook(rb), load_profile("cpu"))
    session = AcceptanceSession(SessionOptions(tmp / "results"))
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip((p.phase.name for p in points), pool.map(session.run_point, points)))


def test_the_recorded_run_passes_its_gates_through_the_torchtitan_adapter(records):
    go = records["go"]
    assert go.status == Status.PASS, go.reason
    values = {g.metric: g.value for g in go.gates}
    assert go.trainer == "torchtitan" and values["steps_completed"] == 30
    assert values["mem_alloc_gb_max"] > 0  # from its TensorBoard events: the log has no allocated memory


def test_a_run_ending_short_with_exit_0_is_no_GO(records):
    """torchtitan logs 'Training completed' and exits 0 when its data runs out: the recorded run,
    asked for 40 steps, ran 30."""
    short = records["short"]
    assert short.status == Status.FAIL and short.exit_code == 0
    assert "30" in short.reason and "40" in short.reason, short.reason


def test_a_blown_up_learning_rate_fails_loss_finite(records):
    nan = records["nan"]
    assert nan.status == Status.FAIL and nan.exit_code == 0, nan.reason
    assert {g.metric: g.verdict.name for g in nan.gates}["loss_finite"] == "FAIL"


def test_a_killed_rank_is_a_crash_by_its_signal(records):
    kill = records["kill"]
    assert kill.status == Status.FAIL and kill.exit_code not in (0, None)
    (finding,) = find([kill])
    assert finding.title.startswith("crash") and "rank 0: killed by SIGKILL" in finding.title, finding.title


def test_a_stopped_rank_is_a_stall_and_the_flight_recorder_dump_is_named(records):
    hang = records["hang"]
    assert hang.status == Status.FAIL and hang.stalled_s is not None, hang.reason
    assert "stall" in hang.reason, hang.reason
    assert "comm_trace_rank0" in hang.evidence.files


def test_both_doors_judge_it_alike(tmp_path):
    """``nsa-validate run`` and ``pytest -m``: GO for the recorded run, NO-GO for it cut short."""
    rb = _runbook(tmp_path / "doors.yaml", [_point("go", "go"), _point("short", "go", steps=40)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "cli"), "--no-plots"]) == 1
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", "--runbook", str(rb), "--profile", "cpu",
                          f"--results-dir={tmp_path / 'door'}"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 1 and "FAIL: stopped after step 30 of 40, exit 0" in out.stdout, \
        out.stdout[-3000:] + out.stderr[-2000:]
    # the cpu profile's 10-step stability windows see the debug model's loss bump at step 24 (a rise
    # of 0.22 nats over steps 21-30): a critical finding, which fails the point at pytest's door
    assert "PASS by its gates, but critical: loss diverging in go" in out.stdout, out.stdout[-3000:]
    for store in (tmp_path / "cli", tmp_path / "door"):
        assert {r.key.phase: r.status for r in ResultStore(store).records()} == {"go": Status.PASS, "short": Status.FAIL}


def _restart_runbook(path: Path, specs: dict[str, str]) -> Path:
    """torchtitan under torchrun --max-restarts=1, a phase per ``torchtitan_replay.py --attempts`` spec."""
    trainer = {**TRAINER, "args": ["--metrics.log_freq", "1", "--evidence", "go"],
               "params": {"replay.attempts": {"flag": "--attempts"}}}
    path.write_text(yaml.safe_dump({
        "name": "torchtitan_restart", "profiles": ["cpu"], "trainer": trainer,
        "defaults": {"launcher": {"kind": "torchrun", "nproc": 1,
                                  "torchrun_args": ["--standalone", "--max-restarts=1"]},
                     "steps": 30, "timeout_s": 150, "stall_s": 10, "startup_s": 120, "env": {"OMP_NUM_THREADS": 1}},
        "phases": [{"name": name, "kind": "train", "overrides": {"replay.attempts": spec}, "gates": GATES[:3]}
                   for name, spec in specs.items()]}, sort_keys=False))
    return path


def test_a_restart_in_one_stdout_is_judged_by_the_attempt_that_trained_last(tmp_path):
    """torchrun --max-restarts=1 restarting torchtitan after a crash: both attempts print into the
    one stdout (and stderr) the harness keeps (the recorded run replayed as attempts,
    torchtitan_replay.py --attempts). The first attempt's non-finite loss at step 12 made the run
    NO-GO though the restarted attempt resumed at step 11 and trained on to step 30 cleanly; the
    crash is still said, as the resume in place it was. A last attempt's own non-finite loss stays
    NO-GO, and a restart from step 1 is read as the dump folder's log per attempt reads it."""
    rb = _restart_runbook(tmp_path / "torchtitan_restart.yaml", {
        "resumed": "1:nan@12,11:", "from_scratch": "1:nan@12,1:", "nan_last": "1:kill@9,6:nan@15"})
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "cli"), "--no-plots"]) == 1
    records = {r.key.phase: r for r in ResultStore(tmp_path / "cli").records()}
    for name in ("resumed", "from_scratch"):
        assert records[name].status == Status.PASS, records[name].reason
        assert {g.metric: g.value for g in records[name].gates}["steps_completed"] == 30
    nan_last = records["nan_last"]
    assert nan_last.status == Status.FAIL and {g.metric: g.verdict.name for g in nan_last.gates}["loss_finite"] == "FAIL"
    assert "non-finite loss at step 15" in nan_last.reason, nan_last.reason
    report = (tmp_path / "cli" / "reports" / "torchtitan_restart__cpu.md").read_text()
    assert ("trainer resumed in place in resumed [default]: it went back to a checkpoint and wrote again from step 11 "
            "into the same files") in report, report
    assert ("trainer resumed in place in from_scratch [default]: it started again from step 1 and wrote its steps "
            "again into the same files") in report, report
    assert re.search(r"attempt 1 ended as rank 0 \(pid \d+\) failed: RuntimeError: Loss is not finite "
                     r"\(global_avg_loss=nan\) at step 12", report), report
    assert "non-finite loss in resumed" not in report and "non-finite loss in from_scratch" not in report, report


def _warning(records: dict[str, Any], name: str) -> Any:
    """The resumed-in-place warning of the point ``name``."""
    [warning] = [f for f in find(list(records.values())) if f.kind == "resumed_in_place" and f.phase == name]
    return warning


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> dict[str, Any]:
    """Three runs torchrun --max-restarts=1 restarted into one stdout, through nsa-validate run: an
    attempt killed after going back to step 6, a restart at the step after the last one logged, and
    an attempt killed, then one that met a non-finite loss. Their records, by phase."""
    tmp = tmp_path_factory.mktemp("restarted")
    rb = _restart_runbook(tmp / "rb.yaml", {"nofurther": "1:nan@12,6:kill@6", "exact": "1:kill@9,9:",
                                            "misquote": "1:kill@9,6:nan@15"})
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp / "cli"), "--no-plots"]) == 1
    return {r.key.phase: r for r in ResultStore(tmp / "cli").records()}


def test_an_attempt_that_died_before_its_first_step_undoes_the_steps_it_went_back_over(restarted):
    """The report read steps 1..11 of a run whose restart went back to step 6 and was killed there,
    and said nothing of the restart: the run stands at step 5."""
    steps = {name: {g.metric: g.value for g in r.gates}["steps_completed"] for name, r in restarted.items()}
    assert steps == {"nofurther": 5, "exact": 30, "misquote": 14}, steps
    assert restarted["nofurther"].status == Status.FAIL
    warning = _warning(restarted, "nofurther")
    assert warning.title == ("trainer resumed in place in nofurther [default]: it was started again at step 6 into "
                             "the same files"), warning.title
    assert ("the trainer's log: attempt 2 began at step 6 (attempt 1 had logged up to step 11) and logged no step"
            in warning.detail), warning.detail
    assert re.search(r"attempt 1 ended as rank 0 \(pid \d+\) failed: RuntimeError: Loss is not finite "
                     r"\(global_avg_loss=nan\) at step 12; attempt 2 ended as rank 0 \(pid \d+\) was killed by "
                     r"SIGKILL$", warning.detail[-1]), warning.detail


def test_a_run_is_judged_by_its_last_attempts_end_and_an_earlier_attempts_failure_is_that_attempts(restarted):
    """Non-finite at step 12, then the restart from step 6 killed by SIGKILL: the verdict was 'rank 0 had
    a non-finite loss (last heartbeat step 5 ...): loss nan at step 12', attempt 1's .HALT, and its finding
    'stopped on its non-finite loss at step 12 ..., then killed by SIGKILL', attempt 2's end joined to it.
    The run's end is attempt 2's SIGKILL; attempt 1's exception is said as attempt 1's."""
    rec = restarted["nofurther"]
    assert rec.evidence.halt is None and verdict_line(rec).startswith(
        "rank 0 crashed (last heartbeat step 5, stage step): killed by SIGKILL"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.phase == "nofurther" and f.severity.value == "critical"]
    assert crash.title == "crash in nofurther [default]: exit code 1: rank 0: killed by SIGKILL", crash.title
    assert "rank 0: last heartbeat step 5, stage step; killed by SIGKILL" in crash.detail, crash.detail
    assert re.fullmatch(r"earlier attempts, each followed by torchrun starting the workers again \(trainer.stderr.log\): "
                        r"attempt 1 ended as rank 0 \(pid \d+\) failed: RuntimeError: Loss is not finite "
                        r"\(global_avg_loss=nan\) at step 12", crash.detail[-1]), crash.detail


def test_a_restart_that_repeats_no_step_is_said(restarted):
    """Killed after step 8 and resumed at step 9, the run trained to step 30: GO, and the report said
    nothing of the crash, as no step was logged twice."""
    assert restarted["exact"].status == Status.PASS, restarted["exact"].reason
    warning = _warning(restarted, "exact")
    assert warning.title == ("trainer resumed in place in exact [default]: it was started again at step 9 into the "
                             "same files"), warning.title
    assert ("the trainer's log: attempt 2 began at step 9 (attempt 1 had logged up to step 8) and logged up to step 30"
            in warning.detail), warning.detail
    assert re.search(r"attempt 1 ended as rank 0 \(pid \d+\) was killed by SIGKILL$", warning.detail[-1]), \
        warning.detail


def test_each_attempts_failure_is_its_own(restarted):
    """Killed at step 9, resumed at step 6, non-finite at step 15: the warning gave the second
    attempt's non-finite loss as the end of the earlier process, which was killed."""
    said = _warning(restarted, "misquote").detail[-1]
    assert re.search(r"attempt 1 ended as rank 0 \(pid \d+\) was killed by SIGKILL; attempt 2 ended as "
                     r"rank 0 \(pid \d+\) failed: RuntimeError: Loss is not finite \(global_avg_loss=nan\) at step 15$",
                     said), said
