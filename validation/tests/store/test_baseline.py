"""Comparison with a baseline results directory: each point's metrics beside the baseline's, the
baseline's commit/date/hardware named, one-sided points listed, and a staged tokens/s drop
beyond the profile's max_toks_regression (cpu: 0.5) failing the report (CLI and pytest)."""
from __future__ import annotations

import os
import subprocess
import sys

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.findings import Severity
from validation.judge.gates import GateVerdict
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.machine import MachineLoad
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.store.baseline import BaselineSource, MetricDelta, compare
from validation.store.results import ResultStore
from validation.tests.conftest import StagedLoad, train_phase, write_runbook

#: a drop of the fake trainer's tokens/s to 0.4x (60% below, the cpu profile allows 50%) as a change of
#: the trainer between the stores (the harness's environment, not the runbook's): the runbook asks both
#: stores' runs alike
SLOWER_TRAINER = ("FAKE_TRAINER_TOKS_SCALE_OF", "slowed:0.4")
#: the same drop asked by the runbook (its environment for the trainer): a change of settings, not of the trainer
SLOWER_ASKED = {"NSA_FAKE_TOKS_SCALE": "0.4"}


def _gates(name: str, **extra) -> dict:
    return train_phase(name, gates=[{"metric": "loss_finite", "op": "==", "threshold": 1}], **extra)


def _two_runs(tmp_path, monkeypatch, scale: str = "0.4"):
    """Baseline: steady, slowed, gone. This run: steady, slowed (its trainer at ``scale`` x tokens/s), new."""
    base, cur = tmp_path / "base", tmp_path / "cur"
    rb_base = write_runbook(tmp_path / "base.yaml", [_gates("steady"), _gates("slowed"), _gates("gone")])
    rb_cur = write_runbook(tmp_path / "cur.yaml", [_gates("steady"), _gates("slowed"), _gates("new")])
    assert main(["run", "--runbook", str(rb_base), "--results-dir", str(base), "--no-report"]) == 0
    monkeypatch.setenv(SLOWER_TRAINER[0], f"slowed:{scale}")
    assert main(["run", "--runbook", str(rb_cur), "--results-dir", str(cur), "--no-report"]) == 0
    monkeypatch.delenv(SLOWER_TRAINER[0])
    return base, cur, rb_cur


def test_report_compares_each_point_and_gates_the_staged_drop(tmp_path, capsys, monkeypatch):
    base, cur, rb = _two_runs(tmp_path, monkeypatch)
    runbook, profile = load_runbook(rb), load_profile("cpu")
    ctx = build_context(cur, "fake", "cpu", runbook=runbook, profile=profile, now="2026-01-01 00:00 UTC", baseline=base)
    assert ctx["verdict"] == "NO-GO"
    comparison = ctx["baseline"]
    slowed = next(p for p in comparison.points if p.phase == "slowed")
    assert slowed.regression == GateVerdict.FAIL and abs(slowed.toks.change + 0.6) < 1e-9
    assert next(p for p in comparison.points if p.phase == "steady").regression == GateVerdict.PASS
    assert comparison.only_current == ["new [default]"] and comparison.only_baseline == ["gone [default]"]
    titles = [f.title for f in ctx["findings"] if f.kind == "regression"]
    assert titles == ["tokens/s 60.0% below baseline 000000000000 in slowed [default]: 80.5 vs 201.1 "
                      "(allowed drop 50%, profile max_toks_regression)"]
    text = render_text({**ctx, "results_prefix": ".."})
    today = comparison.source.date
    assert f"- **Baseline commit**: {'0' * 40}" in text and f"- **Baseline date**: {today}" in text
    assert "- **Baseline hardware**: CPU only" in text
    assert "| slowed | default | toks_per_s_mean | all steps | 80.45 | 201.1 | -60.0% ❌ |" in text
    assert "| steady | default | toks_per_s_mean | all steps | 201.1 | 201.1 | +0.0% |" in text
    assert "Points only in this run (no baseline to compare with): new [default]" in text
    assert "Points only in the baseline (not in this run): gone [default]" in text
    assert "| slowed | default | toks_per_s_mean change vs baseline | -0.6 | >= | -0.5 (max_toks_regression) |" in text
    # the same through the CLI, both option spellings: NO-GO exits 1
    assert main(["report", "--runbook", str(rb), "--results-dir", str(cur), "--baseline", str(base), "--no-plots"]) == 1
    assert main(["report", "--runbook", str(rb), f"--results-dir={cur}", f"--baseline={base}", "--no-plots"]) == 1
    assert "Comparison with Baseline" in (cur / "reports" / "fake__cpu.md").read_text()
    # without --baseline the same store is GO
    assert main(["report", "--runbook", str(rb), "--results-dir", str(cur), "--no-plots"]) == 0


