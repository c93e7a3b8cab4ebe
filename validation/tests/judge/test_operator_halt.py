"""A .HALT that neither the watchdog nor the non-finite guard wrote: an operator's stop, or a stop
condition of the trainer's own. A user's trainer wrote a plain-text .HALT as step 8 of 30 began
and exited 0: the point was FAIL and the report NO-GO, but its Findings said "No automatic
findings: no crash, stall, short run, ..." with no Recommendations, and "7 of 30" appeared
nowhere. Its stop is named as the non-finite guard's is: a critical finding saying at which step
of how many the trainer halted, what the .HALT says and where it is, with advice."""
from __future__ import annotations

import pytest

from validation.contract.files import HaltInfo
from validation.contract.torchrun_log import RankFailure
from validation.judge.findings import recommendations
from validation.judge.findings.failures import halts
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status, Summary
from validation.judge.verdict import Outcome, verdict
from validation.tests.conftest import train_phase

GATES = [{"metric": "steps_completed", "op": ">=", "threshold": 1}]


def test_an_operators_halt_mid_run_is_a_critical_finding_naming_the_short_run(fake_run):
    run = fake_run([train_phase("long_run", fault="halt:step=4", gates=GATES)])
    rec = run.record
    assert rec.exit_code == 0 and rec.evidence.halt is not None and rec.evidence.halt.source is None
    assert (rec.status, rec.reason) == (Status.FAIL, "stopped by a .HALT after step 3 of 8 (stopped by the operator)")
    [f] = [f for f in run.context["findings"] if f.severity == "critical"]
    assert f.kind == "halted", f
    assert f.title == ("long_run [default]: the trainer halted itself after step 3 of 8 (5 steps short of the run "
                       "asked for) on a .HALT that neither its watchdog nor its non-finite guard wrote, which says "
                       "'stopped by the operator'"), f.title
    assert f.detail[0] == f".HALT: {rec.out_dir}/.HALT"
    assert f"CSV: {rec.out_dir}/training.csv" in f.detail
    assert "rank 0: last heartbeat step 3, stage optimizer" in f.detail
    assert not [g for g in run.context["findings"] if g.kind == "short_run"]  # the halt's finding names it
    assert "No automatic findings" not in run.report and "## Recommendations" in run.report
    [advice] = [a for a in run.context["recommendations"] if a.startswith("long_run: ")]
    assert "a .HALT that neither its watchdog nor its non-finite guard wrote" in advice, advice
    assert "pytest" in advice and "-m long_run" in advice, advice
    assert run.context["status"] == "NO-GO"


def test_a_halt_left_after_every_step_says_so(fake_run):
    run = fake_run([train_phase("long_run", fault="halt", gates=GATES)])
    rec = run.record
    assert (rec.status, rec.reason) == (Status.FAIL, "stopped by a .HALT after all 8 steps asked for (stopped by the "
                                                     "operator)")
    [f] = [f for f in run.context["findings"] if f.kind == "halted"]
    assert f.severity == "critical" and "halted itself after all 8 steps asked for on a .HALT" in f.title, f.title
    assert "short" not in f.title


def test_a_json_halt_of_another_source_names_its_step_and_source(fake_run):
    run = fake_run([train_phase("long_run", fault="halt:step=4:json=1", gates=GATES)])
    assert run.record.reason == "stopped by a .HALT at step 4 of 8 (from operator: stopped by the operator)"
    [f] = [f for f in run.context["findings"] if f.kind == "halted"]
    assert ("halted itself at step 4 of 8 (4 steps short of the run asked for) on a .HALT that neither its watchdog "
            "nor its non-finite guard wrote, from operator, which says 'stopped by the operator'") in f.title, f.title


@pytest.mark.parametrize("fault", ["halt:step=4", "nan_unlogged:step=4"])
def test_each_halt_of_the_trainer_is_a_critical_finding_with_its_file_and_advice(fake_run, fault):
    """The non-finite guard's .HALT had its finding and advice, an operator's none: both have."""
    run = fake_run([train_phase("long_run", fault=fault, gates=GATES)])
    rec = run.record
    assert rec.status == Status.FAIL
    [f] = [f for f in run.context["findings"] if f.severity == "critical"]
    assert f.detail[0] == f".HALT: {rec.out_dir}/.HALT"
    assert [a for a in run.context["recommendations"] if a.startswith("long_run: ")]


