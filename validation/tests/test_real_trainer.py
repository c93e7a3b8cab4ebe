"""End to end with the real trainer (nsa.train) on CPU: the harness reads its contract, and its
own fault injection (NSA_FAULT) gives the right NO-GO findings. The full smoke runbook is the
cpu_profile acceptance run (test_acceptance.py); these are the faults it must catch."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nsa.train") is None,
                                reason="the trainer nsa.train is not in this checkout yet")

TINY = {"data.dataset": "synthetic", "train.seq_len": 64, "train.batch_size": 1, "train.save_final": False,
        "watchdog.timeout_s": 60, "watchdog.poll_s": 0.5, "watchdog.grace_s": 2}


def _phase(name, **kw):
    return {"name": name, "kind": "train", **kw}


def _top():
    return {"defaults": {"launcher": {"kind": "python"}, "config": "tiny", "overrides": TINY,
                         "env": {"OMP_NUM_THREADS": 1}, "steps": 4, "timeout_s": 120}}


def test_healthy_run_reads_the_contract(fake_run):
    run = fake_run([_phase("sdpa_audit", env={"NSA_SDPA_AUDIT": 1, "NSA_PREFILL_BATCHED": 1},
                           gates=[{"metric": "backends_recorded", "op": "==", "threshold": 1},
                                  {"metric": "steps_completed", "op": ">=", "threshold": 4},
                                  {"metric": "toks_per_s_mean", "op": ">", "threshold": 0, "window": "last 2 steps"}])],
                   **_top())
    rec = run.record
    assert rec.status == "PASS", rec.reason + rec.evidence.stderr_tail
    assert set(rec.backends) >= {"cmp", "sel", "win"}
    assert rec.git_sha and rec.git_sha_source, "the trainer's env.json names the commit and its source"
    assert rec.env_seen.get("NSA_SDPA_AUDIT") == "1"
    assert "NSA_PREFILL_BATCHED" in rec.noop_toggles
    assert "No-op toggles" in run.report and "NSA_PREFILL_BATCHED" in run.report


def test_injected_crash_is_nogo_with_the_exception(fake_run):
    run = fake_run([_phase("baseline_ddp", env={"NSA_FAULT": "crash:step=2:stage=backward"},
                           gates=[{"metric": "loss_finite", "op": "==", "threshold": 1}])], **_top())
    assert run.record.status == "FAIL" and run.record.exit_code not in (0, None)
    [crash] = [f for f in run.findings("critical") if f.startswith("crash")]
    assert "InjectedFault" in crash
    assert run.context["status"] == "NO-GO"


@pytest.mark.distributed
def test_injected_stall_under_torchrun_shows_each_rank(fake_run):
    # watchdog 15s: long enough that a loaded CI box finishes DDP setup before it can fire
    run = fake_run([_phase("long_run", launcher={"kind": "torchrun", "nproc": 2},
                           overrides={"dist.mode": "ddp", "watchdog.timeout_s": 15},
                           env={"NSA_FAULT": "stall:rank=1:step=3"}, steps=6,
                           gates=[{"metric": "halt", "op": "==", "threshold": 0}])], **_top())
    rec = run.record
    assert rec.status == "FAIL" and ".HALT" in rec.reason
    assert set(rec.evidence.stackdumps) == {0, 1}
    [stall] = [f for f in run.findings("critical") if f.startswith("stall")]
    assert "rank 0 in _engine_run_backward" in stall          # the healthy rank waits in backward's allreduce
    assert "rank 1: last heartbeat step 3" in stall and "faults.py" in stall  # the stalled rank, where it stopped