def test_the_comparison_says_the_window_its_numbers_are_over_and_where_the_baselines_differs(tmp_path):
    """The CPU smoke runbook's report against a baseline gave baseline_ddp's loss_drop as 0.3085 in
    the comparison table and 2.462 in the gates table: the comparison's numbers are over the phase's
    window (last 5 steps), the gate's over all steps, and the table said neither. A baseline whose
    runbook had another window compared numbers over other steps without a word. Each row now says
    its window, and both where they differ."""
    base, cur = tmp_path / "base", tmp_path / "cur"
    gates = lambda last: [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1,  # noqa: E731
                           "window": f"last {last} steps"}, {"metric": "loss_drop", "op": ">=", "threshold": 0}]
    rb_base = write_runbook(tmp_path / "base.yaml", [train_phase("ab", gates=gates(5))])
    rb_cur = write_runbook(tmp_path / "cur.yaml", [train_phase("ab", gates=gates(3))])
    assert main(["run", "--runbook", str(rb_base), "--results-dir", str(base), "--no-report"]) == 0
    assert main(["run", "--runbook", str(rb_cur), "--results-dir", str(cur), "--no-report"]) == 0
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb_cur), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| ab | default | toks_per_s_mean | last 3 steps (baseline: last 5 steps) | " in text
    assert "| ab | default | loss_drop | last 3 steps (baseline: last 5 steps) | " in text
    assert "| ab | default | steps_completed |  | 8 | 8 |" in text  # no window: it reads the whole run
    assert "the Gates table's value of a metric may differ from this one" in text


def _windowed(last: int | None, **extra) -> dict:
    window = {"window": f"last {last} steps"} if last else {}
    gate = {"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, **window}
    return train_phase("ab", gates=[gate], **extra)


def _report_against(tmp_path, base_phase: dict, cur_phase: dict) -> dict:
    base, cur = tmp_path / "base", tmp_path / "cur"
    rb_base = write_runbook(tmp_path / "base.yaml", [base_phase])
    rb_cur = write_runbook(tmp_path / "cur.yaml", [cur_phase])
    assert main(["run", "--runbook", str(rb_base), "--results-dir", str(base), "--no-report"]) == 0
    assert main(["run", "--runbook", str(rb_cur), "--results-dir", str(cur), "--no-report"]) == 0
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb_cur), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    # the CLI's door says the same: INCOMPLETE exits 3, where the drop it could not judge made it NO-GO (1)
    assert main(["report", "--runbook", str(rb_cur), "--results-dir", str(cur), "--baseline", str(base),
                 "--no-plots"]) == 3
    return ctx


def test_a_baseline_over_another_window_is_not_judged_and_the_report_is_incomplete(tmp_path):
    """Found with my own trainer (tokens/s 1000, then 100 over its last 3 of 8 steps) run twice, one
    runbook gating the last 5 steps (the baseline), the other the last 3: the same trainer, the same
    numbers, and `nsa-validate report --baseline` said NO-GO, 'tokens/s 78.3% below baseline' (100
    over steps 6-8 against 460 over steps 4-8). A drop between other steps says nothing of the
    trainer, either way: the gate is UNMEASURED with the reason, a warning names the point, the
    report is INCOMPLETE (never GO on it), and the table shows no change for windowed numbers."""
    ctx = _report_against(tmp_path, _windowed(5), _windowed(3))
    assert ctx["verdict"] == "INCOMPLETE"
    assert ctx["status_reason"] == ("1 gate(s) against the baseline not judged (ab [default]: this run's numbers "
                                    "are over the last 3 steps, the baseline's over the last 5 steps)")
    point = ctx["baseline"].points[0]
    assert point.regression == GateVerdict.UNMEASURED and not point.comparable
    warning = next(f for f in ctx["findings"] if f.kind == "not_comparable")
    assert warning.severity == Severity.WARNING
    assert "regression gate (max_toks_regression) was not judged" in warning.title
    assert not [f for f in ctx["findings"] if f.kind in ("regression", "slower_than_baseline")]
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| ab | default | toks_per_s_mean | last 3 steps (baseline: last 5 steps) | " in text
    assert "| — (other steps) (not judged) |" in text
    assert "| ab | default | toks_per_s_mean change vs baseline | — | >= | -0.5 (max_toks_regression) |" in text
    assert "⏳ UNMEASURED" in text and "1 point(s) not judged" in text


