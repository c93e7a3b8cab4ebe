"""The resume phase through the harness, on the fake trainer (and a runbook's own trainer): three
processes in directories of their own, judged together; a resumed run that skips data fails
naming the first step after the resume; a crash of the first half is the point's crash; a first
half that runs past its stop and a second half that trains from step 1 again fail as such; a trainer
that says how it stops and resumes is resumed through its own parameters, one that does not is
SKIP with the reason; the runbook says what is wrong with a resume phase before anything runs."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from validation.errors import RunbookError
from validation.judge.asked import Asked
from validation.judge.findings.throughput import slowdowns
from validation.judge.record import Evidence, PhaseRecord, PointKey, RunSigns, Status, SubRun
from validation.judge.stability import Slowdown
from validation.judge.metrics import RunData
from validation.judge.resume import Breach, BreachKind, ClueKind, clue, not_resumed
from validation.judge.verdict import rejudge
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.tests.conftest import FakeRun, write_runbook

GATES = [{"metric": "loss_finite", "op": "==", "threshold": 1}]


def resume_phase(fault: str = "", **extra) -> dict:
    return {"name": "resume", "kind": "resume", "steps": 8, "resume_after": 4, "gates": GATES,
            "env": {"NSA_FAULT": fault} if fault else {}, **extra}


def test_a_resumed_run_that_continues_the_uninterrupted_one_passes(fake_run):
    run = fake_run([resume_phase()])
    rec = run.record
    assert rec.status == Status.PASS, rec.reason
    assert [(s.name, s.first_step, s.last_step, s.status) for s in rec.runs] == [
        ("reference", 1, 8, "PASS"), ("first", 1, 4, "PASS"), ("second", 5, 8, "PASS")]
    run_dir = run.results / rec.out_dir
    assert run_dir.name == "second" and {p.name for p in run_dir.parent.iterdir()} == {"reference", "first", "second"}
    gates = {g.metric: g for g in rec.gates}
    assert gates["resume_loss_rel_diff"].value == 0.0 and gates["resume_lr_rel_diff"].value == 0.0
    assert gates["resume_data_gap"].note == "the first half ended at data position 4 and the resumed run started at 4"
    assert "loss of steps 1-8 continued: identical at every logged step" in gates["resume_loss_rel_diff"].note
    first = gates["resume_first_step"]
    assert (first.value, first.op, first.threshold, first.verdict) == (5.0, ">", 4.0, "PASS")
    assert first.note == "the second half began at step 5 (rank 0's heartbeats), the first after the stop"
    assert rec.metrics.steps_completed == 8.0 and rec.evidence.loss_first == 2.99  # step 1, from the first half
    assert "| default | first half (steps 1-4, stopped) | 1-4 | 0 |" in run.report
    assert not run.findings()


def test_a_halfs_artifacts_list_names_its_folders(fake_run):
    """A resume point's halves listed their files only, not the folders (checkpoints/, a trainer's own
    output, harness_stacks/) their findings cite, as a train point's list does."""
    rec = fake_run([resume_phase()]).record
    first = next(s for s in rec.runs if s.name == "first")
    assert "checkpoints/" in first.files and "training.csv" in first.files, first.files


def test_data_skipped_on_resume_fails_naming_the_first_step_after_it(fake_run):
    rec = (run := fake_run([resume_phase("resume_skip:steps=2")])).record
    assert rec.status == Status.FAIL
    gates = {g.metric: g for g in rec.gates}
    assert gates["resume_data_gap"].value == 2.0 and gates["resume_data_gap"].note.endswith(": 2 skipped")
    assert gates["resume_lr_rel_diff"].verdict == "PASS"
    findings = run.findings("critical")
    assert len(findings) == 1 and findings[0].startswith(
        "resume not equivalent in resume [default]: first diverging step 5 (the first step after the resume at step 4): "
        "loss 2.93 resumed vs 2.95 uninterrupted (rel 0.00678)"), findings
    assert findings[0].split("\n")[0].endswith("; its data did not continue where the first half's ended")
    assert "resume_data_gap = 2, needs == 0" in findings[0]  # the other gates below it
    assert "first half (steps 1-4, stopped): runs/fake/cpu/resume/default/" in findings[0]
    assert "gate failed" not in "".join(run.findings())  # the resume finding explains its gates


