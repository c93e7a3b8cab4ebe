"""Repeated points (``repeats: K``): K runs stored beside each other under one record that keeps
each repeat's numbers; the report shows the mean with a t-interval; a best setting is named, and a
baseline drop is a regression, only when the intervals separate. The fake trainer's run-to-run
noise is made to order (NSA_FAKE_TOKS_BY_REPEAT: a factor per repeat)."""
from __future__ import annotations

import dataclasses

import pytest

from validation.cli import main
from validation.judge.gates import REPEAT_LOSS_METRIC, GateResult, GateVerdict
from validation.judge.interval import Interval, interval
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status, SubRun, Summary
from validation.judge.stability import Spike
from validation.report.build import build_context
from validation.report.tables import gate_rows, phase_tables
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


@pytest.mark.parametrize("fault, title, detail, reason, blamed", [
    ("crash:step=3", "crash in ab [default], repeat 2 of 3: exit code 1: RuntimeError: ",
     "/repeat2/trainer.stderr.log", "repeat 2 of 3: trainer crashed (exit code 1)", "rank 0 crashed "),
    ("stall:rank=0:step=3", "stall in ab [default], repeat 2 of 3 (watchdog .HALT): rank 0 in backward_stuck",
     "rank 0: last heartbeat step 3, stage backward; stack (stackdump_rank0.txt)",
     "repeat 2 of 3: watchdog wrote .HALT: no rank made progress", "rank 0 hung in backward_stuck")])
def test_a_repeat_that_crashed_or_stalled_decides_the_point_before_one_that_failed_a_gate(
        fake_run, fault, title, detail, reason, blamed):
    """A user's trainer crashed in repeat 2 of 3 while repeat 1 had failed a speed gate: repeat 1,
    the first that failed, decided the record, so the point's reason and verdict line named the
    gate miss and the crash was only a finding. As in one run's verdict (how the process ended
    decides before its gates), the crash or stall decides: the reason and verdict line are repeat
    2's, led by the rank it blames, and repeat 1's gate miss is a finding of its own. The record's
    last step is its own repeat's (2 or 3), never the mean of the repeats' (8, 2, 8)."""
    gates = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 150, "window": "last 5 steps"}]
    run = fake_run([train_phase("ab", gates=gates, repeats=3, env={
        "NSA_FAKE_TOKS_BY_REPEAT": "0.5,1.0,1.0", "NSA_FAULT": fault, "NSA_FAKE_FAULT_REPEATS": "2"})])
    rec = run.record
    assert rec.status == Status.FAIL and rec.reason.startswith(reason), rec.reason
    assert [s.status for s in rec.runs] == ["FAIL", "FAIL", "PASS"] and rec.out_dir.endswith("/repeat2")
    critical = [f for f in run.context["findings"] if f.severity == "critical"]
    [failed] = [f for f in critical if f.kind in ("crash", "stall")]
    assert failed.title.startswith(title), failed.title
    assert detail in "\n".join(failed.detail), failed.detail
    assert [f.title.split(":")[0] for f in critical if f.kind not in ("crash", "stall")] == [
        "gate failed in ab [default], repeat 1 of 3"]
    assert rec.metrics.steps_completed == rec.runs[1].last_step < 8 and "stopped after step" not in run.report
    line = verdict_line(rec)
    own = rec.reason.removeprefix("repeat 2 of 3: ")
    # the deciding repeat first, led by the rank it blames, then repeat 1's gate miss
    assert line.startswith(f"repeat 2 of 3: {blamed}"), line
    assert line.endswith(f" — {own}; repeat 1 of 3: {rec.runs[0].reason}"), line
    assert f"| FAIL | {line} |" in run.report
    assert run.context["verdict"] == "NO-GO"


def test_every_repeat_that_broke_a_contract_file_is_a_finding_naming_the_repeat(fake_run):
    """Repeats 1 and 3 of a user's trainer each wrote a training.csv with a non-number in it: the
    report said only repeat 1's (the record's), so that repeat 3's broken file was nowhere. Each
    repeat's broken file is a finding naming the repeat and the file, said once."""
    run = fake_run([train_phase("ab", gates=GATES, repeats=3, env={
        "NSA_FAULT": "corrupt_csv", "NSA_FAKE_FAULT_REPEATS": "1,3"})])
    rec = run.record
    assert rec.status == Status.ERROR and [s.status for s in rec.runs] == ["ERROR", "PASS", "ERROR"]
    titles = [f.title for f in run.context["findings"] if f.kind == "artifacts"]
    assert len(titles) == 2, titles
    for k, title in zip((1, 3), titles):
        assert title.startswith(f"ab [default], repeat {k} of 3: "), title
        assert f"/repeat{k}/training.csv: malformed (line " in title, title


