"""Checkpoints and artifacts on disk, damaged: a clean stop resumes exactly; a truncated, corrupt
or hostile checkpoint is refused with one line naming the file and nothing already written is
lost; a torn training.csv row or heartbeat line (a writer killed mid-line) does not poison the
resumed run; a truncated or corrupt training.csv is an ERROR naming file, row and column."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from tests.faults import _util as U
from validation.contract.files import read_heartbeats, read_training_csv
from validation.judge.evidence import read_train
from validation.judge.metrics import RunData
from validation.judge.record import Status
from validation.judge.verdict import Outcome, verdict

pytestmark = pytest.mark.faults

STEPS, STOP = 8, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A reference run of STEPS steps, and a run stopped cleanly after STOP steps
    (train.run_steps: checkpoint, exit 0), both on the real trainer."""
    root = tmp_path_factory.mktemp("resume")
    ref, stopped = root / "ref", root / "stopped"
    procs = [(d, U.launch(U.trainer_argv(d, STEPS, ov), timeout=90)) for d, ov in
             ((ref, {}), (stopped, {"train.run_steps": STOP}))]
    import time
    t0 = time.monotonic()
    for d, proc in procs:
        p = U.finish(proc, timeout=90, started=t0)
        assert p.rc == 0, f"{d.name}: exit {p.rc}\n{p.stderr[-2000:]}"
    assert (stopped / "checkpoints" / "latest").read_text().strip() == f"step_{STOP:07d}.pt"
    return {"ref": ref, "stopped": stopped}