def test_a_baseline_whose_runs_the_runbook_asked_differently_is_not_judged(tmp_path):
    """The same trainer and commit, the runbook's override (here its environment for the trainer)
    changed between the stores: 'tokens/s 60.0% below baseline', NO-GO, and advice to bisect the
    trainer's commits. Numbers of other settings say nothing of the trainer: the gate is UNMEASURED
    naming what was asked differently, and the report INCOMPLETE."""
    ctx = _report_against(tmp_path, _gates("slowed"), _gates("slowed", env=SLOWER_ASKED))
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    assert ctx["status_reason"] == ("1 gate(s) against the baseline not judged (slowed [default]: the runbook asked "
                                    "the runs differently: env NSA_FAKE_TOKS_SCALE 0.4 here, unset in the baseline)")
    assert not [f for f in ctx["findings"] if f.kind in ("regression", "slower_than_baseline")]
    [warning] = [f for f in ctx["findings"] if f.kind == "not_comparable"]
    assert "the runbook asked their runs differently" in warning.title, warning.title
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| — (asked differently) (not judged) |" in text and "bisect" not in text


def test_a_baseline_of_all_steps_of_a_run_of_another_length_is_not_judged(tmp_path):
    """A gate without a window reads all steps: of 6 steps here and 8 in the baseline, a mean in which
    a slow first step weighs another share. Both sides said 'all steps' and were gated."""
    ctx = _report_against(tmp_path, _windowed(None), _windowed(None, steps=6))
    assert ctx["verdict"] == "INCOMPLETE" and "over all 6 steps, the baseline's over all 8 steps" in ctx[
        "status_reason"]
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| ab | default | toks_per_s_mean | all 6 steps (baseline: all 8 steps) | " in text


def test_without_a_threshold_changes_are_shown_not_gated(tmp_path, monkeypatch):
    base, cur, _ = _two_runs(tmp_path, monkeypatch)
    comparison = compare(ResultStore(cur).records(), ResultStore(base).records(), base, threshold=None)
    assert comparison.gate_rows() == []
    assert [(f.severity, f.title) for f in comparison.findings()] == [(Severity.INFO, (
        "tokens/s 5% or more below baseline 000000000000 at 1 point(s), not gated: the profile sets no "
        "max_toks_regression: the largest 60.0% in slowed [default]"))]
    assert {p.phase: round(p.toks.change, 6) for p in comparison.points} == {"steady": 0.0, "slowed": -0.6}


def test_a_drop_within_the_allowed_one_is_a_note_naming_point_values_and_tolerance(tmp_path, monkeypatch):
    """30% slower where the cpu profile allows 50%: GO, as before, but no longer only a table row (a
    drop of half the allowed one or more is noted, at least 5%)."""
    base, cur, rb_cur = _two_runs(tmp_path, monkeypatch, "0.7")
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb_cur), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    assert ctx["verdict"] == "GO"
    notes = [f for f in ctx["findings"] if f.kind == "slower_than_baseline"]
    assert [(f.severity, f.title, f.detail) for f in notes] == [(Severity.INFO, (
        "tokens/s 25% or more below baseline 000000000000 at 1 point(s), within the allowed drop of 50% (profile "
        "max_toks_regression): the largest 30.0% in slowed [default]"),
        ["slowed [default]: 140.8 vs 201.1 toks/s (30.0% below, 60% of the allowed drop)"])]
    text = render_text({**ctx, "results_prefix": ".."})
    assert "**INFO**: tokens/s 25% or more below baseline" in text
    # 20% slower is less than half the allowed drop: a table row only
    quiet = compare(ResultStore(cur).records(), ResultStore(base).records(), base, threshold=0.75)
    assert quiet.noted_drop == 0.375 and quiet.findings() == []