def test_every_repeat_with_a_slow_rank_is_an_imbalance_finding_naming_the_repeat(fake_run):
    """Rank 1 of repeat 2 took 3x as long per step, failing the gate on the ranks' step-time ratio,
    while repeat 1, too slow overall, decided the record: the imbalance finding read only the
    record's repeat, so the report said 'gate failed ... rank_step_time_ratio = 3' with neither the
    slow rank nor each rank's step time. The imbalance finding covers every repeat, names the
    repeat and states its gate once."""
    gates = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 150, "window": "last 5 steps"},
             {"metric": "rank_step_time_ratio", "op": "<=", "threshold": 1.5}]
    run = fake_run([train_phase("ab", gates=gates, repeats=3, env={
        "NSA_FAKE_WORLD": "2", "NSA_FAKE_TOKS_BY_REPEAT": "0.5,1.0,1.0", "NSA_FAULT": "slow:rank=1",
        "NSA_FAKE_FAULT_REPEATS": "2"})])
    rec = run.record
    assert rec.reason.startswith("repeat 1 of 3: toks_per_s_mean") and rec.runs[1].status == Status.FAIL
    critical = [f for f in run.context["findings"] if f.severity == "critical"]
    assert [f.title.split(":")[0] for f in critical] == [
        "rank imbalance in ab [default], repeat 2 of 3", "gate failed in ab [default], repeat 1 of 3"]
    assert "rank 1 takes 3.0x as long per step as rank 0; gate rank_step_time_ratio = 3" in critical[0].title
    assert critical[0].detail == ["rank 0: median step time 0.5s", "rank 1: median step time 1.5s"], critical[0].detail


@pytest.mark.parametrize("noise, regression", [(WIDE, False), (NARROW, True)])
def test_a_baseline_drop_inside_the_repeats_noise_is_no_regression(tmp_path, noise, regression, monkeypatch):
    """0.45x the baseline's tokens/s (a change of the trainer: the harness's environment, the runbook
    alike): beyond the cpu profile's 50% allowed drop either way; a regression only when the
    intervals (3 repeats each) separate."""
    base, cur = tmp_path / "base", tmp_path / "cur"
    rb = write_runbook(tmp_path / "b.yaml", [train_phase("ab", gates=GATES, repeats=3,
                                                         env={"NSA_FAKE_TOKS_BY_REPEAT": noise})])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(base), "--no-report"]) == 0
    monkeypatch.setenv("FAKE_TRAINER_TOKS_SCALE_OF", "ab:0.45")
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


def _repeated(statuses: list[str], decides: int, peaks: list[float], **evidence) -> PhaseRecord:
    """A stored record of a point run len(statuses) times whose record holds repeat ``decides``."""
    subs = [SubRun(f"repeat{k}", f"repeat {k} of {len(statuses)}", f"runs/ab/repeat{k}", Status(st), "",
                   metrics=Summary(toks_per_s_mean=100.0, mem_reserved_gb_max=peak))
            for k, (st, peak) in enumerate(zip(statuses, peaks), 1)]
    return PhaseRecord(PointKey("rb", "cpu", "ab"), "rb/cpu/ab/default", "train", Status(statuses[decides - 1]), "",
                       out_dir=f"runs/ab/repeat{decides}", runs=subs, exit_code=0,
                       metrics=Summary(toks_per_s_mean=100.0, mem_reserved_gb_max=sum(peaks) / len(peaks)),
                       evidence=Evidence(**evidence))


def test_the_gates_table_names_the_repeat_its_values_are_of(fake_run):
    """The gates table showed a repeated point's gate values (the deciding repeat's) under the
    point's name alone, beside a phase table of the repeats' mean: 120,778 tok/s in the gates,
    123,122 ± 5,048 in the table (an H100's h100_single run, fused_adamw)."""
    gates = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 150, "window": "last 5 steps"}]
    run = fake_run([train_phase("ab", gates=gates, repeats=3, env={"NSA_FAKE_TOKS_BY_REPEAT": "1.0,0.5,1.0"})])
    assert "| ab | default, repeat 2 of 3 (repeats: 1 PASS, 2 FAIL, 3 PASS) | toks_per_s_mean | 100.6 |" in run.report
    assert "gate failed in ab [default], repeat 2 of 3: toks_per_s_mean = 100.6, needs >= 150" in run.report
    passed = fake_run([_sweep(WIDE, [1.0], repeats=2)])
    assert "| sweep | NSA_FAKE_TOKS_SCALE=1.0, repeat 2 of 2 (every repeat PASS) | loss_finite |" in passed.report


