"""A metric the trainer's files lack is UNMEASURED everywhere, never FAIL (issue 24, case 4): a
gate on ``backends_recorded`` over an env.json without ``attention_backends`` was FAIL / NO-GO
although the contract and check-artifacts called it UNMEASURED. It is found in the files at
judge time, for any trainer (here this project's own launcher, whose runbook declares nothing),
and recognised by type, never by the words of a reason."""
from __future__ import annotations

import dataclasses
import io

from validation.judge import check_command as check_artifacts
from validation.judge.gates import GateResult, GateVerdict, Pending
from validation.judge.metrics import costs
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.judge.verdict import gate_verdict
from validation.report.build import Verdict, status_of
from validation.tests.conftest import train_phase

GATES = [{"metric": "backends_recorded", "op": "==", "threshold": 1},
         {"metric": "mem_reserved_gb_max", "op": "<=", "threshold": 10},
         {"metric": "loss_finite", "op": "==", "threshold": 1}]


def test_a_gate_on_what_the_files_lack_is_unmeasured_in_verdict_report_and_check(fake_run):
    run = fake_run([train_phase("sdpa_audit", fault="lean", gates=GATES)])
    rec = run.record
    by_metric = {g.metric: g for g in rec.gates}
    for metric, missing in (("backends_recorded", "env.json has no attention_backends"),
                            ("mem_reserved_gb_max", "training.csv has no mem_reserved_gb")):
        g = by_metric[metric]
        assert (g.verdict, g.pending, g.note) == (GateVerdict.UNMEASURED, Pending.NOT_PROVIDED, missing)
    assert by_metric["loss_finite"].verdict == GateVerdict.PASS
    assert rec.status == Status.UNMEASURED
    assert rec.reason == ("metric the trainer does not provide: backends_recorded (env.json has no attention_backends), "
                          "mem_reserved_gb_max (training.csv has no mem_reserved_gb)")
    assert run.context["status"] == "INCOMPLETE" and "backends_recorded (env.json has no attention_backends)" in \
        run.context["status_reason"]
    assert "⏳ UNMEASURED" in run.report and "❌" not in run.report
    out = io.StringIO()
    assert check_artifacts.check(run.results / rec.out_dir, out=out, costs=costs()) == 0
    assert "missing (optional)   env.json attention_backends: UNMEASURED: backends_recorded" in out.getvalue()
    assert "missing (optional)   training.csv mem_reserved_gb: UNMEASURED: mem_reserved_gb_max, mem_growth_gb" \
        in out.getvalue()


def test_the_same_gates_pass_when_the_files_carry_them(fake_run):
    run = fake_run([train_phase("sdpa_audit", gates=GATES)])
    assert run.record.status == Status.PASS, run.record.reason


def test_a_file_that_could_not_be_read_leaves_its_gates_no_data_not_unmeasured(fake_run):
    """A training.csv with a wrong header made the point's memory gate UNMEASURED with "training.csv
    has no mem_reserved_gb" in the report, though the column was there: the file was unreadable."""
    run = fake_run([train_phase("sdpa_audit", fault="corrupt_csv:header=1", gates=GATES)])
    assert run.record.status == Status.ERROR
    by_metric = {g.metric: g for g in run.record.gates}
    assert by_metric["mem_reserved_gb_max"].verdict == GateVerdict.NO_DATA
    assert "has no mem_reserved_gb" not in run.report


def _pending(reason: str, pending: Pending | None) -> PhaseRecord:
    rec = PhaseRecord(PointKey("rb", "cpu", "p"), "rb/cpu/p/default", "train", Status.UNMEASURED, reason)
    gate = {"metric": "backends_recorded", "op": "==", "threshold": 1.0, "window": "all steps", "value": None,
            "verdict": "UNMEASURED", "pending": pending}
    return dataclasses.replace(rec, gates=[GateResult.from_json(gate)])


def test_the_report_knows_unmeasured_by_type_not_by_the_reasons_words():
    lacking = _pending("whatever the words", Pending.NOT_PROVIDED)
    verdict, why = status_of([lacking], [], [])
    assert verdict == Verdict.INCOMPLETE and "p [default]: whatever the words" in why
    # a reason that happens to begin like one is not taken for it: the point whose metric the
    # trainer lacks is the one the verdict names, whatever the order
    unset = dataclasses.replace(_pending("metric the trainer does not provide: a threshold to be measured",
                                         Pending.THRESHOLD), key=PointKey("rb", "cpu", "q"), test_id="rb/cpu/q/default")
    verdict, why = status_of([unset, lacking], [], [])
    assert verdict == Verdict.INCOMPLETE and "p [default]: whatever the words" in why and "q [default]" not in why


def test_a_threshold_two_gates_share_is_named_once():
    """The resume phase's loss and learning-rate gates share resume_loss_rtol: a profile without
    it said 'threshold(s) to be measured for this profile: resume_loss_rtol, resume_loss_rtol'
    (two H100s, 2026-11-25)."""
    gates = [GateResult.from_json({"metric": m, "op": "<=", "threshold": None, "threshold_ref": "resume_loss_rtol",
                                   "window": "all steps", "value": 0.0, "verdict": "UNMEASURED",
                                   "pending": Pending.THRESHOLD}) for m in ("resume_loss_rel_diff", "resume_lr_rel_diff")]
    assert gate_verdict(gates) == (Status.UNMEASURED, "threshold(s) to be measured for this profile: resume_loss_rtol")