def test_a_crash_of_the_first_half_is_the_points_crash_and_nothing_resumes(fake_run):
    rec = (run := fake_run([resume_phase("crash_stopping:step=2")])).record
    assert rec.status == Status.FAIL and rec.reason == "first half (steps 1-4, stopped): trainer crashed (exit code 1)"
    assert [s.name for s in rec.runs] == ["reference", "first"] and rec.exit_code == 1
    assert not (run.results / rec.out_dir).with_name("second").exists()
    crash = [f for f in run.findings("critical") if f.startswith("crash in")]
    assert len(crash) == 1 and crash[0].startswith(
        "crash in resume [default], first half (steps 1-4, stopped): exit code 1: RuntimeError: Expected to mark"), crash
    assert "resume/default/" in crash[0] and "/first/trainer.stderr.log" in crash[0]


@pytest.mark.parametrize("env", [
    {"NSA_FAULT": "ignore_resume:nodata=1"},  # nothing but the heartbeats tells: every resume gate passed
    {"NSA_FAULT": "ignore_resume"},  # its data position says it too: the data gap failed, naming no cause
    {"NSA_FAULT": "ignore_resume:nodata=1", "NSA_FAKE_RESUME_COPIES": "1"},  # the first half's files copied first
], ids=["no_data_position", "data_position", "copies_first_half"])
def test_a_second_half_that_trains_from_step_1_again_did_not_resume(fake_run, env):
    """A user's trainer whose second half ignored --resume-from (or whose loader fell back to a fresh
    start on a broken checkpoint) retrained steps 1-6 and went on to 12: GO, 'loss of steps 1-12
    continued: identical at every logged step', as the gates read the first half's steps up to the
    stop and the second's after it. Its own heartbeats say it started at step 1: FAIL, NO-GO."""
    run = fake_run([resume_phase(env=env)])
    rec = run.record
    said = ("did not resume: the second half trained steps 1-4 again (it started at step 1, not step 5: rank 0's "
            "heartbeats)")
    assert (rec.status, rec.reason) == (Status.FAIL, f"resumed second half (steps 5-8): {said}")
    assert [(s.name, s.status) for s in rec.runs] == [("reference", "PASS"), ("first", "PASS"), ("second", "FAIL")]
    assert rec.evidence.resume_breach == Breach(BreachKind.NOT_RESUMED, 4, 1, 0)
    [finding] = [f for f in run.findings("critical") if "did not resume" in f]
    assert finding.startswith(f"resume [default], resumed second half (steps 5-8): {said}\n"), finding
    assert "/second/heartbeat_rank0.jsonl" in finding and finding.endswith("/first"), finding
    assert "**Status: NO-GO**" in run.report
    assert "resume: The second half was given the first half's directory (train.resume)" in run.report


def test_a_resumed_run_that_copies_the_first_halfs_files_passes(fake_run):
    """A trainer that copies the earlier run's training.csv and heartbeats into its new directory
    before it goes on from the step after the checkpoint: the copied rows and records are the first
    half's, not steps it trained again."""
    rec = fake_run([resume_phase(env={"NSA_FAKE_RESUME_COPIES": "1"})]).record
    assert rec.status == Status.PASS, rec.reason
    assert [(s.name, s.first_step, s.last_step) for s in rec.runs] == [("reference", 1, 8), ("first", 1, 4),
                                                                        ("second", 1, 8)]


def test_a_first_half_that_runs_past_its_stop_fails_naming_it(fake_run):
    """A user's first half ignored --stop-after and ran all 12 steps: its row read PASS ('exit 0
    after step 12') and the NO-GO blamed the second half, which, resumed from a checkpoint of step
    12, had nothing left to run ('second/training.csv: malformed (header only, no steps logged)').
    The first half is the cause, and nothing resumes from its checkpoint."""
    run = fake_run([resume_phase("ignore_stop")])
    rec = run.record
    said = "ran past the step it was asked to stop after: it went on to step 8 when asked to stop after step 4"
    assert (rec.status, rec.reason) == (Status.FAIL, f"first half (steps 1-4, stopped): {said}")
    assert [(s.name, s.status, s.reason) for s in rec.runs] == [
        ("reference", "PASS", "exit 0 after step 8"), ("first", "FAIL", said)]
    assert not (run.results / rec.out_dir).with_name("second").exists()
    [finding] = run.findings("critical")
    assert finding.startswith(f"resume [default], first half (steps 1-4, stopped): {said}\n"), finding
    assert "/first/training.csv" in finding and "malformed" not in run.report


