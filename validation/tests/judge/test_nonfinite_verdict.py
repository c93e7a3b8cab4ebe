"""A loss logged as not finite fails its point whatever the phase's gates. A user's trainer logged
NaN from step 10 of 30 and exited 0 in a phase of `gates: []`: the point's status was "PASS ...
but critical" and the report's counts 1 PASS / 0 FAIL under a NO-GO verdict, while the same
trainer stopping early with no gates was a FAIL. Both are FAILs of the point itself."""
from __future__ import annotations

import dataclasses

from validation.judge.gates import GateResult, GateVerdict
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status
from validation.judge.verdict import Outcome, clean_verdict, rejudge, verdict
from validation.tests.conftest import train_phase

NAN_AT_3 = Outcome("train", exit_code=0, steps_requested=8, steps_completed=8, last_step_done=8, nonfinite_loss_step=3)
TOKS = GateResult("toks_per_s_mean", ">=", 1.0, "last 5 steps", 200.0, GateVerdict.PASS)


def test_a_nan_no_gate_checks_fails_the_point():
    assert verdict(NAN_AT_3, []) == (Status.FAIL, "non-finite loss logged at step 3, and the trainer did not stop on "
                                                  "it (no .HALT)")
    assert verdict(NAN_AT_3, [TOKS]) == (Status.FAIL, "non-finite loss logged at step 3, and the trainer did not stop "
                                                      "on it (no .HALT); its gates: 1 gate(s) passed")
    unmeasured = dataclasses.replace(TOKS, value=None, verdict=GateVerdict.UNMEASURED)
    assert verdict(NAN_AT_3, [unmeasured])[0] == Status.FAIL  # a known failure is no incomplete measurement
    assert verdict(dataclasses.replace(NAN_AT_3, nonfinite_loss_step=None), [TOKS]) == (Status.PASS,
                                                                                        "1 gate(s) passed")


def test_a_failed_gate_says_why_and_how_the_process_ended_comes_first():
    finite = GateResult("loss_finite", "==", 1.0, "all steps", 0.0, GateVerdict.FAIL)
    status, reason = clean_verdict(NAN_AT_3, [finite, TOKS])
    assert status == Status.FAIL and reason.startswith("loss_finite = 0"), reason
    short = dataclasses.replace(NAN_AT_3, steps_completed=5, last_step_done=5)
    assert verdict(short, []) == (Status.FAIL, "stopped after step 5 of 8, exit 0, no .HALT")


def test_a_stored_record_re_judged_at_report_time_stays_a_fail():
    """The report re-judges a stored point whose gates it re-checks (a golden, a threshold): the
    NaN in its evidence fails it there too."""
    rec = PhaseRecord(PointKey("rb", "cpu", "long_run", {}), "rb/cpu/long_run/default", "train", Status.FAIL, "",
                      steps=8, exit_code=0, evidence=Evidence(nonfinite_loss_step=3))
    again = rejudge(rec, [TOKS])
    assert again.status == Status.FAIL and again.reason.startswith("non-finite loss logged at step 3"), again.reason


def test_a_nan_with_no_gates_fails_as_an_early_exit_with_no_gates_does(fake_run):
    run = fake_run([train_phase("nogate_nan", fault="nan_logged:step=3", gates=[]),
                    train_phase("nogate_early", fault="quit:step=4", gates=[])])
    nan, early = run.records
    assert (nan.status, early.status) == (Status.FAIL, Status.FAIL), (nan.reason, early.reason)
    assert nan.reason == "non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT)"
    assert "| 0 | 2 | 0 | 0 | 0 | 0 |" in run.report, run.report
    assert ("2 of 2 phase point(s) failed: nogate_nan [default] (non-finite loss logged at step 3, and the trainer "
            f"did not stop on it (no .HALT)), nogate_early [default] ({early.reason}).") in run.report, run.report
    # the finding still names the step and the file, with its advice
    [f] = [f for f in run.context["findings"] if f.kind == "nonfinite"]
    assert f.severity == "critical" and f.title.startswith("non-finite loss in nogate_nan [default]: first logged at "
                                                           "step 3"), f.title
