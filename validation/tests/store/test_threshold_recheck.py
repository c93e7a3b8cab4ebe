"""`report` re-checks stored gates against the runbook's gates as they are now (store/thresholds.py),
as it re-checks golden gates: a stored PASS of 'steps_completed >= 4' re-rendered after the gate was
raised to '>= 6' said GO, the verdict of a gate the runbook no longer asks (gofalse9's note). The
value the run measured is checked against the threshold of now; a gate the run was not asked
leaves a passed point not run; a gate taken away never turns a FAIL into a PASS."""
from __future__ import annotations

from validation.cli import main
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _gates(threshold: int, *more: dict) -> list[dict]:
    return [{"metric": "steps_completed", "op": ">=", "threshold": threshold}, *more]


def _context(rb, res):
    runbook, profile = load_runbook(rb), load_profile("cpu")
    return build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)


def _ran(tmp_path, gates: list[dict], status: str = "PASS"):
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("long_run", gates=gates, steps=4)])
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    (stored,) = ResultStore(res).records()
    assert stored.status == status, stored.reason
    return rb, res


def test_a_threshold_raised_since_the_run_fails_the_stored_value_and_says_so(tmp_path, capsys):
    rb, res = _ran(tmp_path, _gates(4))
    assert _context(rb, res)["verdict"] == "GO"
    write_runbook(rb, [train_phase("long_run", gates=_gates(6), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "NO-GO", ctx["status_reason"]
    assert ctx["thresholds_changed"] == ["long_run [default]: steps_completed: >= 4 at the run, >= 6 now; "
                                         "PASS then, FAIL now"]
    [gate] = [g for g in ctx["gates"] if g["metric"] == "steps_completed"]
    assert gate["verdict"] == "FAIL" and gate["threshold"] == 6
    text = render_text({**ctx, "results_prefix": ".."})
    assert "- **Gates changed since the run**: 1 stored gate(s) re-checked" in text
    capsys.readouterr()
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res)]) == 1  # NO-GO
    (stored,) = ResultStore(res).records()
    assert stored.status == "PASS"  # the store keeps what the run found