def _copy(runs, tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(runs["stopped"], d)
    return d


def _resume(d: Path) -> U.Proc:
    return U.run(U.trainer_argv(d, STEPS, {"train.resume": "auto"}), timeout=90)


def _losses(d: Path) -> list[tuple[int, float]]:
    df = read_training_csv(d)
    return list(zip(df["step"].tolist(), df["loss"].tolist()))


def test_clean_stop_then_resume_continues_exactly(runs, tmp_path, matrix):
    matrix.start("clean stop + resume", "`train.run_steps=4` (clean stop, checkpoint), then `train.resume=auto`",
                 "resumed loss curve equals an uninterrupted run's, step for step")
    d = _copy(runs, tmp_path)
    p = _resume(d)
    assert p.rc == 0, p.stderr[-2000:]
    assert _losses(d) == _losses(runs["ref"]), "the resumed run does not continue the loss curve exactly"
    beats = read_heartbeats(d)[0]
    assert [b["step"] for b in beats if b.get("stage") == "step"] == list(range(1, STEPS + 1))
    U.assert_no_orphans(str(tmp_path))
    matrix.done("exit 0", f"steps 1-{STEPS} identical to the reference run (loss to 6 significant digits)",
                p.elapsed, 90.0)


def _signal_while_step_3_runs(d: Path, signum: int, fault: str, overrides: dict | None = None):
    """A run of STEPS steps held at step 3 by ``fault``; ``signum`` (Ctrl-C's SIGINT, a scheduler's
    SIGTERM) once step 2 is in training.csv. Returns the process, the time of its launch and that of
    the signal."""
    import time
    proc = U.launch(U.trainer_argv(d, STEPS, overrides), timeout=90, env=U.clean_env({"NSA_FAULT": fault}))
    t0 = time.monotonic()
    csv = d / "training.csv"
    while not (csv.exists() and "\n2," in csv.read_text()):
        assert proc.poll() is None and time.monotonic() - t0 < 60, "the run ended or stalled before step 2"
        time.sleep(0.1)
    proc.send_signal(signum)
    return proc, t0, time.monotonic()


def test_ctrl_c_stops_after_the_step_in_flight_and_resumes_exactly(runs, tmp_path, matrix):
    matrix.start("Ctrl-C", "SIGINT while step 3 runs (`NSA_FAULT=stall:step=3:seconds=3` holds it), then "
                 "`train.resume=auto`", "exit 130 after step 3 with its checkpoint, one line and no traceback; "
                 "the resumed loss curve equals an uninterrupted run's")
    import signal
    d = tmp_path / "run"
    proc, t0, _ = _signal_while_step_3_runs(d, signal.SIGINT, "stall:step=3:seconds=3")
    p = U.finish(proc, timeout=60, started=t0)
    assert p.rc == 130, f"exit {p.rc}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr and "Ctrl-C: stopping after this step" in p.stderr, p.stderr[-2000:]
    assert (d / "checkpoints" / "latest").read_text().strip() == "step_0000003.pt"
    assert [s for s, _ in _losses(d)] == [1, 2, 3]
    r = _resume(d)
    assert r.rc == 0, r.stderr[-2000:]
    assert _losses(d) == _losses(runs["ref"]), "the resumed run does not continue the loss curve exactly"
    U.assert_no_orphans(str(tmp_path))
    matrix.done("exit 130, then exit 0", f"stopped after step 3 with its checkpoint; steps 1-{STEPS} after the "
                "resume identical to the reference run", p.elapsed, 60.0)


def test_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path):
    import signal
    import time
    d = tmp_path / "run"
    proc = U.launch(U.trainer_argv(d, STEPS), timeout=90, env=U.clean_env({"NSA_FAULT": "stall:step=2:seconds=20"}))
    t0 = time.monotonic()
    csv = d / "training.csv"  # written with its header before step 1: step 1's row says step 2 runs
    while not (csv.exists() and csv.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() - t0 < 60, "the run ended or stalled before step 1"
        time.sleep(0.1)
    for _ in range(2):
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
    p = U.finish(proc, timeout=15, started=time.monotonic())  # not the 20 s of the stall
    assert p.rc == 130, f"exit {p.rc}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr and "interrupted (Ctrl-C twice) at step 2" in p.stderr, p.stderr[-2000:]
    assert json.loads((d / "env.json").read_text())["status"] == "interrupted (Ctrl-C twice) at step 2"


def test_sigterm_stops_after_the_step_in_flight_with_a_checkpoint_and_resumes_exactly(runs, tmp_path):
    """Slurm's scancel and Kubernetes' pod deletion send SIGTERM and SIGKILL a grace period later:
    the run stops after the step in flight, saves it, and ends by SIGTERM (143 in a shell); a
    second SIGTERM (Slurm's proctrack/linuxproc sends one from slurmstepd and one through
    torchrun) does not cut the save short. It killed the run at once and lost every step since the
    last checkpoint."""
    import signal
    d = tmp_path / "run"
    proc, _, t_term = _signal_while_step_3_runs(d, signal.SIGTERM, "stall:step=3:seconds=3")
    proc.send_signal(signal.SIGTERM)
    p = U.finish(proc, timeout=60, started=t_term)
    assert p.rc == -signal.SIGTERM, f"exit {p.rc}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr and "SIGTERM: stopping after this step" in p.stderr, p.stderr[-2000:]
    assert (d / "checkpoints" / "latest").read_text().strip() == "step_0000003.pt"
    assert [s for s, _ in _losses(d)] == [1, 2, 3]
    assert json.loads((d / "env.json").read_text())["status"] == "stopped by SIGTERM after step 3"
    r = _resume(d)
    assert r.rc == 0, r.stderr[-2000:]
    assert _losses(d) == _losses(runs["ref"]), "the resumed run does not continue the loss curve exactly"
    U.assert_no_orphans(str(tmp_path))


def test_sigterm_to_a_run_that_cannot_stop_ends_it_by_sigterm_after_the_grace(tmp_path):
    """A rank blocked where Python never runs (a collective whose peer is gone) cannot stop after
    its step: the watchdog's thread ends it by SIGTERM's default action once
    watchdog.term_grace_s has passed, so that torchrun reports it killed by SIGTERM, a peer's
    collateral stop, and not by the SIGKILL it sends after its own grace (a failure of its own)."""
    import signal
    import time
    d = tmp_path / "run"
    proc, _, t_term = _signal_while_step_3_runs(d, signal.SIGTERM, "stall:step=3:seconds=60",
                                                 {"watchdog.term_grace_s": 2})
    p = U.finish(proc, timeout=30, started=t_term)
    assert p.rc == -signal.SIGTERM, f"exit {p.rc}\n{p.stderr[-2000:]}"
    assert 2 <= p.elapsed < 15, p.elapsed
    assert "did not stop within watchdog.term_grace_s=2" in p.stderr, p.stderr[-2000:]
    assert not (d / "checkpoints").exists(), "no step completed after the SIGTERM: nothing to save"
    U.assert_no_orphans(str(tmp_path))


def _refused(d: Path, needle: str, marker: Path | None = None) -> tuple[U.Proc, str]:
    """Resume must fail with exit 2 and ONE error line naming ``needle``; the earlier run's
    artifacts are untouched."""
    keep = {k: v for k, v in U.tree_digest(d).items() if not k.startswith("checkpoints")}
    p = _resume(d)
    errs = [ln for ln in p.stderr.splitlines() if "error" in ln.lower()]
    assert p.rc == 2, f"exit {p.rc}, expected 2 (bad input):\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(errs) == 1 and needle in errs[0], p.stderr[-3000:]
    after = {k: v for k, v in U.tree_digest(d).items() if not k.startswith("checkpoints")}
    assert after == keep, "a refused resume changed the earlier run's training.csv / heartbeats / env.json"
    if marker is not None:
        assert not marker.exists(), "the hostile checkpoint executed code"
    U.assert_no_orphans(str(d))
    return p, errs[0]


def test_truncated_checkpoint_is_refused(runs, tmp_path, matrix):
    matrix.start("truncated checkpoint", "checkpoint cut to half its size, then `train.resume=auto`",
                 "exit 2, one line naming the checkpoint file; earlier artifacts intact")
    d = _copy(runs, tmp_path)
    ck = d / "checkpoints" / f"step_{STOP:07d}.pt"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    p, line = _refused(d, str(ck))
    matrix.done("exit 2", line, p.elapsed, 90.0)


def test_corrupt_checkpoint_is_refused(runs, tmp_path, matrix):
    matrix.start("corrupt checkpoint", "checkpoint overwritten with random bytes, then `train.resume=auto`",
                 "exit 2, one line naming the checkpoint file; earlier artifacts intact")
    d = _copy(runs, tmp_path)
    ck = d / "checkpoints" / f"step_{STOP:07d}.pt"
    ck.write_bytes(bytes(range(256)) * 64)
    p, line = _refused(d, str(ck))
    matrix.done("exit 2", line, p.elapsed, 90.0)


class _Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_hostile_checkpoint_executes_nothing(runs, tmp_path, matrix):
    matrix.start("hostile checkpoint (pickle)", "a pickle whose load would run `os.system`, as the checkpoint",
                 "refused by weights_only loading: exit 2 naming the file; nothing executed")
    d = _copy(runs, tmp_path)
    ck = d / "checkpoints" / f"step_{STOP:07d}.pt"
    marker = tmp_path / "PWNED"
    ck.write_bytes(pickle.dumps({"format": 1, "x": _Evil(str(marker))}))
    p, line = _refused(d, str(ck), marker)
    matrix.done("exit 2", line, p.elapsed, 90.0)


def test_latest_pointer_to_missing_file(runs, tmp_path, matrix):
    matrix.start("checkpoint pointer to a missing file", "`checkpoints/latest` names a deleted file",
                 "exit 2, one line naming the pointer and the file")
    d = _copy(runs, tmp_path)
    (d / "checkpoints" / f"step_{STOP:07d}.pt").unlink()
    p, line = _refused(d, "latest")
    assert f"step_{STOP:07d}.pt" in line
    matrix.done("exit 2", line, p.elapsed, 90.0)


def test_torn_csv_row_does_not_survive_resume(runs, tmp_path, matrix):
    matrix.start("torn training.csv row on resume", "half a row appended to training.csv (a writer killed "
                 "mid-line), then `train.resume=auto`", "resume drops the torn row; the CSV reads cleanly and "
                 "equals the reference run")
    d = _copy(runs, tmp_path)
    with open(d / "training.csv", "a") as fh:
        fh.write(f"{STOP + 1},5.5")
    p = _resume(d)
    assert p.rc == 0, p.stderr[-2000:]
    assert _losses(d) == _losses(runs["ref"])
    matrix.done("exit 0; harness reads the CSV", f"steps 1-{STEPS} identical to the reference", p.elapsed, 90.0)


def test_torn_heartbeat_line(runs, tmp_path, matrix):
    matrix.start("torn heartbeat line", "half a JSON object appended to heartbeat_rank0.jsonl, read by the "
                 "harness, then `train.resume=auto`", "harness skips the torn last line; after the resume "
                 "every line is JSON and steps continue")
    d = _copy(runs, tmp_path)
    hb = d / "heartbeat_rank0.jsonl"
    before = read_heartbeats(d)[0]
    with open(hb, "a") as fh:
        fh.write('{"time": 1795000000.0, "rank": 0, "st')
    assert read_heartbeats(d)[0] == before, "the harness must skip a torn last line, keeping the rest"
    p = _resume(d)
    assert p.rc == 0, p.stderr[-2000:]
    beats = read_heartbeats(d)[0]  # raises ArtifactError on a torn line in the middle
    assert [b["step"] for b in beats if b.get("stage") == "step"] == list(range(1, STEPS + 1))
    matrix.done("harness reads all records", "torn line skipped before; no torn line after resume",
                p.elapsed, 90.0)


def _harness_verdict(d: Path, exit_code: int = 0) -> tuple[str, str]:
    run = RunData(out_dir=d, world_size=1, steps_requested=STEPS)
    run.exit_code, run.timed_out = exit_code, False
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    return verdict(Outcome.of_run("train", run, errors), [])


@pytest.mark.parametrize("cut", [30, 3])
def test_truncated_training_csv_is_error_naming_the_cut_row(runs, tmp_path, matrix, cut):
    """Cut mid-row: 30 bytes leave an empty column, 3 bytes a last value cut short that still
    parses (the row is not read either way); the trainer exited 0, so its last step is missing
    from its file: ERROR naming the file and the row."""
    matrix.start(f"truncated training.csv (harness), {cut} bytes cut", "a real run's training.csv cut mid-row, "
                 "the trainer's exit 0", "ERROR naming training.csv and the row cut off")
    d = tmp_path / "ref"
    shutil.copytree(runs["ref"], d)
    data = (d / "training.csv").read_bytes()
    (d / "training.csv").write_bytes(data[: len(data) - cut])
    status, reason = _harness_verdict(d)
    assert status == Status.ERROR, (status, reason)
    assert f"{d / 'training.csv'}: the last row has no line end though the trainer exited 0" in reason, reason
    matrix.done(status, reason.replace(str(tmp_path), "<tmp>"), None, None)


def test_a_row_cut_off_by_a_killed_writer_is_not_read(runs, tmp_path):
    """A crashed or killed trainer may leave its last row torn: the row is not read (its cut
    value is no step's), the complete rows are judged, and the run is a FAIL for its exit."""
    d = tmp_path / "ref"
    shutil.copytree(runs["ref"], d)
    data = (d / "training.csv").read_bytes()
    (d / "training.csv").write_bytes(data[: len(data) - 3])
    status, reason = _harness_verdict(d, exit_code=1)
    assert status == Status.FAIL and "line end" not in reason, (status, reason)


def test_corrupt_training_csv_is_error(runs, tmp_path, matrix):
    matrix.start("corrupt training.csv (harness)", "a real run's training.csv with a garbage value and, "
                 "separately, binary junk", "ERROR naming the file (and row/column when it parses as CSV)")
    d = tmp_path / "ref"
    shutil.copytree(runs["ref"], d)
    lines = (d / "training.csv").read_text().splitlines()
    lines[3] = lines[3].replace(lines[3].split(",")[3], "fast", 1)
    (d / "training.csv").write_text("\n".join(lines) + "\n")
    status, reason = _harness_verdict(d)
    assert status == Status.ERROR and "line 4 (step 3), column toks_per_s: 'fast' is not a number" in reason, reason
    (d / "training.csv").write_bytes(b"\x00\xff\xfe junk \x00" * 50)
    status2, reason2 = _harness_verdict(d)
    assert status2 == Status.ERROR and str(d / "training.csv") in reason2, reason2
    matrix.done(status, reason.replace(str(tmp_path), "<tmp>"), None, None)
