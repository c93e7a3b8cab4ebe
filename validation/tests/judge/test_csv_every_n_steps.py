"""A trainer that logs training.csv every N steps: its CSV ends before the last step while its
heartbeats record every step. Done with every step, it did not stop early; stopped early, the
verdict says where its heartbeats got to beside its CSV."""
from __future__ import annotations

from validation.judge.record import Status
from validation.tests.conftest import train_phase

LOSS_ONLY = [{"metric": "loss_finite", "op": "==", "threshold": 1}]


def test_a_run_that_did_every_step_but_logs_every_5_is_not_a_short_run(fake_run):
    run = fake_run([train_phase(gates=LOSS_ONLY, steps=12, env={"NSA_FAKE_LOG_EVERY": "5"})])
    rec = run.record
    assert rec.metrics.steps_completed == 10
    assert rec.status == Status.PASS, rec.reason
    assert "training.csv ends at step 10 while the trainer reached step 12 (its heartbeats)" in rec.reason
    assert "stopped after" not in rec.reason and not any("stopped" in f for f in run.findings()), run.findings()


def test_a_run_that_stopped_early_says_how_far_its_heartbeats_got(fake_run):
    run = fake_run([train_phase(gates=LOSS_ONLY, steps=12, env={"NSA_FAKE_LOG_EVERY": "5", "NSA_FAULT": "quit:step=11"})])
    rec = run.record
    assert rec.status == Status.FAIL
    assert rec.reason == ("stopped after step 10 (training.csv; its heartbeats reached step 11) of 12, exit 0, "
                          "no .HALT"), rec.reason