def test_a_repeated_points_findings_name_the_repeat_they_are_of():
    """A spike found in one repeat's training.csv was said of the point ('gradient-norm spike in
    fused_adamw [fused_adamw=True] at step 56'), as if every run of it had spiked."""
    spike = Spike("grad_norm", 56, 25.83, 0.4341, 980.0, 6.0)
    [title] = [f.title for f in find([_repeated(["PASS"] * 3, 3, [1.0] * 3, spikes=[spike])]) if f.kind == "spike"]
    assert title.startswith("gradient-norm spike in ab [default], repeat 3 of 3 at step 56: 25.83")


def test_a_repeated_points_peak_memory_is_the_highest_repeats():
    """'Peak reserved (GB)' of a repeated point was the mean of its repeats' peaks: no run's peak,
    and below the memory that one of them needed."""
    rec = _repeated(["PASS"] * 3, 3, [4.0, 6.5, 4.5])
    [row] = phase_tables([rec])[0]["rows"]
    assert rec.metrics.mem_reserved_gb_max == 5.0 and row["mem"] == 6.5


def test_the_repeats_own_gate_is_the_points_not_one_repeats():
    """repeat_loss_rel_diff compares the repeats with each other: its row and its finding name the
    point, while the gates of one run name the repeat they are of."""
    agree = GateResult(REPEAT_LOSS_METRIC, "<=", 1e-4, "steps 1-4", 0.01, GateVerdict.FAIL)
    finite = GateResult("loss_finite", "==", 1, "all steps", 1, GateVerdict.PASS)
    rec = dataclasses.replace(_repeated(["FAIL", "FAIL"], 1, [1.0, 1.0]), gates=[agree, finite])
    assert [row["point"] for row in gate_rows([rec])] == ["default", "default, repeat 1 of 2 (every repeat FAIL)"]
    [title] = [f.title for f in find([rec]) if f.kind == "repeats"]
    assert title.startswith("gate failed in ab [default]: repeat_loss_rel_diff = 0.01")


def test_every_repeat_is_looked_at_for_spikes_not_only_the_one_the_record_keeps(fake_run):
    """Only the deciding repeat's run was looked at for spikes (and divergence, a non-finite loss,
    memory growth, a slowdown): a loss spike in repeat 1 of a point whose repeat 3 decided (every
    repeat passed its gates) was in no finding, and the report said nothing of it."""
    run = fake_run([train_phase("ab", gates=GATES, repeats=3, steps=30,
                                env={"NSA_FAULT": "spike:step=25", "NSA_FAKE_FAULT_REPEATS": "1"})])
    rec = run.record
    assert rec.status == Status.PASS and rec.part == "repeat 3 of 3" and rec.evidence.spikes == []
    spikes = [f for f in run.context["findings"] if f.kind == "spike"]  # the store's records, read back
    assert [f.title.split(": ")[0] for f in spikes] == ["loss spike in ab [default], repeat 1 of 3 at step 25"]
    assert spikes[0].detail == [f"CSV: {rec.runs[0].out_dir}/training.csv (loss column)"]
    assert "loss spike in ab [default], repeat 1 of 3 at step 25" in run.report


def test_a_repeat_whose_loss_went_nan_is_a_critical_finding_of_that_repeat(fake_run):
    run = fake_run([train_phase("ab", gates=[], repeats=2, env={"NSA_FAULT": "nan_logged:step=3",
                                                                "NSA_FAKE_FAULT_REPEATS": "1"})])
    [f] = [f for f in run.context["findings"] if f.kind == "nonfinite"]
    assert f.severity == "critical" and f.title.startswith("non-finite loss in ab [default], repeat 1 of 2: first "
                                                           "logged at step 3")
    assert run.context["verdict"] == "NO-GO"
    # the repeat whose loss went NaN failed, and so the point: no PASS under a NO-GO
    assert (run.record.status, run.record.reason) == (
        Status.FAIL, "repeat 1 of 2: non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT)")
    assert [s.status for s in run.record.runs] == [Status.FAIL, Status.PASS]