def test_a_half_that_broke_its_resume_stays_failed_when_its_stored_record_is_judged_again(fake_run):
    """A stored record is judged again where a gate's threshold changed since its run (or its golden
    gate is checked again): its resume breach, kept in its evidence, decides before its gates."""
    rec = fake_run([resume_phase("ignore_resume:nodata=1")]).record
    stored = PhaseRecord.from_json(rec.to_json(), "results.json")
    assert stored.evidence.resume_breach == rec.evidence.resume_breach
    again = rejudge(stored, stored.gates)
    assert (again.status, again.reason) == (Status.FAIL, rec.evidence.resume_breach.text())


def _beats(*recs: dict) -> RunData:
    return RunData(Path("."), heartbeats={0: [{"time": 1000.0 + i, "pid": 7, **r} for i, r in enumerate(recs)]})


@pytest.mark.parametrize("recs, started", [
    ([{"step": 4, "stage": "step"}, {"step": 5, "stage": "forward"}], None),  # says the step its checkpoint holds
    ([{"step": 4}, {"step": 5}], None),  # the same, in a record of no stage
    ([{"step": 0, "stage": "data"}, {"step": 5, "stage": "forward"}], None),  # set-up before any step
    ([{"step": 4, "stage": "forward"}, {"step": 5, "stage": "forward"}], 4),  # began the stop's own step again
    ([{"step": 3, "stage": "step"}, {"step": 4, "stage": "step"}, {"step": 5, "stage": "step"}], 3),
])
def test_a_second_half_trained_a_step_of_its_checkpoint_where_its_own_records_say_so(recs, started):
    found = not_resumed(RunData(Path(".")), _beats(*recs), 4)
    assert (found and found.step) == started
    assert found is None or (found.rank, found.pid) == (0, 7)


@pytest.mark.parametrize("first", [1, 6, 7])
def test_a_second_half_without_heartbeats_trained_what_its_adapter_says(first):
    """A Hugging Face Trainer's second half that found checkpoint-6 and trained from step 1 without it
    was GO, 'loss of steps 1-12 continued: identical at every logged step': it writes no heartbeats,
    and its retrained steps log the first half's losses. The steps its own records show it trained
    (env.json's adapter.trained, its TensorBoard events) say it did not resume; a Breach of them is
    said and stored as a heartbeat one is."""
    files = ("trainer_out/runs/x/events.out.tfevents.1",)
    env = {"adapter": {"name": "hf_trainer", "trained": {"first": first, "last": 12, "files": list(files),
                                                         "records": "its TensorBoard events"}}}
    found = not_resumed(RunData(Path(".")), RunData(Path("."), env=env), 6)
    if first > 6:
        assert found is None
        return
    assert found == Breach(BreachKind.NOT_RESUMED, 6, first, records="its TensorBoard events", files=files)
    again = "step 6" if first == 6 else "steps 1-6"
    assert found.text() == (f"did not resume: the second half trained {again} again (it started at step {first}, "
                            "not step 7: its TensorBoard events)")
    stored = Evidence.from_json(json.loads(json.dumps(dataclasses.asdict(Evidence(resume_breach=found)))))
    assert stored.resume_breach == found


@pytest.mark.parametrize("step, half, other", [(14, "first", "second"), (18, "second", "first")])
def test_a_spike_is_named_by_the_half_whose_step_it_is(fake_run, step, half, other):
    """A user's trainer spiking at step 24 of a point resumed after step 25 got 'loss spike in resume
    [default], resumed second half (steps 26-40) at step 24', its CSV second/training.csv, which
    holds no step 24: the resumed run's signs were all named by the second half, whose evidence the
    record keeps. Each is the half's whose step it is now, with that half's training.csv."""
    run = fake_run([resume_phase(f"spike:step={step}", steps=24, resume_after=16, gates=[])])
    spikes = [f for f in run.findings() if f.startswith("loss spike in")]
    label = {"first": "first half (steps 1-16, stopped)", "second": "resumed second half (steps 17-24)"}[half]
    assert len(spikes) == 2 and spikes[0].startswith("loss spike in resume [default], uninterrupted run"), spikes
    assert spikes[1].startswith(f"loss spike in resume [default], {label} at step {step}: "), spikes
    assert f"/{half}/training.csv (loss column)" in spikes[1] and f"/{other}/" not in spikes[1], spikes


