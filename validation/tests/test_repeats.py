"""Repeated points (``repeats: K``): K runs stored beside each other under one record that keeps
each repeat's numbers; the report shows the mean with a t-interval; a best setting is named, and a
baseline drop is a regression, only when the intervals separate. The fake trainer's run-to-run
noise is made to order (NSA_FAKE_TOKS_BY_REPEAT: a factor per repeat)."""
from __future__ import annotations

import pytest

from validation.cli import main
from validation.judge.gates import GateVerdict
from validation.judge.interval import Interval, interval
from validation.judge.record import Status
from validation.report.build import build_context
from validation.runbook.load import load_profile, load_runbook
from validation.tests.conftest import train_phase, write_runbook

WIDE, NARROW = "0.8,1.0,1.2", "0.995,1.0,1.005"
GATES = [{"metric": "loss_finite", "op": "==", "threshold": 1}]


def _sweep(noise: str, scales: list[float], repeats: int = 3) -> dict:
    return train_phase("sweep", gates=GATES, repeats=repeats, env={"NSA_FAKE_TOKS_BY_REPEAT": noise},
                       sweep={"env.NSA_FAKE_TOKS_SCALE": scales})


def _best(run) -> list[str]:
    return [f.title for f in run.context["findings"] if f.kind == "best"]


def test_each_repeat_is_a_run_of_its_own_and_the_record_keeps_them_all(fake_run):
    run = fake_run([_sweep(WIDE, [1.0, 1.05])])
    rec = run.records[0]
    assert rec.status == Status.PASS and rec.reason == "3 repeats: 1 gate(s) passed"
    assert [s.label for s in rec.runs] == ["repeat 1 of 3", "repeat 2 of 3", "repeat 3 of 3"]
    toks = [s.metrics.toks_per_s_mean for s in rec.runs]
    assert toks == pytest.approx([0.8 * 201.1, 201.1, 1.2 * 201.1], rel=1e-3)
    assert rec.metrics.toks_per_s_mean == pytest.approx(sum(toks) / 3)  # the record's number: their mean
    run_dir = (run.results / rec.out_dir).parent
    assert {p.name for p in run_dir.iterdir()} == {"repeat1", "repeat2", "repeat3"}
    ci = interval(rec)
    assert ci == Interval.of(toks) and ci.half == pytest.approx(4.303 * 0.2 * 201.1 / 3 ** 0.5, rel=1e-3)
    assert f"| {ci.mean:.4g} ± {ci.half:.4g} |" in run.report
    assert "each repeat's toks/s: [NSA_FAKE_TOKS_SCALE=1.0]: 160.9; 201.1; 241.3" in run.report


def test_a_repeated_sweep_whose_intervals_overlap_names_no_best_setting(fake_run):
    titles = _best(fake_run([_sweep(WIDE, [1.0, 1.05])]))
    assert len(titles) == 1 and titles[0].startswith("no best setting in sweep: NSA_FAKE_TOKS_SCALE=1.05 at 211.2 ± 104.9 toks/s (95% CI ")
    assert titles[0].endswith("cannot be told apart: their intervals overlap")


def test_a_repeated_sweep_whose_intervals_separate_names_the_best(fake_run):
    titles = _best(fake_run([_sweep(NARROW, [1.0, 1.05])]))
    assert len(titles) == 1 and titles[0].startswith("best setting in sweep: NSA_FAKE_TOKS_SCALE=1.05 at 211.2 ± 2.6 toks/s (95% CI ")
    assert "the intervals do not overlap" in titles[0]


def test_the_repeat_that_fails_decides_the_point_and_is_named(fake_run):
    gates = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 150, "window": "last 5 steps"}]
    run = fake_run([train_phase("ab", gates=gates, repeats=3, env={"NSA_FAKE_TOKS_BY_REPEAT": "1.0,0.5,1.0"})])
    rec = run.records[0]
    assert rec.status == Status.FAIL and rec.reason.startswith("repeat 2 of 3: toks_per_s_mean = 100.6, needs >= 150")
    assert [s.status for s in rec.runs] == ["PASS", "FAIL", "PASS"] and rec.out_dir.endswith("/repeat2")


@pytest.mark.parametrize("noise, regression", [(WIDE, False), (NARROW, True)])
def test_a_baseline_drop_inside_the_repeats_noise_is_no_regression(tmp_path, noise, regression):
    """0.45x the baseline's tokens/s: beyond the cpu profile's 50% allowed drop either way; a
    regression only when the intervals (3 repeats each) separate."""
    base, cur = tmp_path / "base", tmp_path / "cur"
    phase = lambda scale: train_phase("ab", gates=GATES, repeats=3,  # noqa: E731
                                      env={"NSA_FAKE_TOKS_BY_REPEAT": noise, "NSA_FAKE_TOKS_SCALE": scale})
    assert main(["run", "--runbook", str(write_runbook(tmp_path / "b.yaml", [phase(1.0)])), "--results-dir", str(base),
                 "--no-report"]) == 0
    rb = write_runbook(tmp_path / "c.yaml", [phase(0.45)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(cur), "--no-report"]) == 0
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    point, = ctx["baseline"].points
    assert point.toks.change == pytest.approx(-0.55, abs=1e-6)
    assert point.regression == (GateVerdict.FAIL if regression else GateVerdict.PASS)
    titles = [f.title for f in ctx["findings"] if f.kind == "regression"]
    assert bool(titles) is regression
    if not regression:
        assert point.note.startswith("a drop of 55.0% inside the repeats' noise: this run's 90.5 ± ")
        assert ctx["verdict"] == "GO"