def test_a_record_of_an_older_harness_without_each_repeats_signs_still_loads():
    old = {"name": "repeat1", "label": "repeat 1 of 2", "out_dir": "runs/ab/repeat1", "status": "PASS"}
    assert SubRun.from_json(old).signs is None
    sub = SubRun.from_json({**old, "signs": {"spikes": [dataclasses.asdict(Spike("loss", 5, 9.0, 3.0, 40.0, 6.0))],
                                             "nonfinite_loss_step": 7, "failed_gates": ["loss_spikes"]}})
    assert sub.signs.spikes == [Spike("loss", 5, 9.0, 3.0, 40.0, 6.0)] and sub.signs.nonfinite_loss_step == 7
    assert sub.signs.failed_gates == ["loss_spikes"] and sub.signs.divergence is None


def test_every_repeat_whose_gate_failed_has_a_finding_of_its_own(fake_run):
    """Repeats 1 and 2 of 3 both failed loss_finite, and only repeat 1's (the record's) failure
    was a finding: repeat 2's failed gate was stored in its sub-run and said nowhere."""
    run = fake_run([train_phase("ab", gates=GATES, repeats=3, env={"NSA_FAULT": "nan_logged:step=3",
                                                                   "NSA_FAKE_FAULT_REPEATS": "1,2"})])
    rec = run.record
    assert rec.status == Status.FAIL and rec.reason.startswith("repeat 1 of 3: loss_finite")
    assert [s.status for s in rec.runs] == ["FAIL", "FAIL", "PASS"]
    gate = [f for f in run.context["findings"] if f.title.startswith("gate failed in ")]
    assert [f.title.split(": ")[0] for f in gate] == ["gate failed in ab [default], repeat 1 of 3",
                                                      "gate failed in ab [default], repeat 2 of 3"]
    assert all(f.severity == "critical" and f.kind == "nonfinite" for f in gate)
    assert all(f.title.split(": ", 1)[1].startswith("loss_finite = 0, needs == 1") for f in gate)
    assert gate[1].detail[0] == "first non-finite loss logged at step 3"
    assert f"CSV: {rec.runs[1].out_dir}/training.csv" in gate[1].detail
    assert "gate failed in ab [default], repeat 2 of 3: loss_finite = 0" in run.report
    assert run.context["verdict"] == "NO-GO"


def test_a_failed_repeat_of_an_older_harness_without_its_gates_is_still_a_finding():
    """A sub-run stored before sub-runs kept their gates: its verdict's reason names them."""
    rec = _repeated(["FAIL", "FAIL", "PASS"], 1, [1.0] * 3)
    data = rec.to_json()
    for d in data["runs"]:
        del d["gates"]
        d["exit_code"], d["reason"] = 0, "loss_finite = 0, needs == 1 (all steps)"
    old = PhaseRecord.from_json(data, "old.json")
    assert [s.gates for s in old.runs] == [[], [], []]
    titles = [f.title for f in find([old]) if f.title.startswith("gate failed")]
    assert titles == ["gate failed in ab [default], repeat 2 of 3: loss_finite = 0, needs == 1 (all steps)"]


def test_a_repeated_points_mean_says_how_many_repeats_it_is_of():
    """Repeats 1 and 2 of a trainer of mine crashed at step 2, before the 'last 4 steps' window; the
    phase table showed repeat 3's 69,750 tok/s as the point's mean, beside repeat 1's steps and loss,
    and the line of each repeat's toks/s was left out (no interval of one value). The mean now says
    it is of 1 of 3 repeats, and the line lists every repeat, '—' where it has no value."""
    rec = _repeated(["FAIL", "FAIL", "PASS"], 1, [1.0] * 3)
    subs = [dataclasses.replace(s, metrics=Summary(toks_per_s_mean=v)) for s, v in zip(rec.runs, (None, None, 69750.0))]
    rec = dataclasses.replace(rec, runs=subs, metrics=Summary(toks_per_s_mean=69750.0))
    [table] = phase_tables([rec])
    assert table["rows"][0]["mean"] == "69,750 (1 of 3 repeats)"
    assert table["repeats"] == ["[default]: —; —; 69,750"]
    rec = _repeated(["PASS"] * 3, 3, [1.0] * 3)  # every repeat has one: the interval alone
    assert phase_tables([rec])[0]["rows"][0]["mean"] == "100 ± 0"