def test_a_non_finite_loss_of_the_first_half_is_the_first_halfs(fake_run):
    """A NaN logged from step 3 on: the second half, NaN in every row, broke its training.csv
    (ERROR) and the record kept that half alone; the first half's NaN at step 3, in its own
    training.csv, was named nowhere (only the second half's, at step 5). It is the first half's."""
    run = fake_run([resume_phase("nan_logged:step=3", gates=[])])
    [nan] = [f for f in run.findings() if f.startswith("non-finite loss in resume [default], first")]
    assert nan.startswith("non-finite loss in resume [default], first half (steps 1-4, stopped): first logged at "
                          "step 3"), nan
    assert "/first/training.csv (loss column)" in nan
    assert not [f for f in run.findings() if "second half" in f.split("\n")[0] and "step 3" in f.split("\n")[0]]


def test_the_gates_table_links_both_halves_csvs_that_the_resumed_runs_gates_read(fake_run):
    """The first half logged a NaN loss at step 3, the resumed run's loss_finite gate failed on it,
    and the gates table's CSV column linked only second/training.csv, which holds steps 5-8: the
    step that failed the gate was in none of the files it named. It links both halves' now."""
    run = fake_run([resume_phase(env={"NSA_FAULT": "nan_logged:step=3", "NSA_FAKE_FAULT_DIRS": "first"})])
    rec = run.record
    assert {g.metric: str(g.verdict) for g in rec.gates}["loss_finite"] == "FAIL"
    run_dir = Path(rec.out_dir).parent
    [row] = [line for line in run.report.splitlines() if line.startswith("| resume | default | loss_finite |")]
    assert row.endswith(f"| [first/training.csv](../{run_dir}/first/training.csv), "
                        f"[second/training.csv](../{run_dir}/second/training.csv) |"), row
    assert "nan" in (run.results / run_dir / "first" / "training.csv").read_text().splitlines()[3]


def test_a_slowdown_across_the_resume_is_the_resumed_runs_in_both_halves_csvs():
    """A sign over steps of both halves (tokens/s that fell at step 3 of a run resumed after step 4)
    is no one half's: it names the resumed run and both halves' training.csv; one within the
    second half is the second half's alone."""
    def rec(slowdown: Slowdown) -> PhaseRecord:
        runs = [SubRun(name, label, f"runs/resume/{name}", Status.PASS, "", signs=RunSigns())
                for name, label in (("reference", "uninterrupted run (steps 1-8)"),
                                    ("first", "first half (steps 1-4, stopped)"),
                                    ("second", "resumed second half (steps 5-8)"))]
        return PhaseRecord(PointKey("rb", "cpu", "resume", {}), "rb/cpu/resume/default", "resume", Status.PASS, "",
                           out_dir="runs/resume/second", exit_code=0, runs=runs, asked=Asked(steps=8, resume_after=4),
                           evidence=Evidence(slowdown=slowdown))

    [across] = slowdowns([rec(Slowdown(3, 8, 50.0, 1, 2, 100.0))])
    assert across.title.startswith("tokens/s fell in resume [default], the resumed run (first half (steps 1-4, "
                                   "stopped), then resumed second half (steps 5-8)) from step 3"), across.title
    assert across.detail == ["CSV: runs/resume/first/training.csv and runs/resume/second/training.csv "
                             "(toks_per_s column)"]
    [later] = slowdowns([rec(Slowdown(7, 8, 50.0, 5, 6, 100.0))])
    assert later.title.startswith("tokens/s fell in resume [default], resumed second half (steps 5-8) from step 7")
    assert later.detail == ["CSV: runs/resume/second/training.csv (toks_per_s column)"]


NATIVE = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}


