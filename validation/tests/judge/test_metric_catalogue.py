"""The metric catalogue is one typed table (validation/judge/metrics.py) that the runbook loader,
the verdict, the contract check and the report read; records carry typed summaries and key
metrics by name only at the store boundary."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from nsa.contract import CSV_COLUMNS, ENV_RECOMMENDED
from validation.errors import RunbookError
from validation.judge.metrics import CATALOGUE, METRICS, RunData, Source, compute, costs
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.runbook.load import available, load_runbook
from validation.tests.conftest import train_phase, write_runbook


def test_every_entry_is_named_once_described_and_says_what_it_reads():
    assert len({m.name for m in CATALOGUE}) == len(CATALOGUE) == len(METRICS)
    for m in CATALOGUE:
        assert m.description and m.reads, m.name
        assert not m.windowed or any(i.source == Source.CSV for i in m.reads), m.name  # windows are training.csv steps


def test_summaries_and_runbook_gates_name_catalogue_metrics(tmp_path):
    assert {f.name for f in dataclasses.fields(Summary)} <= set(METRICS)
    for name in available():
        for phase in load_runbook(name).phases:
            assert {g.metric for g in phase.gates} <= set(METRICS), (name, phase.name)
    bad = write_runbook(tmp_path / "rb.yaml", [train_phase(gates=[{"metric": "loss_dropped", "op": ">", "threshold": 0}])])
    with pytest.raises(RunbookError, match="unknown metric 'loss_dropped'"):
        load_runbook(bad)


def test_the_contract_schema_and_the_catalogue_agree_on_what_an_absent_key_costs():
    """nsa.contract says, per recommended env.json key, what its absence costs; every metric the
    catalogue cannot compute without that key is named there."""
    env_inputs = {i.name for m in CATALOGUE for i in m.optional_inputs() if i.source == Source.ENV}
    for key in env_inputs:
        assert all(metric in ENV_RECOMMENDED[key] for metric in costs()[key]), key
    csv_inputs = {i.name for m in CATALOGUE for i in m.optional_inputs() if i.source == Source.CSV}
    assert csv_inputs <= set(CSV_COLUMNS)


def test_a_metric_that_describes_the_run_ignores_the_window(tmp_path):
    rows = [[s, float("nan") if s == 1 else 2.0, 1e-4, 100.0, 0.1, 1.0, 0.5, 1.0] for s in range(1, 11)]
    run = RunData(tmp_path, csv=pd.DataFrame(rows, columns=list(CSV_COLUMNS)))
    assert not METRICS["loss_finite"].windowed and compute("loss_finite", run, 5) == 0.0
    assert METRICS["loss_mean"].windowed and compute("loss_mean", run, 5) == 2.0


def test_records_key_metrics_by_name_only_in_json():
    rec = PhaseRecord(PointKey("rb", "cpu", "p"), "rb/cpu/p/default", "train", Status.PASS, "",
                      metrics=Summary(toks_per_s_mean=12.5, loss_drop=1.5))
    data = rec.to_json()
    assert data["metrics"]["toks_per_s_mean"] == 12.5 and data["metrics"]["loss_drop"] == 1.5
    back = PhaseRecord.from_json({**data, "metrics": {**data["metrics"], "a_metric_since_retired": 3.0}}, "x")
    assert back.metrics == rec.metrics and isinstance(back.metrics, Summary)


# an H100 sdpa_audit point's training.csv (h100_single): step 1 compiles for 24 s, then ~0.063 s a step
_SDPA = Path(__file__).resolve().parents[1] / "evidence" / "h100_sdpa_audit_compile_step"


def test_the_train_table_shows_the_median_step_beside_the_mean_toks_and_says_what_each_is(tmp_path):
    """Over a window with a warm-up step the table read 97,323 mean toks/s beside a 2.513 s mean
    step (8,192 tokens a step: 3,260 tok/s), two figures no reader could reconcile; the mean step
    time is the 24.1 s compile's share of the window. The step column is the window's median step
    (0.0629 s, 130k tok/s, the steady rate), and the note says what each column is."""
    from validation.report.build import build_context, render_text
    from validation.store.results import ResultStore
    from validation.report.tables import phase_tables

    csv_path = _SDPA / "training.csv"
    run = RunData(csv_path.parent, csv=pd.read_csv(csv_path))
    assert compute("step_time_s_mean", run, None) == pytest.approx(2.513, abs=1e-3)  # what gates read: unchanged
    assert compute("step_time_s_median", run, None) == pytest.approx(0.06293, abs=1e-5)
    rec = PhaseRecord(PointKey("rb", "h100", "sdpa_audit"), "rb/h100/sdpa_audit/default", "train", Status.PASS, "",
                      exit_code=0, out_dir="runs/x", metrics=Summary.of(run, None))
    [ph] = phase_tables([rec])
    assert ph["rows"][0]["step_time"] == pytest.approx(0.06293, abs=1e-5)
    # a record of an older harness holds no median: its mean is shown as the mean
    [old] = phase_tables([dataclasses.replace(rec, metrics=dataclasses.replace(rec.metrics, step_time_s_median=None))])
    assert old["rows"][0]["step_time"] == "2.513 (mean)"
    ResultStore(tmp_path).put(rec)
    ctx = build_context(tmp_path, "rb", "h100", runbook=None, profile=None, now="2026-01-01 00:00 UTC")
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| default | 97,323 | — | 51,637 | 0.06293 |" in text
    assert "| Point | Mean toks/s | MFU | Stdev | Median step (s) |" in text
    # said once, in the report's closing 'Reading the tables'
    assert text.count("**Mean toks/s**: the mean of the window's logged steps' own tokens/s") == 1
    assert text.count("**Median step**: the median `step_time_s` of the window's logged steps") == 1
