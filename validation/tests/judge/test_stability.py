"""Loss and grad-norm spikes and NaN-free divergence: found with the step and the value in a CSV
that has them, silent on the committed golden curves under their profiles' rules, gated through
the catalogue's metrics, and the profile's rule checked when it loads."""
from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pandas as pd
import pytest
import yaml

from nsa.contract import CSV_COLUMNS
from validation import RUNBOOK_DIR
from validation.errors import RunbookError
from validation.judge.evidence import collect
from validation.judge.findings import find, recommendations
from validation.judge.gates import Gate, GateVerdict, evaluate
from validation.judge.metrics import RunData, compute
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.judge.stability import Shape, Spike, StabilityRule, rise, spikes
from validation.runbook.load import load_profile


def _csv(loss: list[float], grad_norm: list[float] | None = None) -> pd.DataFrame:
    grad_norm = grad_norm or [1.0] * len(loss)
    rows = [[s, l, 1e-3, 100.0, 0.1, g, 0.5, 1.0] for s, (l, g) in enumerate(zip(loss, grad_norm), start=1)]
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS))


def _noisy_descent(n: int, seed: int = 0) -> list[float]:
    """A learning curve: exponential decay with 2% noise, as a training loss looks."""
    rng = random.Random(seed)
    return [2.0 + 3.0 * math.exp(-s / 15) + rng.gauss(0, 0.02) for s in range(1, n + 1)]


def _judged(tmp_path: Path, csv: pd.DataFrame, rule: StabilityRule = StabilityRule()) -> PhaseRecord:
    run = RunData(tmp_path, csv=csv, stability=rule)
    (tmp_path / "trainer.stderr.log").write_text("")
    ev = collect(run, tmp_path / "trainer.stderr.log", [])
    return PhaseRecord(PointKey("rb", "cpu", "long_run"), "rb/cpu/long_run/default", "train", Status.PASS, "",
                       out_dir="runs/x", evidence=ev, exit_code=0)


def test_a_loss_spike_and_a_grad_norm_spike_are_found_with_step_and_value(tmp_path):
    loss = _noisy_descent(60)
    grad = [1.0 + 0.05 * math.sin(s) for s in range(60)]
    loss[44], grad[44] = loss[44] * 3, 25.0  # step 45
    csv = _csv(loss, grad)
    run = RunData(tmp_path, csv=csv)
    assert compute("loss_spikes", run, None) == 1.0 and compute("grad_norm_spikes", run, None) == 1.0
    assert compute("loss_spikes", run, 10) == 0.0  # the last 10 steps hold no spike
    rec = _judged(tmp_path, csv)
    titles = [f.title for f in find([rec])]
    assert any(t.startswith(f"loss spike in long_run [default] at step 45: {loss[44]:.4g} against a rolling "
                            "median of") and "> 6)" in t for t in titles), titles
    assert any(t.startswith("gradient-norm spike in long_run [default] at step 45: 25 against") for t in titles), titles
    assert PhaseRecord.from_json(rec.to_json(), "stored").evidence == rec.evidence  # the store keeps them


def test_the_clean_curve_has_no_spike_and_the_first_steps_are_not_scored(tmp_path):
    loss = _noisy_descent(60)
    loss[3] = 9.0  # an early jump, before a full window of history: not scored
    run = RunData(tmp_path, csv=_csv(loss))
    assert compute("loss_spikes", run, None) == 0.0 and compute("loss_diverging", run, None) == 0.0
    assert find([_judged(tmp_path, _csv(loss))]) == []


def test_a_run_too_short_to_judge_has_no_value(tmp_path):
    run = RunData(tmp_path, csv=_csv(_noisy_descent(20)))  # default windows: 20 steps of history
    assert compute("loss_spikes", run, None) is None and compute("loss_diverging", run, None) is None