def _foreign(tmp_path: Path, trainer: dict) -> Path:
    data = {"name": "mine", "profiles": ["cpu"], "trainer": trainer, "defaults": {"steps": 6, "timeout_s": 60},
            "phases": [{"name": "resume", "kind": "resume", "resume_after": 2, "gates": GATES}]}
    (tmp_path / "rb.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path / "rb.yaml"


def test_a_runbook_trainer_resumes_through_its_own_parameters(tmp_path):
    from validation.session.session import AcceptanceSession, SessionOptions
    trainer = {**NATIVE, "phases": ["train", "resume"],
               "resume": {"stop_after": {"flag": "--stop-after"}, "from": {"flag": "--resume-from"}}}
    point, = expand(load_runbook(_foreign(tmp_path, trainer)), load_profile("cpu"))
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.PASS, rec.reason
    assert "--stop-after" not in rec.command and rec.command[-2:] == [
        "--resume-from", str(tmp_path / "res" / rec.runs[1].out_dir)]
    gates = {g.metric: g for g in rec.gates}
    assert set(gates) == {"loss_finite", "resume_loss_rel_diff", "resume_lr_rel_diff", "resume_first_step"}  # no data position
    assert (gates["resume_first_step"].value, gates["resume_first_step"].verdict) == (3.0, "PASS")  # its heartbeats


def test_a_runbook_trainer_that_does_not_say_how_it_resumes_skips_with_the_reason(tmp_path):
    from validation.session.session import AcceptanceSession, SessionOptions
    point, = expand(load_runbook(_foreign(tmp_path, NATIVE)), load_profile("cpu"))
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.SKIP
    assert rec.reason == ("trainer native_test does not support resume phases (it supports: train; its runbook entry "
                          "says how it stops after N steps and resumes under trainer.resume)")
    with pytest.raises(RunbookError, match="trainer.resume: a trainer that supports resume phases says how"):
        load_runbook(_foreign(tmp_path, {**NATIVE, "phases": ["train", "resume"]}))


@pytest.mark.parametrize("phase, message", [
    ({"resume_after": 0}, "phases[0].resume_after: a resume phase stops after resume_after steps and resumes for the "
                          "rest of its 8 steps: 1..7; got 0"),
    ({"resume_after": 8}, "1..7; got 8"),
    ({"kind": "train"}, "phases[0].resume_after: only resume phases stop and resume, not kind 'train'"),
    ({"repeats": 3}, "phases[0].repeats: only train phases are repeated"),
])
def test_a_bad_resume_phase_is_a_runbook_error(tmp_path, phase, message):
    with pytest.raises(RunbookError, match=re.escape(message)):
        load_runbook(write_runbook(tmp_path / "rb.yaml", [{**resume_phase(), **phase}]))


def test_a_profile_without_the_resume_tolerance_is_refused_before_anything_runs(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"name": "cpu", "marker": "cpu_profile", "hardware": {"accelerator": "cpu"},
                                       "thresholds": {"min_toks_per_s": 1}}))
    with pytest.raises(RunbookError, match="is a resume phase, but profile .* has no resume_loss_rtol threshold"):
        expand(load_runbook(write_runbook(tmp_path / "rb.yaml", [resume_phase()])), load_profile(profile))


def test_a_resume_phase_its_trainer_does_not_run_needs_no_resume_tolerance(tmp_path):
    """A user's pass: a trainer that cannot resume (its runbook entry's phases: [train]) makes its
    resume phase a SKIP, yet a profile without resume_loss_rtol refused the runbook, and with it a
    run of any other phase. A tolerance no point reads is not asked for."""
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"name": "cpu", "marker": "cpu_profile", "hardware": {"accelerator": "cpu"},
                                       "thresholds": {"min_toks_per_s": 1}}))
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train"]}
    rb = write_runbook(tmp_path / "rb.yaml", [{"name": "resume", "kind": "resume", "steps": 8, "resume_after": 4}],
                       trainer=trainer, defaults={"launcher": {"kind": "python"}})
    [point] = expand(load_runbook(rb), load_profile(profile))
    assert point.gates() == []


def test_the_resume_finding_says_which_of_data_schedule_or_restored_state_broke():
    """Seen with a trainer that resumed wrong four ways: the title named only the loss (a reset
    schedule's loss step came after its learning-rate step); it now says what the gates tell."""
    from validation.judge.findings.resume import _cause
    from validation.judge.gates import GateVerdict as V
    ok, bad = V.PASS, V.FAIL
    assert _cause({"resume_lr_rel_diff": bad, "resume_data_gap": ok}) == "its learning-rate schedule did not continue"
    assert _cause({"resume_lr_rel_diff": ok, "resume_data_gap": bad}).startswith("its data did not continue")
    assert "optimizer state, RNG state or model weights" in _cause({"resume_lr_rel_diff": ok, "resume_data_gap": ok})
    assert "records no data position" in _cause({"resume_lr_rel_diff": ok})


def test_a_lost_optimizer_state_is_told_from_a_data_position_one_step_off(fake_run):
    """Both resumed runs continue the learning rate and say their data continued (env.json); the
    finding used to give both the same list (optimizer, RNG or model state, or the step count).
    The loss curve tells them apart: a lost optimizer state leaves the first step after the resume
    (its loss is taken before its update) as it was; data one step on shifts the whole curve."""
    optim = fake_run([resume_phase("resume_optim")])
    title = optim.findings("critical")[0].split("\n")[0]
    assert title.endswith("; the learning rate continued; step 5, the first after the resume, matches the "
                          "uninterrupted run and step 6 does not: the weights and the data of step 5 were restored "
                          "(its loss is taken before its update), its update was not the same: the optimizer's state "
                          "(its moments, its step count) was not restored"), title
    assert optim.record.evidence.resume_clue.kind == ClueKind.UPDATE


