"""A real Hugging Face Trainer (examples/hf_trainer/train.py, transformers installed as users install
it) judged through the hf_trainer adapter, end to end on CPU, through both doors (`nsa-validate run`
and `pytest -m <phase> --runbook ...`): GO, and the faults of its own world, each judged right:
one torchrun worker SIGKILLed, a learning rate that blows up (NaN), one rank frozen by SIGSTOP
(a hang), the data running dry before max_steps (the Trainer ends with exit 0).

The signals come from outside, as an out-of-memory killer or an operator sends them: a thread here
waits until the output folder shows step 3, then signals the worker whose environment says RANK=1.
Each run imports transformers in every rank (tens of seconds on a loaded 2-core box): slow."""
from __future__ import annotations

import importlib.util
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.faults import _util as U
from validation.contract.adapters import ADAPTERS
from validation.judge.findings.headline import verdict_line

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("transformers", "accelerate", "tensorboard")),
                       reason="needs transformers, accelerate and tensorboard (pip install -e '.[test]')"),
]

RUNBOOK = U.REPO / "runbooks" / "hf_trainer_cpu.yaml"
STEPS = 12
FAULT_STEP = 3
STALL_S = 10
DOORS = ("cli", "pytest")


def _runbook(root: Path, phase: dict[str, Any]) -> Path:
    """The shipped runbook's trainer and defaults, with one phase of the test's."""
    data = yaml.safe_load(RUNBOOK.read_text())
    data["name"] = "hf_faults"
    data["phases"] = [{"kind": "train", "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}], **phase}]
    path = root / "hf_faults.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(door: str, rb: Path, phase: str, results: Path) -> U.Proc:
    if door == "cli":
        argv = [U.PY, "-m", "validation", "run", "--runbook", str(rb), "--profile", "cpu", "--results-dir",
                str(results), "--phase", phase, "--no-plots"]
    else:
        argv = [U.PY, "-m", "pytest", "-p", "no:cacheprovider", "-q", "validation/tests/test_acceptance.py",
                f"--runbook={rb}", f"--results-dir={results}", "-m", phase]
    return U.run(argv, timeout=400)


class _Signal(threading.Thread):
    """Once the output folder of the run under ``results`` shows step ``at``, send ``sig`` to the
    trainer process whose environment says RANK=``rank``."""

    def __init__(self, results: Path, sig: signal.Signals, rank: int, at: int):
        super().__init__(daemon=True)
        self.results, self.sig, self.rank, self.at = results, sig, rank, at
        self.sent: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        readers: dict[Path, Any] = {}
        while not self.stop.wait(0.2):
            for folder in (self.results / "runs").rglob("trainer_out"):
                readers.setdefault(folder, ADAPTERS["hf_trainer"].live_steps(folder))
            if any((r() or 0) >= self.at for r in readers.values()):
                break
        else:
            return
        marker = str(self.results)
        for p in psutil.process_iter(["pid", "cmdline", "environ"]):
            try:
                if marker in " ".join(p.info["cmdline"] or []) and (p.info["environ"] or {}).get("RANK") == str(self.rank):
                    os.kill(p.info["pid"], self.sig)
                    self.sent = p.info["pid"]
                    return
            except (psutil.Error, TypeError, ProcessLookupError):
                continue


def _signalled(door: str, tmp_path: Path, phase: dict[str, Any], sig: signal.Signals):
    results = tmp_path / "results"
    rb = _runbook(tmp_path, phase)
    sender = _Signal(results, sig, 1, FAULT_STEP)
    sender.start()
    try:
        p = _run(door, rb, phase["name"], results)
    finally:
        sender.stop.set()
        sender.join(5)
    assert sender.sent is not None, f"rank 1 was never signalled:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p, U.record(results, phase["name"]), results


@pytest.mark.parametrize("door", DOORS)
def test_go(door, tmp_path):
    """The shipped runbook's single process point: every gate passes, the adapter says what it read."""
    results = tmp_path / "results"
    p = _run(door, RUNBOOK, "single_process", results)
    rec = U.record(results, "single_process")
    assert rec.status == "PASS", (rec.reason, p.stdout[-2000:], p.stderr[-2000:])
    # the runbook's other point did not run: INCOMPLETE (the CLI's exit 3; pytest's exit 1 for any run not GO)
    report = (results / "reports" / "hf_trainer_cpu__cpu.md").read_text()
    assert "**Status: INCOMPLETE**" in report and p.rc == (3 if door == "cli" else 1), (p.rc, report[:800])
    assert "- **Read through its adapter**: single_process [default]: hf_trainer read `trainer_state.json` " \
           "(log_history: loss, lr, grad_norm per logged step); `runs/" in report, report[:3000]
    assert "UNMEASURED: mem_alloc_gb (a Trainer logs no memory)" in report
    env = U.load_env(results / rec.out_dir)
    assert env["adapter"]["name"] == "hf_trainer" and env["adapter"]["summary_step"] == STEPS
    assert env["tokens_per_step"] == 4 * 64
    assert "trainer_state.json" in env["adapter"]["read"]
    assert any(k.startswith("runs/") for k in env["adapter"]["read"])


@pytest.mark.distributed
@pytest.mark.parametrize("door", DOORS)
def test_a_killed_rank(door, tmp_path):
    phase = {"name": "killed", "launcher": {"kind": "torchrun", "nproc": 2}, "overrides": {"dist.backend": "gloo"}}
    p, rec, results = _signalled(door, tmp_path, phase, signal.SIGKILL)
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    f = U.finding(results, "killed", "crash")
    text = U.finding_text(f)
    assert "rank 1" in f.title and "SIGKILL" in text, text
    assert p.rc == 1
    U.assert_no_orphans(str(tmp_path))


@pytest.mark.distributed
@pytest.mark.parametrize("door", DOORS)
def test_a_frozen_rank_is_a_stall(door, tmp_path):
    phase = {"name": "frozen", "launcher": {"kind": "torchrun", "nproc": 2}, "overrides": {"dist.backend": "gloo"},
             "stall_s": STALL_S}
    p, rec, results = _signalled(door, tmp_path, phase, signal.SIGSTOP)
    assert rec.status == "FAIL" and rec.reason.startswith("stalled"), rec.reason
    assert p.rc == 1
    U.assert_no_orphans(str(tmp_path))


@pytest.mark.parametrize("door", DOORS)
def test_a_learning_rate_that_blows_up(door, tmp_path):
    results = tmp_path / "results"
    rb = _runbook(tmp_path, {"name": "blowup", "overrides": {"train.lr": 1e30, "train.max_grad_norm": 0}})
    p = _run(door, rb, "blowup", results)
    rec = U.record(results, "blowup")
    assert rec.status == "FAIL" and rec.reason.startswith("loss_finite = 0"), rec.reason
    loss = U.read_csv_column(results / rec.out_dir, "loss")
    assert math.isfinite(loss[1]) and math.isnan(loss[2]), loss  # the first step's update blew the weights up
    assert p.rc == 1


def test_a_trainer_that_dies_before_its_output_folder_is_read_in_its_own_format(tmp_path):
    """A flag the Trainer's parser refuses: it exits before making its output folder, and the
    adapter never ran; the run was judged as one of the contract's format: 'rank 0 crashed (no
    heartbeat written) ... trainer ended before its first step', words of files a Trainer never
    writes."""
    data = yaml.safe_load(RUNBOOK.read_text())
    data["trainer"]["args"] = [*data["trainer"]["args"], "--no_such_flag", "1"]
    rb = tmp_path / "hf_bad_flag.yaml"
    rb.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    p = _run("cli", rb, "single_process", results)
    rec = U.record(results, "single_process")
    assert rec.status == "FAIL" and rec.reason == "trainer ended with no step logged (exit code 1)", rec.reason
    line = verdict_line(rec)
    assert line.startswith("rank 0 crashed: ValueError: Some specified arguments are not used by the "
                           "HfArgumentParser") and "heartbeat" not in line, line
    assert p.rc == 1


def test_a_model_that_does_not_learn_fails_the_shipped_gates(tmp_path):
    """The shipped runbook at learning rate 1e6: the first update leaves the model dead, its loss
    flat at 5.545 from step 2 (finite, every step done, fast), and the point passed."""
    data = yaml.safe_load(RUNBOOK.read_text())
    data["defaults"]["overrides"]["train.lr"] = 1e6
    rb = tmp_path / "hf_dead.yaml"
    rb.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    p = _run("cli", rb, "single_process", results)
    rec = U.record(results, "single_process")
    assert rec.status == "FAIL" and rec.reason.startswith("loss_drop = "), (rec.reason, p.stdout[-2000:])
    assert p.rc == 1


@pytest.mark.parametrize("door", DOORS)
def test_data_that_runs_dry_is_not_done(door, tmp_path):
    """Twelve blocks of text: the stream runs dry long before step 12; the Trainer (its batches
    not dispatched from rank 0, accelerator_config.json: accelerate's dispatcher raises instead)
    warns that an epoch had no sample, saves its state and exits 0."""
    results = tmp_path / "results"
    rb = _runbook(tmp_path, {"name": "dry", "overrides": {"data.max_bytes": 3 * 4 * 64 + 10,
                                                        "train.accelerator_config": "accelerator_config.json"}})
    p = _run(door, rb, "dry", results)
    rec = U.record(results, "dry")
    assert rec.exit_code == 0
    assert rec.status == "FAIL" and f"of {STEPS}" in rec.reason and "stopped after step" in rec.reason, rec.reason
    assert p.rc == 1


@pytest.mark.parametrize("resumes", [True, False], ids=["resumed", "flag-ignored"])
def test_a_run_stopped_after_its_checkpoint_resumes_from_it(tmp_path, resumes):
    """The shipped runbook's resume point: the example stopped after step 6 (its checkpoint-6) and
    started again with --resume_from_checkpoint. The example ignored the flag, as a script that never
    passes it on to train() does (the Trainer leaves it to the script): its second half trained
    from step 1 again. It now resumes: GO, the resumed run's losses those of the uninterrupted run,
    its events beginning at step 7. A script that still ignores it (here: the first half's folder
    given to a flag the Trainer does nothing with) is NO-GO."""
    rb = RUNBOOK
    if not resumes:
        data = yaml.safe_load(RUNBOOK.read_text())
        data["trainer"]["resume"]["from"] = {"flag": "--run_name"}
        rb = tmp_path / "hf_ignored.yaml"
        rb.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    p = _run("cli", rb, "resume", results)
    rec = U.record(results, "resume")
    if not resumes:
        assert rec.status == "FAIL" and "did not resume: the second half trained steps 1-6 again" in rec.reason, \
            rec.reason
        assert p.rc == 1
        return
    assert rec.status == "PASS", (rec.reason, p.stdout[-2000:], p.stderr[-2000:])
    gates = {g.metric: g for g in rec.gates}
    assert (gates["resume_first_step"].value, gates["resume_loss_rel_diff"].value) == (7.0, 0.0), gates