def test_the_verdict_of_an_operators_halt_names_the_steps_asked_for():
    halt = HaltInfo(text="maintenance")
    short = Outcome("train", exit_code=0, halt=halt, steps_requested=20, steps_completed=4, last_step_done=4)
    assert verdict(short, [])[1] == "stopped by a .HALT after step 4 of 20 (maintenance)"
    assert short.halted_itself and short.halted_short
    # a trainer that logs every k steps: its heartbeats say how far it got
    assert Outcome("train", exit_code=0, halt=halt, steps_requested=20, steps_completed=4,
                   last_step_done=6).halt_at() == "after step 6 of 20"
    assert Outcome("train", exit_code=0, halt=halt, steps_requested=20).halt_at() == "before its first step"
    # a stall or timeout of the harness decides before the .HALT: no halt of the trainer's own
    assert not Outcome("train", halt=halt, stalled_s=30.0, steps_requested=20).halted_itself
    assert not Outcome("train", halt=HaltInfo(source="watchdog", step=3), steps_requested=20).halted_itself


def _halted(halt: HaltInfo, **over) -> PhaseRecord:
    """A record of a run of 30 steps asked for, 7 logged, that left ``halt``."""
    fields = dict(steps=30, exit_code=0, out_dir="runs/x", metrics=Summary(steps_completed=7),
                  evidence=Evidence(halt=halt, files=[".HALT", "training.csv"]))
    return PhaseRecord(PointKey("rb", "cpu", "long_run", {}), "rb/cpu/long_run/default", "train", Status.FAIL, "",
                       **{**fields, **over})


def test_a_record_cut_before_its_source_is_not_said_to_be_an_operators():
    """Whose a .HALT cut short before its source is cannot be told: the finding does not say that
    neither the watchdog nor the guard wrote it."""
    [f] = halts([_halted(HaltInfo(text='{"ste', torn=True))])
    assert f.title == ("long_run [default]: the trainer halted itself after step 7 of 30 (23 steps short of the run "
                       "asked for) on a .HALT whose JSON record is cut short, no source in it: {\"ste"), f.title


def test_a_record_cut_before_its_source_with_exit_4_is_said_to_be_the_nonfinite_guards():
    """A .HALT cut short before its source, and ranks that exited 4, the contract's code for a non-finite
    loss: the advice said 'neither its watchdog nor its non-finite guard wrote' it, where the exit code says
    the guard did stop the run and only its .HALT came out cut short."""
    halt = HaltInfo(step=3, text='{"step": 3, "s', torn=True)
    ranks = {0: RankFailure(exit_code=4), 1: RankFailure(exit_code=4)}
    for rec in (_halted(halt, exit_code=1, world_size=2, evidence=Evidence(halt=halt, rank_failures=ranks)),
                _halted(halt, exit_code=4, evidence=Evidence(halt=halt))):  # torchrun's ranks, the one process
        [f] = halts([rec])
        [advice] = recommendations([f])
        assert "neither its watchdog nor its non-finite guard" not in advice, advice
        assert ("The trainer stopped on a non-finite loss (the contract's exit code 4), and the .HALT its non-finite "
                "guard wrote is cut short before its source") in advice, advice
    # another exit code says nothing of whose it is
    [f] = halts([_halted(halt, exit_code=1, world_size=2,
                         evidence=Evidence(halt=halt, rank_failures={0: RankFailure(exit_code=1)}))])
    [advice] = recommendations([f])
    assert "non-finite loss" not in advice, advice


def test_no_halt_finding_where_the_harness_stopped_the_run_or_the_watchdog_wrote_it():
    """A stall or the watchdog's .HALT is the stall's finding; the non-finite guard's the crash's."""
    assert halts([_halted(HaltInfo(text="stop"), stalled_s=20.0)]) == []
    assert halts([_halted(HaltInfo(source="watchdog", step=8))]) == []
    assert halts([_halted(HaltInfo(source="nonfinite", step=8, losses=[float("nan")]))]) == []
    [f] = halts([_halted(HaltInfo(text="stop"), exit_code=1)])
    assert f.title.endswith("which says 'stop'; exit code 1"), f.title