def test_data_one_step_off_that_env_json_calls_continued_is_named_from_the_curve(tmp_path):
    run = FakeRun(tmp_path, [resume_phase("resume_skip:steps=1:unrecorded=1", steps=12, resume_after=4)])
    gates = {g.metric: g for g in run.record.gates}
    assert gates["resume_data_gap"].verdict == "PASS"  # the trainer says its data continued
    title = run.findings("critical")[0].split("\n")[0]
    assert "; the learning rate continued; the resumed loss lies closer to the uninterrupted run's 1 step later (mean " \
           "rel difference 0 over 7 steps, 0.00343 at the same step): its data likely starts 1 step past where the " \
           "first half's ended; env.json's data_position says the data continued, which the curve does not bear out" \
           in title, title


@pytest.mark.parametrize("curve, expected", [
    # the tiny model on CPU, resumed after step 8 of 16 (2026-11-27): the optimizer state zeroed in the
    # checkpoint; the data one micro-batch on (NSA_FAULT resume_skip:batches=1); two on; the RNG reseeded
    ([4.10011, 3.17805, 2.95581, 3.44187, 2.74663, 3.20861, 3.14139, 3.0748], (ClueKind.UPDATE, 0)),
    ([3.36192, 3.23258, 3.39544, 3.04017, 3.10481, 3.14322, 3.11864, 2.49474], (ClueKind.SHIFTED, 1)),
    ([3.35527, 3.42316, 3.13916, 3.14563, 3.17388, 3.11935, 2.50477, 2.9138], (ClueKind.SHIFTED, 2)),
    ([4.10139, 3.27567, 3.16154, 3.25361, 3.00558, 3.06818, 3.03806, 3.01842], None),
])
def test_the_real_trainers_resumed_curves_say_which_state_was_lost(curve, expected):
    reference = [5.6725, 5.19597, 5.74645, 5.89572, 4.41589, 4.66288, 3.41891, 3.84723, 4.10011, 3.27011, 3.1641,
                 3.25321, 3.00366, 3.07155, 3.0411, 3.01237]
    ref = pd.DataFrame({"step": range(1, 17), "loss": reference})
    resumed = pd.DataFrame({"step": range(1, 17), "loss": reference[:8] + curve})
    found = clue(ref, resumed, 8, 0.0)
    assert (found and (found.kind, found.shift)) == expected


def test_without_the_first_step_after_the_resume_the_curve_names_nothing():
    """A smooth loss whose resumed run falls more slowly (its optimizer state lost) lies close to the
    uninterrupted run's a step back; only the first step after the resume tells the two apart, so a
    trainer that did not log it gets no clue rather than 'data read again'."""
    ref = pd.DataFrame({"step": range(1, 13), "loss": [3.0 - 0.1 * s for s in range(1, 13)]})
    drift = [3.0 - 0.1 * s for s in range(1, 5)] + [3.0 - 0.1 * 4 - 0.1 * (s - 4) + 0.1 * min(s - 5, 1)
                                                    for s in range(5, 13)]
    resumed = pd.DataFrame({"step": range(1, 13), "loss": drift})
    assert clue(ref, resumed, 4, 0.0).kind == ClueKind.UPDATE  # step 5 logged: matched, then drifted
    unlogged = resumed[resumed["step"] != 5]
    assert clue(ref, unlogged, 4, 0.0) is None


def test_a_spike_in_the_reference_run_is_a_finding_naming_that_leg(fake_run):
    """Only the record's own run (the resumed one) was looked at for spikes, divergence, a
    non-finite loss, a slowdown and memory growth: a loss spike in the uninterrupted reference run,
    whose signs its sub-run stored, was in no such finding."""
    run = fake_run([resume_phase(steps=30, resume_after=15,
                                 env={"NSA_FAULT": "spike:step=25", "NSA_FAKE_FAULT_DIRS": "reference"})])
    rec = run.record
    assert [s.name for s in rec.runs] == ["reference", "first", "second"]
    assert rec.runs[0].signs.spikes and not rec.runs[2].signs.spikes and not rec.evidence.spikes
    spikes = [f for f in run.context["findings"] if f.kind == "spike"]
    assert [f.title.split(": ")[0] for f in spikes] == [
        "loss spike in resume [default], uninterrupted run (steps 1-30) at step 25"]
    assert spikes[0].detail == [f"CSV: {rec.runs[0].out_dir}/training.csv (loss column)"]
    assert "loss spike in resume [default], uninterrupted run (steps 1-30) at step 25" in run.report