def test_a_gate_with_too_few_logged_steps_for_its_rule_says_so(tmp_path):
    """A trainer logging every 10 of 60 steps (a user pass, 2026-11-27): its spike and divergence
    gates were NO_DATA with nothing to say why, though the CSV covered the whole run."""
    csv = _csv(_noisy_descent(6))
    csv["step"] = [10, 20, 30, 40, 50, 60]
    gates = [Gate("loss_spikes", "==", 0), Gate("loss_diverging", "==", 0), Gate("grad_norm_spikes", "==", 0)]
    spikes_, diverging, grad = evaluate(gates, RunData(tmp_path, csv=csv), {})
    assert spikes_.verdict == GateVerdict.NO_DATA and spikes_.note == (
        "the run logged 6 step(s) with a finite loss; a step is scored against the 20 logged before it "
        "(spike_window), so more than 20 are needed"), spikes_.note
    assert diverging.note == ("the window holds 6 logged step(s) with a finite loss; two disjoint windows of "
                              "diverge_window = 20 logged steps are needed (40)"), diverging.note
    assert "finite grad_norm" in grad.note


def test_a_nan_free_divergence_is_found_with_the_window_and_the_rise(tmp_path):
    loss = _noisy_descent(40) + [2.2 + 0.03 * s for s in range(1, 41)]  # falls to ~2.1, then climbs
    csv = _csv(loss)
    run = RunData(tmp_path, csv=csv)
    assert compute("loss_diverging", run, None) == 1.0
    found = rise(csv["step"].tolist(), loss, StabilityRule())
    assert found is not None and found.nats > 0.2
    rec = _judged(tmp_path, csv)
    crit = [f for f in find([rec]) if f.kind == "diverging"]
    assert len(crit) == 1 and crit[0].severity == "critical"
    assert crit[0].title.startswith(f"loss diverging in long_run [default] from step {found.began} (after step "
                                    f"{found.held_to}, its last at or below "), crit[0].title
    assert "(allowed rise 0.2 nats)" in crit[0].title
    assert compute("loss_diverging", run, 40) == 1.0  # the climb alone (steps 41-80) is a rise too
    assert PhaseRecord.from_json(rec.to_json(), "stored").evidence.divergence == found


def test_a_divergence_is_said_from_where_the_climb_began_not_the_first_step_of_the_window_that_saw_it():
    """tt_div (a user's pass: torchtitan-shaped, noise added to the weights from step 21): the rule's
    window is steps 19-28, whose first four steps are the run's lowest; the loss climbs from step 23.
    The finding said 'from step 19'."""
    loss = [5.561, 5.354, 5.131, 5.009, 5.014, 4.747, 4.311, 4.829, 4.058, 3.961, 4.004, 3.671, 3.274, 3.638, 3.689,
            3.207, 3.095, 3.056, 2.995, 2.932, 3.032, 2.974, 3.512, 4.667, 6.768, 9.5, 19.132, 27.742, 41.04, 46.421]
    found = rise(list(range(1, 1 + len(loss))), loss, StabilityRule(diverge_window=10))
    assert found is not None and (found.first_step, found.last_step) == (19, 28)
    assert (found.held_to, found.began) == (22, 23), found
    assert found.start_text().startswith("from step 23 (after step 22, its last at or below "), found.start_text()
    old = dataclasses.replace(found, began=None, held_to=None, level=None, window=None)  # an older record's
    assert old.start_text() == "from step 19"