def test_missing_baseline_store_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "res").mkdir()
    assert main(["report", "--results-dir", str(tmp_path / "res"), "--baseline", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"--baseline {tmp_path / 'nowhere'}: no result store there (results.json not found)" in err


def test_metric_delta_change():
    assert MetricDelta("m", 90.0, 100.0).change == -0.1
    assert MetricDelta("m", 1.0, None).change is None and MetricDelta("m", 1.0, 0.0).change is None


def test_pytest_baseline_option_fails_the_report_check_on_a_drop(tmp_path):
    base = tmp_path / "base"
    rb = write_runbook(tmp_path / "rb.yaml", [_gates("long_run")])  # pytest needs a registered marker
    assert main(["run", "--runbook", str(rb), "--results-dir", str(base), "--no-report"]) == 0
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir",
                          str(tmp_path / "cur"), "--baseline", str(base)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, SLOWER_TRAINER[0]: "long_run:0.4"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed" in out.stdout and "1 failed" in out.stdout  # the point passes its gates; the comparison fails
    assert "tokens/s 60.0% below baseline" in out.stdout
    assert "Comparison with Baseline" in (tmp_path / "cur" / "reports" / "fake__cpu.md").read_text()


def test_pytest_baseline_that_is_the_results_dir_is_refused_before_anything_runs(tmp_path):
    """It ran every point, then said at the very end that the report was not rendered."""
    rb = write_runbook(tmp_path / "rb.yaml", [_gates("long_run")])
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", f"--runbook={rb}", f"--results-dir={res}",
                          f"--baseline={res}/."], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert "is the results directory itself" in out.stderr and "passed" not in out.stdout


def test_pytest_baseline_without_the_pair_is_a_usage_error_before_anything_runs(tmp_path):
    """The session's report was once not rendered at all when the baseline held other runbooks,
    after every point had run; a comparison that can compare nothing is now refused up front, by
    both doors alike (the CLI: test_a_baseline_of_another_runbook_is_an_error_naming_what_it_holds)."""
    base, cur = tmp_path / "base", tmp_path / "cur"
    other = write_runbook(tmp_path / "other.yaml", [_gates("long_run")], name="other")
    assert main(["run", "--runbook", str(other), "--results-dir", str(base), "--no-report"]) == 0
    rb = write_runbook(tmp_path / "rb.yaml", [_gates("long_run")])
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", f"--runbook={rb}", f"--results-dir={cur}",
                          f"--baseline={base}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert "no records of runbook fake, profile cpu (it holds: other/cpu)" in out.stderr
    assert not cur.exists() or not ResultStore(cur).records()

def test_a_baseline_without_a_recorded_commit_is_named_in_whole_words():
    """A runbook trainer's baseline with no commit recorded read 'baseline mytrain at (commit not ' in the
    finding and the gates table: the words standing for no commit were cut to a commit's 12 characters."""
    assert BaselineSource("/b", None, "2026-11-27", "CPU", "mytrain", None).short == "mytrain at (commit not recorded)"
    assert BaselineSource("/b", None, "2026-11-27", "CPU").short == "(commit not recorded)"
    assert BaselineSource("/b", "a" * 40, "2026-11-27", "CPU", "mytrain", "b" * 40).short == f"mytrain at {'b' * 12}"
    assert BaselineSource("/b", "a" * 40, "2026-11-27", "CPU").short == "a" * 12


def test_a_run_that_other_work_competed_with_is_not_judged_against_the_baseline(tmp_path, monkeypatch):
    """An unchanged re-run on a two-core machine another test run kept busy measured tokens/s 55%
    below its baseline: NO-GO, and advice to bisect a trainer that had not changed. A side other
    work competed with for the cores ran at most cores / its own cores slower than alone: a drop
    the load may explain is UNMEASURED naming how busy the machine was (the report INCOMPLETE, its
    speeds marked and left out of the speed findings); one beyond it is the regression it is."""
    monkeypatch.setattr("validation.launch.process.LoadMeter", StagedLoad)
    base, cur = tmp_path / "base", tmp_path / "cur"
    rb = write_runbook(tmp_path / "rb.yaml", [_gates("slowed")])
    StagedLoad.load = MachineLoad(2, 2.0, 0.05)  # the baseline: the point alone on its machine
    assert main(["run", "--runbook", str(rb), "--results-dir", str(base), "--no-report"]) == 0
    StagedLoad.load = MachineLoad(2, 2.0, 1.4)  # 0.6 cores the point's: at most 3.3x slower than alone
    monkeypatch.setenv(*SLOWER_TRAINER)  # 0.4x the baseline's tokens/s: 1.33x of it alone, at best
    assert main(["run", "--runbook", str(rb), "--results-dir", str(cur), "--no-report"]) == 0
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    assert ctx["status_reason"] == (
        "1 gate(s) against the baseline not judged (slowed [default]: tokens/s -60.0% against the baseline, "
        "within what the load may explain: the machine was busy with other work (this run: other processes used 1.40 of the 2 cores on average (2.00 in "
        "use in all, 0.60 by the point's)))")
    assert not [f for f in ctx["findings"] if f.kind in ("regression", "slower_than_baseline")]
    [warning] = [f for f in ctx["findings"] if f.kind == "not_comparable"]
    assert "other work kept the machine busy while they ran" in warning.title, warning.title
    [timing] = [f for f in ctx["findings"] if f.kind == "busy_machine"]
    assert timing.title.startswith("timings unreliable: 1 timed point(s) ran while other processes kept the machine busy")
    text = render_text({**ctx, "results_prefix": ".."})
    assert "| -60.0% (busy machine) (not judged) |" in text and "bisect" not in text
    assert "‡ timings taken while other processes kept the machine's cores busy" in text
    assert "1 point(s) not judged: other work kept the machine busy while they ran" in text
    # a busy machine moves speeds, not losses
    [loss] = [line for line in text.splitlines() if line.startswith("| slowed | default | loss_mean |")]
    assert loss.endswith("| 2.955 | 2.955 | +0.0% |"), loss
    # the same drop on a quiet machine is the regression it is
    StagedLoad.load = MachineLoad(2, 2.0, 0.05)
    assert main(["run", "--runbook", str(rb), "--results-dir", str(cur), "--no-report"]) == 0
    assert main(["report", "--runbook", str(rb), "--results-dir", str(cur), "--baseline", str(base),
                 "--no-plots"]) == 1
    # and a drop beyond what the load can explain is one on the busy machine too: 0.1x, 0.33x alone
    StagedLoad.load = MachineLoad(2, 2.0, 1.4)
    monkeypatch.setenv(SLOWER_TRAINER[0], "slowed:0.1")
    assert main(["run", "--runbook", str(rb), "--results-dir", str(cur), "--no-report"]) == 0
    ctx = build_context(cur, "fake", "cpu", runbook=load_runbook(rb), profile=load_profile("cpu"),
                        now="2026-01-01 00:00 UTC", baseline=base)
    assert ctx["verdict"] == "NO-GO", ctx["status_reason"]
    [regression] = [f for f in ctx["findings"] if f.kind == "regression"]
    assert "it is beyond the allowed drop even had the load slowed this run 3.3x" in regression.detail[-1]


def _loaded(toks: float, load: MachineLoad) -> PhaseRecord:
    return PhaseRecord(PointKey("rb", "cpu", "train"), "rb/cpu/train/default", "train", Status.PASS, "",
                       exit_code=0, metrics=Summary(toks_per_s_mean=toks), load=load)


QUIET, BUSY = MachineLoad(2, 2.0, 0.05), MachineLoad(2, 2.0, 1.4)  # BUSY: at most 3.3x slower than alone


def test_a_comparison_is_judged_only_where_the_load_of_either_side_cannot_overturn_it(tmp_path):
    """Other work only slows a run. This run's load can make a drop, so a drop it may explain is not
    judged; the baseline's load can hide one (its trainer was faster than it recorded), so a pass
    against a busy baseline stands only with its slowdown allowed for, and is otherwise not judged,
    naming the baseline's load: a store compared with a busy baseline of the same records read
    'within what the load may explain' as though this run's load were the question."""
    def judged(cur: tuple[float, MachineLoad], base: tuple[float, MachineLoad]):
        [p] = compare([_loaded(*cur)], [_loaded(*base)], tmp_path, 0.5).points
        return p.regression, p.note

    assert judged((100.0, QUIET), (100.0, QUIET)) == (GateVerdict.PASS, "")
    assert judged((60.0, BUSY), (100.0, QUIET)) == (GateVerdict.PASS, "")  # a busy run only understates itself
    assert judged((200.0, QUIET), (100.0, BUSY)) == (GateVerdict.PASS, "")  # faster even were the baseline 1.67x
    for cur in ((100.0, BUSY), (100.0, QUIET), (150.0, QUIET), (60.0, BUSY)):
        verdict, note = judged(cur, (100.0, BUSY))
        assert verdict == GateVerdict.UNMEASURED and "passes as measured, but the baseline ran beside other work " \
            "(" in note and "up to 3.3x faster than it recorded, which could hide a drop beyond the allowed 50%" in note, \
            (cur, note)
    verdict, note = judged((40.0, BUSY), (100.0, QUIET))  # 1.33x the baseline alone, at best
    assert verdict == GateVerdict.UNMEASURED and note.startswith(
        "tokens/s -60.0% against the baseline, within what the load may explain: the machine was busy with other "
        "work (this run: other processes used 1.40 of the 2 cores"), note
    assert judged((40.0, QUIET), (100.0, QUIET)) == (GateVerdict.FAIL, "")
    verdict, note = judged((10.0, BUSY), (100.0, QUIET))  # 0.33x alone, at best
    assert verdict == GateVerdict.FAIL and note.startswith(
        "it is beyond the allowed drop even had the load slowed this run 3.3x (this run: other processes"), note
    # a busy baseline makes a drop only larger: one beyond the allowed on a quiet run fails
    assert judged((40.0, QUIET), (100.0, BUSY)) == (GateVerdict.FAIL, "")