def test_a_spike_in_the_second_half_is_named_once_with_its_leg(fake_run):
    run = fake_run([resume_phase(steps=30, resume_after=15,
                                 env={"NSA_FAULT": "spike:step=25", "NSA_FAKE_FAULT_DIRS": "second"})])
    spikes = [f.title.split(": ")[0] for f in run.context["findings"] if f.kind == "spike"]
    assert spikes == ["loss spike in resume [default], resumed second half (steps 16-30) at step 25"]


def test_a_loss_that_rose_at_the_resume_and_stayed_is_named_from_the_first_step_after_it(fake_run):
    """A user's resumed run whose loss tripled from the first step after the resume (step 7) got
    'loss spike ... at step 11' (the first step with a full window, the lowest of 7-12) with the
    advice to look at the data of step 11."""
    run = fake_run([resume_phase(steps=12, resume_after=6, gates=[],
                                 env={"NSA_FAULT": "shift:step=7", "NSA_FAKE_FAULT_DIRS": "second"})])
    [f] = [f for f in run.context["findings"] if f.kind in ("spike", "level_shift", "resume_shift")]
    assert f.kind == "resume_shift", f
    assert f.title.startswith(
        "loss level shift in resume [default], resumed second half (steps 7-12) from step 7 (the first step after "
        "the resume at step 6) to the run's last logged step, 12: every logged step lies above "), f.title
    assert "; step 11: " in f.title and "the steps before step 11 are not scored" in f.title, f.title
    advice = [a for a in run.context["recommendations"] if "first step after the resume and stayed up" in a]
    assert len(advice) == 1 and "the data of the step named" not in advice[0], run.context["recommendations"]


def test_a_level_shift_the_uninterrupted_run_has_too_is_the_data_s_not_the_resume_s(fake_run):
    """The loss triples from step 7 in every run: the rise began in the first half, at its last step
    before the stop, and is found where the resumed run is first scored (step 11, in the second
    half): it is the resumed run's (both halves' files), not the second half's, and no resume's fault."""
    run = fake_run([resume_phase("shift:step=7", steps=12, resume_after=7, gates=[])])
    found = [f for f in run.context["findings"] if f.kind in ("spike", "level_shift", "resume_shift")]
    assert [(f.kind, f.title.split(" from step")[0]) for f in found] == [
        ("level_shift", "loss level shift in resume [default], uninterrupted run (steps 1-12)"),
        ("level_shift", "loss level shift in resume [default], the resumed run (first half (steps 1-7, stopped), "
                        "then resumed second half (steps 8-12))")], found
    assert found[1].title.split(" from step")[1].startswith(" 7 to the run's last logged step, 12: "), found[1].title
    assert "/first/training.csv and " in found[1].detail[-1] and "/second/training.csv" in found[1].detail[-1]


HF_LIKE = {"name": "hf_like", "root": "validation/tests", "script": "hf_like_trainer.py", "format": "hf_trainer",
           "steps": {"flag": "--max_steps"}, "out_dir": {"flag": "--output_dir"}, "phases": ["train", "resume"],
           "resume": {"stop_after": {"flag": "--stop_after"}, "from": {"flag": "--resume_from"}}}
needs_tb = pytest.mark.skipif(__import__("importlib").util.find_spec("tensorboard") is None,
                              reason="writing event files needs the tensorboard package (pip install -e '.[test]')")


def _hf_resume(tmp_path: Path, env: dict[str, str]) -> tuple[int, dict, str]:
    """A resume point of a Hugging Face Trainer-like script (hf_like_trainer.py) through
    ``nsa-validate run``: its exit code, its stored record and the report."""
    from validation.cli import main
    rb = _foreign(tmp_path, HF_LIKE)
    data = yaml.safe_load(rb.read_text())
    if env:
        data["trainer"]["env"] = env
    rb.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "res"
    code = main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"])
    [rec] = json.loads((results / "results.json").read_text())["records"].values()
    [report] = (results / "reports").glob("*.md")
    return code, rec, report.read_text()