def test_tokens_per_second_that_fell_and_stayed_down_is_a_slowdown_with_its_step(tmp_path):
    """Throughput halved at step 31 of 60 (a user pass, 2026-11-27): the report had only a spread
    gate's 'toks_per_s_cv = ...' and nothing said where or by how much it fell."""
    rng = random.Random(1)
    csv = _csv(_noisy_descent(60))
    csv["toks_per_s"] = [25_600 * (1 + rng.gauss(0, 0.02)) * (1 if s <= 30 else 0.5) for s in range(1, 61)]
    rec = _judged(tmp_path, csv)
    [f] = [f for f in find([rec]) if f.kind == "slowdown"]
    assert f.severity == "warning" and f.title.startswith("tokens/s fell in long_run [default] from step 31: median ")
    assert "tokens/s over steps 31-60, 0.50x the " in f.title and " of steps 1-30" in f.title, f.title
    assert PhaseRecord.from_json(rec.to_json(), "stored").evidence.slowdown == rec.evidence.slowdown
    assert any(line.startswith("long_run: Tokens/s fell during the run") for line in recommendations([f]))


@pytest.mark.parametrize("toks", [
    [5_000.0] * 2 + [25_600.0] * 58,  # a slow first step or two (a compile): the earlier part is the slower
    [25_600.0] * 20 + [10_000.0] * 10 + [25_600.0] * 30,  # a dip the run came back from
    [25_600.0 * (0.99 ** s) for s in range(60)],  # 45% slower by the end, but no step change: a trend
    [25_600.0] * 30 + [20_000.0] * 30,  # 0.78x: under the rule's 0.7
    [25_600.0] * 8 + [1_000.0] * 2,  # slow only for the last 2 steps: under SLOWDOWN_MIN_STEPS' majority
])
def test_no_slowdown_where_the_run_did_not_fall_and_stay_down(tmp_path, toks):
    csv = _csv(_noisy_descent(len(toks)))
    csv["toks_per_s"] = toks
    assert _judged(tmp_path, csv).evidence.slowdown is None


def test_one_spike_does_not_make_a_divergence(tmp_path):
    loss = _noisy_descent(80)
    loss[70] = 50.0
    run = RunData(tmp_path, csv=_csv(loss))
    assert compute("loss_diverging", run, None) == 0.0 and compute("loss_spikes", run, None) == 1.0


def _goldens() -> list[tuple[str, StabilityRule, list[float]]]:
    out = []
    for path in sorted((RUNBOOK_DIR / "goldens").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        rule = StabilityRule.of(load_profile(data["profile"]).thresholds)
        for pid, by_class in data["points"].items():
            for hw, curve in by_class.items():
                out.append((f"{path.name}:{pid}:{hw}", rule, curve["loss"]))
    return out


def test_the_committed_golden_curves_have_no_spike_and_no_divergence():
    """Each golden under its own profile's rule; the steps scored are counted, so a rule whose
    window outgrows every golden (and could then find nothing) fails here instead of passing."""
    scored = 0
    for name, rule, loss in _goldens():
        steps = list(range(1, len(loss) + 1))
        assert spikes(steps, loss, rule, "loss") == [], name
        assert rise(steps, loss, rule) is None, name
        scored += max(0, len(loss) - rule.window)
    assert scored >= 20, f"only {scored} golden steps had a full window of history"


def test_the_profile_sets_the_rule_and_a_bad_value_is_refused_when_it_loads(tmp_path):
    assert StabilityRule.of({}) == StabilityRule()
    assert StabilityRule.of({"spike_window": 10.0, "spike_z": None}) == StabilityRule(window=10)
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump({"name": "p", "marker": "p", "hardware": {"accelerator": "cpu"},
                                   "thresholds": {"spike_window": 2.5}}))
    with pytest.raises(RunbookError, match="thresholds: spike_window must be a whole number of logged steps"):
        load_profile(bad)


#: a user's resumed run (f_resume_bad): its loss tripled from step 7, the first step after the
#: resume, and stayed there; step 11, the lowest of steps 7-12, is the first step with a full window
RESUMED_3X = [1.035857, 1.060855, 1.049460, 0.993893, 1.060106, 1.038291,
              3.025062, 2.987261, 3.092546, 2.961549, 2.960245, 3.019704]