def test_a_threshold_lowered_since_the_run_passes_the_stored_value(tmp_path):
    rb, res = _ran(tmp_path, _gates(8), status="FAIL")
    assert _context(rb, res)["verdict"] == "NO-GO"
    write_runbook(rb, [train_phase("long_run", gates=_gates(4), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "GO", ctx["status_reason"]
    assert ctx["thresholds_changed"][0].endswith("FAIL then, PASS now")


def test_a_gate_the_run_was_not_asked_leaves_a_passed_point_not_run(tmp_path):
    rb, res = _ran(tmp_path, _gates(4))
    write_runbook(rb, [train_phase("long_run", gates=_gates(4, {"metric": "loss_finite", "op": "==", "threshold": 1}),
                                   steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    [o] = ctx["outdated"]
    assert o["why"] == "gate loss_finite not asked at the run, == 1 in the runbook now", o["why"]


def test_a_gate_asked_over_another_window_now_names_the_window_of_the_run(tmp_path):
    """A gate's window changed since the run read 'gate toks_per_s_mean not asked at the run': it was
    asked, over another window."""
    floor = {"metric": "toks_per_s_mean", "op": ">=", "threshold": 1}
    rb, res = _ran(tmp_path, _gates(4, {**floor, "window": "last 3 steps"}))
    write_runbook(rb, [train_phase("long_run", gates=_gates(4, {**floor, "window": "last 2 steps"}), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    [o] = ctx["outdated"]
    assert o["why"] == ("gate toks_per_s_mean asked over last 3 steps at the run, >= 1 (last 2 steps) in the runbook "
                        "now"), o["why"]


def test_a_gate_taken_away_since_the_run_that_alone_failed_it_leaves_the_point_not_run(tmp_path):
    """A point that failed only a gate the runbook no longer asks read NO-GO on that gate, and said
    nothing of its removal: its FAIL is no verdict of the point asked now, never a PASS either."""
    rb, res = _ran(tmp_path, _gates(4, {"metric": "loss_finite", "op": "==", "threshold": 0}),
                   status="FAIL")
    write_runbook(rb, [train_phase("long_run", gates=_gates(4), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE" and not ctx["thresholds_changed"], ctx["status_reason"]
    [o] = ctx["outdated"]
    assert o["why"] == "gate loss_finite == 0, failed at the run, not asked in the runbook now", o["why"]


def test_a_gate_taken_away_beside_one_still_failed_leaves_its_stored_fail(tmp_path):
    rb, res = _ran(tmp_path, _gates(8, {"metric": "loss_finite", "op": "==", "threshold": 0}),
                   status="FAIL")
    write_runbook(rb, [train_phase("long_run", gates=_gates(8), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "NO-GO" and not ctx["outdated"], ctx["status_reason"]


def test_report_judges_by_the_profile_file_the_run_used_not_the_built_in_of_its_name(tmp_path, capsys):
    """A run with `--profile PATH` (a file named 'cpu' with a floor the run misses) is NO-GO; a
    `report --runbook R` without --profile must judge the stored records by that file again, not
    by the built-in 'cpu' profile of the same name (which turned the NO-GO into a GO)."""
    import yaml

    prof = tmp_path / "strict.yaml"
    data = yaml.safe_load(load_profile("cpu").path.read_text())
    data["thresholds"]["min_toks_per_s"] = 1.0e12
    prof.write_text(yaml.safe_dump(data))
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("long_run", steps=6)])
    assert main(["run", "--runbook", str(rb), "--profile", str(prof), "--results-dir", str(res)]) == 1
    capsys.readouterr()
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res)]) == 1  # NO-GO, as at the run
    assert "nsa-validate: NO-GO" in capsys.readouterr().out
    assert main(["report", "--results-dir", str(res)]) == 1
    # a profile asked for by name re-judges them by it, and the report says the profile moved the gate
    assert main(["report", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(res)]) == 0
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert "the profile's min_toks_per_s makes the gate >= 1 now, >= 1e+12 at the run (FAIL then)" in text


def test_two_gates_of_one_metric_and_window_are_each_judged_by_their_own_rule(tmp_path):
    """A floor and a ceiling on one metric and window: the run failed the ceiling (steps_completed 4,
    needs <= 3), and the report, re-checking the stored gates against the first runbook gate of the
    metric and window, judged both by the floor: GO, exit 0, for a point that had failed."""
    band = _gates(1, {"metric": "steps_completed", "op": "<=", "threshold": 3})
    rb, res = _ran(tmp_path, band, status="FAIL")
    ctx = _context(rb, res)
    assert ctx["verdict"] == "NO-GO" and ctx["thresholds_changed"] == [], ctx["status_reason"]
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 1
    # the runbook gates in the other order: the same verdicts
    write_runbook(rb, [train_phase("long_run", gates=band[::-1], steps=4)])
    assert _context(rb, res)["verdict"] == "NO-GO"


def test_a_gate_added_beside_a_stored_one_of_its_metric_and_window_is_judged_from_the_stored_value(tmp_path):
    """A ceiling added after a run that passed its floor on the same metric and window: the report
    stayed GO and showed one gate; the ceiling was neither judged nor counted as not run."""
    rb, res = _ran(tmp_path, _gates(1))
    write_runbook(rb, [train_phase("long_run", gates=_gates(1, {"metric": "steps_completed", "op": "<=",
                                                                 "threshold": 3}), steps=4)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "NO-GO", ctx["status_reason"]
    assert ctx["thresholds_changed"] == ["long_run [default]: steps_completed: <= 3 asked now, not at the "
                                         "run; FAIL now"]
    rows = [g for g in ctx["gates"] if g["metric"] == "steps_completed"]
    assert sorted((g["op"], g["verdict"]) for g in rows) == [("<=", "FAIL"), (">=", "PASS")], rows
