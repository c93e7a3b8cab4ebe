"""Learning is a gate (issue 24, case 8): the smoke runbook trained on random bytes (loss flat at
ln 256) and nothing checked that the model learns; real_data had no gate on its loss either."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from nsa.contract import CSV_COLUMNS
from validation.judge.metrics import METRICS, RunData, compute
from validation.judge.record import Status
from validation.runbook.load import load_runbook
from validation.tests.conftest import train_phase

#: data a model can learn (the trainer's data.dataset values; synthetic is uniform random bytes)
LEARNABLE = ("pattern", "text")


def _run(tmp_path, losses: list[float]) -> RunData:
    rows = [[s, v, 1e-4, 100.0, 0.1, 1.0, 0.5, 1.0] for s, v in enumerate(losses, start=1)]
    return RunData(tmp_path, csv=pd.DataFrame(rows, columns=list(CSV_COLUMNS)))


def test_loss_drop_is_the_first_steps_mean_minus_the_last_steps_mean(tmp_path):
    run = _run(tmp_path, [5.5, 5.0, 4.5, 4.0, 3.0, 2.0, 1.0, 2.0, 3.0])
    assert compute("loss_drop", run, None) == pytest.approx(5.0 - 2.0)  # (5.5+5+4.5)/3 - (1+2+3)/3
    assert compute("loss_drop", run, 4) == pytest.approx((2.0 + 1.0) / 2 - (2.0 + 3.0) / 2)  # steps 6..9, k = 2
    assert compute("loss_drop", _run(tmp_path, [5.5, 5.5, 5.6]), None) == pytest.approx(-0.1)  # k = 1: not learning
    assert compute("loss_drop", _run(tmp_path, [5.5]), None) is None
    assert compute("loss_drop", _run(tmp_path, [5.5, 5.0, math.nan, 4.0]), None) is None
    assert METRICS["loss_drop"].windowed and "minus" in METRICS["loss_drop"].description


def test_a_loss_drop_with_no_value_says_why(tmp_path):
    """A run whose loss went NaN at step 5 of 12 failed 'loss_drop = no data', which reads as steps not
    logged: the gate says which loss it compares is not finite."""
    from validation.judge.gates import Gate, GateVerdict, Window, evaluate

    gate = Gate("loss_drop", ">=", 0.15, Window(None))
    [result] = evaluate([gate], _run(tmp_path, [5.5, 5.0, 4.5, 4.0] + [math.nan] * 8), {})
    assert result.verdict == GateVerdict.NO_DATA
    assert result.text() == ("loss_drop = no data, needs >= 0.15 (all steps): the loss of steps 10, 11, 12 it "
                             "compares (the first and the last 3 logged) is not finite")
    [one] = evaluate([gate], _run(tmp_path, [math.nan, 5.0, 4.5]), {})
    assert one.note == "the loss of step 1 it compares (the first and the last 1 logged) is not finite"
    [short] = evaluate([gate], _run(tmp_path, [5.5]), {})
    assert short.note == "the window holds 1 logged step(s); 2 are needed"


def test_a_run_whose_loss_barely_moves_fails_the_learning_gate(fake_run):
    """The fake trainer's loss falls 0.01 a step: 0.05 over 8 steps is no learning."""
    run = fake_run([train_phase("long_run", gates=[{"metric": "loss_drop", "op": ">=", "threshold": 0.5}])])
    assert run.record.status == Status.FAIL and run.record.reason.startswith("loss_drop = 0.05, needs >= 0.5")


def _learning_gates(phase) -> list:
    return [g for g in phase.gates if g.metric == "loss_drop" and g.op in (">=", ">") and g.threshold > 0]


def test_the_smoke_runbook_trains_on_learnable_data_and_gates_on_the_drop():
    rb = load_runbook("cpu_smoke")
    for phase in (p for p in rb.phases if p.kind == "train"):
        assert phase.overrides["data.dataset"] in LEARNABLE, phase.name
    for name in ("baseline_ddp", "long_run", "real_data"):
        assert _learning_gates(rb.phase(name)), name


@pytest.mark.parametrize("runbook", ["cpu_smoke", "h100_single", "nsa_ddp_a100"])
def test_real_data_phases_gate_on_the_drop(runbook):
    phase = load_runbook(runbook).phase("real_data")
    assert phase.overrides["data.dataset"] == "text" and _learning_gates(phase)