def test_a_level_shift_is_named_from_the_step_it_began_not_the_step_scored(tmp_path):
    """The shift was 'loss spike ... at step 11: 2.96 against a rolling median of 1.06', advised as a
    bad batch of step 11: steps 7-10, as high, are not scored (no full window before them)."""
    rule = StabilityRule(window=10)
    [s] = spikes(list(range(1, 13)), RESUMED_3X, rule, "loss")
    assert (s.step, s.first_step, s.last_step, s.to_end, s.first_scored, s.shape) == (11, 7, 12, True, 11, Shape.SHIFT)
    [f] = find([_judged(tmp_path, _csv(RESUMED_3X), rule)])
    assert f.kind == "level_shift" and f.severity == "warning"
    assert f.title == (
        "loss level shift in long_run [default] from step 7 to the run's last logged step, 12: every logged step "
        f"lies above {s.bar:.4g}, the limit of step 11's window (a level shift, not a one-step spike); step 11: 2.96 "
        "against a rolling median of 1.06 (robust z 28.1 > 6); the steps before step 11 are not scored (fewer "
        "logged steps before them than the spike window)"), f.title
    [advice] = recommendations([f])
    assert advice.startswith("long_run: The loss or gradient norm rose at the step the finding says it began and "
                             "stayed up over the steps after it: a lasting change, not one bad batch."), advice
    assert "bad batch)" not in advice


def test_a_rise_that_came_back_down_is_one_finding_from_its_first_step(tmp_path):
    loss = _noisy_descent(60)
    for i in (44, 45, 46):  # steps 45-47, each scored and above its window's limit
        loss[i] *= 3
    found = spikes(list(range(1, 61)), loss, StabilityRule(), "loss")
    assert [s.step for s in found] == [45, 46, 47] and {(s.first_step, s.last_step) for s in found} == {(45, 47)}
    [f] = find([_judged(tmp_path, _csv(loss))])
    assert f.kind == "level_shift" and f.title.startswith(
        "loss rise in long_run [default] from step 45 to step 47: every logged step lies above "), f.title
    assert (", the limit of step 45's window, and the next logged step came back below it (a rise, not a one-step "
            f"spike); step 45: {loss[44]:.4g} against a rolling median of") in f.title, f.title
    assert f.detail == ["CSV: runs/x/training.csv (loss column)"]


def test_a_spike_of_one_step_stays_a_spike_and_a_stored_spike_of_an_older_harness_too():
    one = _noisy_descent(60)
    one[44] *= 3
    [s] = spikes(list(range(1, 61)), one, StabilityRule(), "loss")
    assert (s.first_step, s.last_step, s.shape) == (45, 45, Shape.STEP)
    old = Spike("loss", 45, 9.0, 3.0, 40.0, 6.0)  # a record that kept the step alone
    assert old.shape == Shape.STEP
    assert old.event_text() == "at step 45: 9 against a rolling median of 3 (robust z 40 > 6)"


def test_a_non_finite_loss_is_told_with_what_the_steps_after_it_logged():
    from validation.judge.stability import LossAfter, nonfinite

    def of(loss):
        return nonfinite(pd.DataFrame({"step": range(1, len(loss) + 1), "loss": loss}))

    inf, nan = math.inf, math.nan
    once = of([2.0, 1.9, inf, 1.8, 1.7])
    assert once.after == LossAfter.RECOVERED and once.text() == (
        "first non-finite loss logged at step 3, the only one: the losses logged after it, to step 5, are finite")
    assert of([2.0, nan, 1.9, nan, 1.8]).text() == ("first non-finite loss logged at step 2, 2 in all, the last at "
                                                    "step 4: the losses logged after it, to step 5, are finite")
    assert of([2.0, nan, nan, nan]).after == LossAfter.STAYED
    assert of([2.0, 1.9, nan]).text() == "first non-finite loss logged at step 3, the last logged step"
    assert of([2.0, nan, 1.9, nan]).after == LossAfter.RECURRED
    assert of([2.0, 1.9]) is None
