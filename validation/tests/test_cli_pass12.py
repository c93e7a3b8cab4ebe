"""The CLI and the report as a demanding user types and reads them (QA pass 12): each defect
found, with a test that failed before its fix. Stores are hand-built or come from the fake
trainer (validation/tests/fake_trainer.py); nothing here runs the real trainer."""
from __future__ import annotations

from pathlib import Path

from validation.session.session import AcceptanceSession, SessionOptions
from validation.tests.conftest import train_phase, write_runbook


def test_phases_given_out_of_order_run_in_runbook_order(tmp_path):
    """`run --help` says "--phase ... each phase runs once, in runbook order", but `--phase
    long_run --phase baseline_ddp` ran long_run first: the order typed, not the runbook's."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("sdpa_audit"), train_phase("long_run")])
    session = AcceptanceSession(SessionOptions(tmp_path / "r", runbooks=(str(rb),),
                                               phases=("long_run", "baseline_ddp", "long_run")))
    assert [p.phase.name for p in session.points()] == ["baseline_ddp", "long_run"]