@needs_tb
@pytest.mark.parametrize("fault", ["", "ignore_resume"])
def test_a_hugging_face_trainer_with_its_events_is_judged_on_the_steps_they_show(tmp_path, fault):
    """Its TensorBoard events show the steps its second half trained: a resumed one passes, its first
    trained step the one after the stop; one that trained from step 1 again fails, did not resume."""
    code, rec, _ = _hf_resume(tmp_path, {"FAKE_HF_TB": "1", **({"FAKE_HF_FAULT": fault} if fault else {})})
    if fault:
        assert (code, rec["status"]) == (1, "FAIL") and "did not resume: the second half trained steps 1-2 again" in \
            rec["reason"], rec["reason"]
        return
    assert (code, rec["status"]) == (0, "PASS"), rec["reason"]
    gate = next(g for g in rec["gates"] if g["metric"] == "resume_first_step")
    assert (gate["value"], gate["verdict"]) == (3.0, "PASS")
    assert gate["note"] == "the second half began at step 3 (its TensorBoard events), the first after the stop"


@pytest.mark.parametrize("fault", ["", "ignore_resume"])
def test_a_second_half_whose_files_do_not_tell_what_it_trained_is_unmeasured(tmp_path, fault):
    """A Hugging Face Trainer run without --report_to tensorboard writes no heartbeats and no events: a
    second half that ignored the checkpoint and trained steps 1-6 again, of the same seed, logs the
    first half's losses, and the point was PASS ('loss of steps 1-6 continued: identical at every
    logged step'). Nothing in its files tells it from one that resumed: neither is PASS, both are
    UNMEASURED, saying what is missing."""
    code, rec, report = _hf_resume(tmp_path, {"FAKE_HF_FAULT": fault} if fault else {})
    assert rec["status"] == "UNMEASURED" and code != 0, (code, rec["reason"])
    gates = {g["metric"]: g for g in rec["gates"]}
    assert gates["resume_loss_rel_diff"]["verdict"] == "PASS"  # the curve cannot tell
    gate = gates["resume_first_step"]
    assert (gate["value"], gate["verdict"], gate["pending"]) == (None, "UNMEASURED", "metric the trainer does not provide")
    said = ("the second half left no heartbeat record of a step and its adapter no record of the steps it trained, so "
            "nothing tells whether it resumed or trained from step 1 again (which, of the same seed, logs the first "
            "half's losses again) (a Hugging Face Trainer's are its TensorBoard events: --report_to tensorboard)")
    assert gate["note"] == said
    assert rec["reason"] == f"metric the trainer does not provide: resume_first_step ({said})"
    assert "**Status: GO**" not in report and "resume_first_step" in report


@pytest.mark.parametrize("fault", ["", "ignore_resume:nodata=1"])
def test_heartbeats_every_few_steps_do_not_tell_a_second_half_that_began_before_its_first_record(fake_run, fault):
    """A trainer that beats every 5 steps, stopped after step 3: a second half that trained from step 1
    again, of the same seed, writes its first record at step 5 as one that resumed at step 4 does,
    and was PASS ('the second half began at step 5'), its losses 'identical at every logged step'.
    Its records say only that it began at step 5 or before, by as many steps as the trainer's records
    lie apart (the uninterrupted run's first is of step 5): UNMEASURED, either way."""
    rec = fake_run([resume_phase(fault, resume_after=3, env={"NSA_FAKE_BEAT_EVERY": "5"})]).record
    gate = {g.metric: g for g in rec.gates}["resume_first_step"]
    assert (rec.status, gate.value, gate.verdict) == (Status.UNMEASURED, None, "UNMEASURED"), (rec.reason, gate)
    assert gate.note == ("the second half's first heartbeat record is of step 5 (rank 0's heartbeats), and this "
                         "trainer's records lie up to 5 steps apart, so it began at step 1 or later: nothing tells "
                         "whether it resumed or trained from step 1 again (which, of the same seed, logs the first "
                         "half's losses again)"), gate.note


def test_heartbeats_every_few_steps_that_tell_the_start_pass(fake_run):
    """Every 2 steps, stopped after step 4: the second half's first record, of step 6, says it began
    at step 5 or later: after the stop."""
    rec = fake_run([resume_phase(env={"NSA_FAKE_BEAT_EVERY": "2"})]).record
    gate = {g.metric: g for g in rec.gates}["resume_first_step"]
    assert (rec.status, gate.value, gate.verdict) == (Status.PASS, 5.0, "PASS"), (rec.reason, gate)
    assert gate.note == ("the second half's first heartbeat record is of step 6 (rank 0's heartbeats), and this "
                         "trainer's records lie up to 2 steps apart, so it began at step 5 or later, the first after "
                         "the stop"), gate.note
