"""Steps completed against steps requested (issue 24, case 1): a trainer that exits 0 after 4 of
20 steps without a .HALT once got GO with "No automatic findings", its "last 10 steps" windows
computed over the 4 steps there were."""
from __future__ import annotations

import dataclasses

import pandas as pd

from nsa.contract import CSV_COLUMNS
from validation.contract.files import HaltInfo
from validation.judge.gates import Gate, GateVerdict, Window, evaluate
from validation.judge.metrics import RunData
from validation.judge.record import Status
from validation.judge.verdict import Outcome, verdict
from validation.tests.conftest import train_phase

LAST_10 = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, "window": "last 10 steps"},
           {"metric": "loss_finite", "op": "==", "threshold": 1}]


def test_a_trainer_that_exits_0_after_4_of_20_steps_is_NO_GO_with_its_finding(fake_run):
    run = fake_run([train_phase("long_run", fault="quit:step=4", steps=20, gates=LAST_10)])
    rec = run.record
    assert rec.exit_code == 0 and rec.evidence.halt is None
    assert (rec.status, rec.reason) == (Status.FAIL, "stopped after step 4 of 20, exit 0, no .HALT")
    [short] = [f for f in run.context["findings"] if f.kind == "short_run"]
    assert short.title == "long_run [default]: stopped after step 4 of 20, exit 0, no .HALT"
    window = next(g for g in rec.gates if g.metric == "toks_per_s_mean")
    assert window.verdict == GateVerdict.NO_DATA and window.value is None
    assert window.note == "the run logged steps 1..4, which do not cover the last 10 steps"
    assert rec.metrics.toks_per_s_mean is None  # the report's table shows no number for 'last 10 steps' either
    assert run.context["status"] == "NO-GO" and "No automatic findings" not in run.report


def test_the_same_trainer_running_all_its_steps_is_GO(fake_run):
    run = fake_run([train_phase("long_run", steps=20, gates=LAST_10)])
    assert run.record.status == Status.PASS, run.record.reason
    assert run.context["status"] == "GO"


def _csv(steps: range) -> pd.DataFrame:
    return pd.DataFrame([[s, 2.0, 1e-4, 100.0, 0.1, 1.0, 0.5, 1.0] for s in steps], columns=list(CSV_COLUMNS))


def test_a_window_the_run_did_not_cover_is_no_data_and_fails(tmp_path):
    gate = Gate("toks_per_s_mean", ">=", 1.0, Window(10))
    (short,) = evaluate([gate], RunData(tmp_path, csv=_csv(range(1, 5))), {})
    assert short.verdict == GateVerdict.NO_DATA
    assert verdict(Outcome("train", exit_code=0), [short])[0] == Status.FAIL
    (full,) = evaluate([gate], RunData(tmp_path, csv=_csv(range(1, 11))), {})
    assert full.verdict == GateVerdict.PASS
    # a resumed run logged steps 31..40: that covers 'last 10 steps', not 'last 11 steps'
    assert evaluate([gate], RunData(tmp_path, csv=_csv(range(31, 41))), {})[0].verdict == GateVerdict.PASS
    eleven = Gate("toks_per_s_mean", ">=", 1.0, Window(11))
    assert evaluate([eleven], RunData(tmp_path, csv=_csv(range(31, 41))), {})[0].verdict == GateVerdict.NO_DATA


def test_an_operators_halt_stays_its_own_verdict():
    stopped = Outcome("train", exit_code=0, halt=HaltInfo(text="maintenance"), steps_requested=20, steps_completed=4)
    assert not stopped.stopped_short
    # its own verdict, which names the steps as a short run's does (test_operator_halt.py)
    assert verdict(stopped, []) == (Status.FAIL, "stopped by a .HALT after step 4 of 20 (maintenance)")


def test_a_failed_exit_is_a_crash_only_after_a_step_was_logged():
    """Exit 1 with no step logged may be a crash at start-up or ranks that never started (a node
    that never joined): the verdict says what is known, the findings say which."""
    assert verdict(Outcome("train", exit_code=1, steps_requested=20, steps_completed=None), []) == (
        Status.FAIL, "trainer ended before its first step (exit code 1)")
    assert verdict(Outcome("train", exit_code=1, steps_requested=20, steps_completed=0), [])[1].startswith(
        "trainer ended before its first step")
    assert verdict(Outcome("train", exit_code=1, steps_requested=20, steps_completed=3), []) == (
        Status.FAIL, "trainer crashed (exit code 1)")
    assert verdict(Outcome("pytest", exit_code=1), []) == (Status.FAIL, "tests failed (exit code 1)")


def test_a_torn_last_row_is_the_error_not_a_run_that_stopped_short(fake_run):
    """The trainer ran every step and exited 0, but cut its last row short: the row is not read,
    so the CSV ends a step early. The broken file is the verdict and the finding; "stopped after
    step 5 of 6" and its advice to check that trainer.steps reaches the trainer were said beside
    it, of a trainer that had run all six."""
    run = fake_run([train_phase("long_run", fault="torn_last", steps=6, gates=LAST_10[1:])])
    rec = run.record
    assert rec.status == Status.ERROR and "the last row has no line end" in rec.reason, rec.reason
    assert not Outcome.of_record(rec).stopped_short
    kinds = [f.kind for f in run.context["findings"]]
    assert "short_run" not in kinds and "artifacts" in kinds, kinds
    assert "stopped after step" not in run.report and "exited 0 before the steps asked for" not in run.report
    # check-artifacts, the check to pass before the first acceptance run, refuses the directory too
    # (it said OK: every file present and well-formed)
    import io

    from validation.judge.check_command import check

    out = io.StringIO()
    assert check(run.results / rec.out_dir, out=out) == 1, out.getvalue()
    assert "malformed            training.csv: the last row has no line end (every row must end with one)" in \
        out.getvalue() and "an acceptance run whose trainer exits 0 is an ERROR for it" in out.getvalue(), out.getvalue()


def test_a_crash_after_steps_whose_csv_is_malformed_is_not_called_a_start_up_failure():
    """user7's pass: a trainer that logged steps 1..3, wrote a garbled row at step 4 and then
    crashed read 'trainer ended before its first step (exit code 1)': the malformed CSV gives no
    step count, but the heartbeats said step 4 was done."""
    broken = Outcome("train", exit_code=1, steps_requested=8, steps_completed=None, last_step_done=4,
                     errors=("training.csv: malformed (line 5 (step 4), column lr: 'zz!!' is not a number)",))
    status, reason = verdict(broken, [])
    assert status == Status.FAIL and "before its first step" not in reason, reason
    assert reason.startswith("trainer crashed (exit code 1)") and "training.csv: malformed" in reason, reason
    # no step in either file: still a start-up failure, and a broken file is said beside it
    early = Outcome("train", exit_code=1, steps_requested=8, steps_completed=None, last_step_done=None)
    assert verdict(early, []) == (Status.FAIL, "trainer ended before its first step (exit code 1)")
    # a format whose files hold a step only once it is logged (a Hugging Face Trainer's, no
    # heartbeats): five unlogged steps and a crash read 'before its first step'
    unlogged = dataclasses.replace(early, records_steps=False)
    assert verdict(unlogged, []) == (Status.FAIL, "trainer ended with no step logged (exit code 1)")


def test_a_crash_finding_names_the_malformed_csv_beside_the_exception(fake_run):
    run = fake_run([train_phase("long_run", fault="corrupt_csv:crash=4", steps=8, gates=LAST_10[1:])])
    rec = run.record
    assert rec.status == Status.FAIL and "before its first step" not in rec.reason, rec.reason
    [crash] = [f for f in run.context["findings"] if f.kind == "crash"]
    assert "injected crash" in crash.title, crash.title
    assert any("training.csv" in d and "malformed" in d for d in crash.detail), crash.detail


def test_a_rank_that_exits_0_early_while_the_others_finish_is_not_GO(fake_run):
    """user7's pass: ranks that share no collective (each trains on its own); rank 1 exited 0 in
    step 3 of 8, rank 0 logged all 8 steps, torchrun exited 0: GO with 'No automatic findings'.
    Its heartbeats record each step's end, so they say it completed 2 of the 8 steps asked for."""
    run = fake_run([train_phase("ddp", fault="quit_rank:rank=1:step=2", steps=6, env={"NSA_FAKE_WORLD": "2"},
                                gates=LAST_10[1:])])
    rec = run.record
    assert rec.exit_code == 0 and rec.metrics.steps_completed == 6
    assert rec.status == Status.FAIL, rec.reason
    assert rec.reason == ("rank 1's heartbeats stop after step 2 of 6 (its last heartbeat: step 3, stage forward; "
                          "the run completed step 6): it left early or trained on without writing them, exit 0, "
                          "no .HALT"), rec.reason
    [short] = [f for f in run.context["findings"] if f.kind == "short_rank"]
    assert "rank 1's heartbeats stop after step 2 of 6" in short.title
    assert run.context["status"] == "NO-GO" and "No automatic findings" not in run.report
    assert "every rank must run the same steps" in run.report
    # check-artifacts holds its directory to the contract as the run did (a user pass: it said OK)
    code, said = _check_artifacts(run)
    assert code == 1 and "malformed            heartbeat_rank1.jsonl: rank 1's heartbeats stop after step 2 of 6" in said


def _check_artifacts(run) -> tuple[int, str]:
    """``nsa-validate check-artifacts`` of the run's directory: its exit status and what it printed."""
    import io

    from validation.judge.check_command import check

    out = io.StringIO()
    return check(run.results / run.record.out_dir, out=out), out.getvalue()


def test_ranks_that_record_every_step_end_and_all_finish_are_GO(fake_run):
    run = fake_run([train_phase("ddp", fault="quit_rank:rank=7:step=2", steps=6, env={"NSA_FAKE_WORLD": "2"},
                                gates=LAST_10[1:])])
    assert run.record.status == Status.PASS, run.record.reason
    assert _check_artifacts(run)[0] == 0


def test_a_rank_whose_heartbeats_carry_no_stage_and_exits_0_early_is_not_GO(fake_run):
    """gofalse9: the rule above held only for ranks whose heartbeats record each step's end. The
    contract's records may carry only time and step (the seed's ranks beat only as a step starts):
    rank 1 beat steps 1..3 and left, rank 0 and training.csv went on to step 6, exit 0: GO."""
    run = fake_run([train_phase("ddp", fault="quit_rank:rank=1:step=2:plain=1", steps=6,
                                env={"NSA_FAKE_WORLD": "2"}, gates=LAST_10[1:])])
    rec = run.record
    assert rec.exit_code == 0 and rec.metrics.steps_completed == 6
    assert not rec.evidence.last_heartbeat[1].ends_steps
    assert rec.status == Status.FAIL, rec.reason
    assert rec.reason == ("rank 1's heartbeats end at step 3 while the run completed step 6 of 6 (it wrote one "
                          "every step): it left early or trained on without writing them, exit 0, no .HALT"), rec.reason
    [short] = [f for f in run.context["findings"] if f.kind == "short_rank"]
    assert "rank 1's heartbeats end at step 3" in short.title
    assert any("heartbeat_rank1.jsonl" in d for d in short.detail), short.detail
    assert run.context["status"] == "NO-GO" and "No automatic findings" not in run.report
    code, said = _check_artifacts(run)
    assert code == 1 and "heartbeat_rank1.jsonl: rank 1's heartbeats end at step 3 while the run completed step 6" in said


def test_a_rank_that_beats_every_k_steps_and_stops_a_beat_early_is_not_GO(fake_run):
    """Every rank beats every 2 steps (no stage); rank 1 beat steps 2 and 4 and left in step 5:
    its records lag the run's step 10 by 6, more than its own interval of 2."""
    run = fake_run([train_phase("ddp", fault="quit_rank:rank=1:step=4:plain=1:every=2", steps=10,
                                env={"NSA_FAKE_WORLD": "2"}, gates=LAST_10[1:])])
    assert run.record.status == Status.FAIL, run.record.reason
    assert run.record.reason.startswith("rank 1's heartbeats end at step 4 while the run completed step 10 of 10 "
                                        "(it wrote one every 2 steps)"), run.record.reason


def test_ranks_that_beat_every_k_steps_behind_the_csv_are_GO(fake_run):
    """A trainer that beats every 4 steps: every rank's last heartbeat is of step 8 of 10, 2 steps
    behind training.csv, less than the interval its own records show: no rank stopped early."""
    run = fake_run([train_phase("ddp", fault="quit_rank:rank=7:step=2:plain=1:every=4", steps=10,
                                env={"NSA_FAKE_WORLD": "2"}, gates=LAST_10[1:])])
    assert {r: b.step for r, b in run.record.evidence.last_heartbeat.items()} == {0: 8, 1: 8}
    assert run.record.status == Status.PASS, run.record.reason
    assert run.context["status"] == "GO"
    assert _check_artifacts(run)[0] == 0


def test_a_stored_record_of_a_rank_that_left_early_is_judged_the_same(fake_run):
    """The report re-judges stored records (a golden re-checked): the interval a rank's records
    show is stored with its last heartbeat, so the stored record says the same."""
    from validation.judge.record import PhaseRecord
    from validation.judge.verdict import rejudge

    run = fake_run([train_phase("ddp", fault="quit_rank:rank=1:step=2:plain=1", steps=6,
                                env={"NSA_FAKE_WORLD": "2"}, gates=LAST_10[1:])])
    stored = PhaseRecord.from_json(run.record.to_json(), "test")
    assert stored.evidence.last_heartbeat == run.record.evidence.last_heartbeat
    again = rejudge(stored, stored.gates)
    assert (again.status, again.reason) == (run.record.status, run.record.reason)


def test_a_rank_that_trains_on_without_heartbeats_is_not_said_to_have_stopped(tmp_path, monkeypatch):
    """user15's pass: under DDP (gloo, torchrun x2) rank 1 stopped writing heartbeats at step 3 and
    trained on in every all-reduce to step 8. The verdict said 'rank 1 stopped after step 2 of 8'
    and the advice 'A rank exited 0 before the steps asked for': untrue of a rank the others' 8
    all-reduces needed. Its files cannot tell the two apart, so the verdict and advice say both."""
    import yaml

    from validation.cli import main
    from validation.store.results import ResultStore

    trainer = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
    rb = tmp_path / "rb.yaml"
    rb.write_text(yaml.safe_dump({
        "name": "mine", "profiles": ["cpu"], "trainer": trainer,
        "defaults": {"steps": 8, "timeout_s": 120, "launcher": {"kind": "torchrun", "nproc": 2}},
        "phases": [{"name": "ddp", "kind": "train", "gates": LAST_10[1:]}]}))
    # a runbook may not set the test trainer's switch (the harness's allow-list): the harness's own environment
    monkeypatch.setenv("TEST_TRAINER_FAULT", "mute_rank:1@3")
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 1
    (rec,) = ResultStore(res).records()
    assert rec.exit_code == 0 and rec.metrics.steps_completed == 8
    assert rec.status == Status.FAIL, rec.reason
    assert rec.reason.startswith("rank 1's heartbeats stop after step 2 of 8 (its last heartbeat: step 2, stage step; "
                                 "the run completed step 8): "), rec.reason
    # its process ran to the end: where the harness saw it running once the run reached step 8, the
    # finding says so; where the run's 80 ms of steps fell between two of its polls, it says both
    # (validation/tests/launch/test_rank_process_ends.py)
    assert "trained on without writing them" in rec.reason and "it left early:" not in rec.reason, rec.reason
    report = (res / "reports" / "mine__cpu.md").read_text()
    assert "rank 1 stopped after step 2" not in report
    assert "Or it trained on and stopped writing its heartbeat file" in report, report


def test_a_short_rank_is_told_against_how_far_the_run_got_not_a_full_training_csv():
    """A user's pass: rank 0, which writes training.csv, left after step 3 while rank 1 trained
    all 8; the finding said 'training.csv has every step' of a file that ends at step 3. It says
    how far the run's other files got, or that none goes further."""
    from validation.judge.record import Beat
    from validation.judge.short_ranks import short_ranks

    left, finished = Beat(step=3, stage="step"), Beat(step=8, stage="step")
    [short] = short_ranks({0: left, 1: finished}, world=2, steps=8, logged=3)
    assert short.rank == 0 and "(its last heartbeat: step 3, stage step; the run completed step 8)" in short.text(8)
    both = short_ranks({0: left, 1: Beat(step=3, stage="step")}, world=2, steps=8, logged=3)
    assert all("no other file of the run goes further" in s.text(8) for s in both)


def test_a_window_of_a_run_that_logs_every_4_steps_is_covered_from_step_1():
    """A 12-step run logging every 4 steps (rows 4, 8, 12) had 'last 12 steps' and 'last 10 steps'
    as no data, NO-GO, though it ran every step: its first row stands for steps 1-4. A run resumed
    after step 100 still covers no window reaching below step 101."""
    from validation.judge.metrics import window_covered

    def csv(steps):
        return pd.DataFrame({"step": steps, "toks_per_s": [100.0] * len(steps)})

    every_4 = csv([4, 8, 12])
    assert all(window_covered(every_4, last) for last in (12, 10, 9, None))
    assert not window_covered(every_4, 13)
    every_20 = csv([20, 40, 60])  # docs/runbook_format.md: three rows in 'last 50 steps'
    assert window_covered(every_20, 50) and window_covered(every_20, 60) and not window_covered(every_20, 61)
    resumed = csv(list(range(101, 121)))
    assert window_covered(resumed, 20) and not window_covered(resumed, 21)
    assert window_covered(csv(list(range(1, 13))), 12) and not window_covered(csv(list(range(1, 13))), 13)
    run = RunData(out_dir=None, csv=every_4)
    [g] = evaluate([Gate("toks_per_s_mean", ">=", 1, window=Window(last=12))], run, {})
    assert g.verdict == GateVerdict.PASS and g.value == 100.0, g


def test_a_csv_whose_steps_run_ahead_of_every_ranks_heartbeats_is_not_taken_for_how_far_the_run_got():
    """A user pass: training.csv logged step 2N at step N (rows 2, 4, ..., 12 of 12)
    while both ranks' heartbeats honestly said step 6. The verdict said 'rank 0's heartbeats stop
    after step 6 of 12 (... the run completed step 12): ... it trained on without writing them', taking
    the step of the file that disagreed with every heartbeat for the truth. It says the files
    disagree, where: rank 0 writes the CSV, and its heartbeats say step 6."""
    from validation.judge.findings import find, recommendations
    from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Summary

    beats = {0: Beat(step=6, stage="step"), 1: Beat(step=6, stage="step")}
    rec = PhaseRecord(PointKey("myt", "cpu", "jump"), "myt/cpu/jump/default", "train", Status.FAIL, "", steps=12,
                      world_size=2, exit_code=0, metrics=Summary(steps_completed=12),
                      evidence=Evidence(last_heartbeat=beats))
    status, reason = verdict(Outcome.of_record(rec), [])
    assert status == Status.FAIL, reason
    assert reason == ("training.csv logs steps beyond what the heartbeats show: its last row says step 12 of 12, and "
                      "no rank's heartbeats go past step 6 (rank 0, which writes it, at step 6, stage step, as it "
                      "wrote row 12), exit 0, no .HALT"), reason
    [f] = [f for f in find([dataclasses.replace(rec, reason=reason)]) if f.severity.value == "critical"]
    assert f.kind == "csv_ahead" and "the run completed step 12" not in f.title, f
    [advice] = recommendations([f])
    assert "a logged number that is not the step" in advice, advice
    # a rank whose own heartbeats reach the CSV's last step: the other rank is short, as before
    beats[1] = Beat(step=12, stage="step")
    assert Outcome.of_record(rec).csv_ahead is None
    assert "the run completed step 12" in Outcome.of_record(rec).short_text()


def test_a_rank_seen_gone_is_said_to_have_left_after_its_own_last_step_not_the_step_the_harness_saw():
    """A user's rank 1 exited right after step 6 of 12; the finding said its process 'had exited
    before the run got past step 11', the step the run's files showed when the harness next looked,
    and read as where it left. Its own last record says where: step 6's end."""
    from validation.judge.record import Beat
    from validation.judge.seen import ProcessSeen
    from validation.judge.short_ranks import short_ranks

    gone = ProcessSeen(4242, 6, gone_at=11)
    [short] = short_ranks({0: Beat(step=12, stage="step"), 1: Beat(step=6, stage="step")}, world=2, steps=12,
                          logged=12, processes={1: gone})
    assert short.text(12) == (
        "rank 1's heartbeats stop after step 6 of 12 (its last heartbeat: step 6, stage step; the run completed step "
        "12): it left early: it started no step after step 6, the last it completed (its last heartbeat marks that "
        "step's end), and its process (pid 4242, its heartbeats') had exited by the time the run reached step 11")
    [within] = short_ranks({0: Beat(step=12, stage="step"), 1: Beat(step=7, stage="forward")}, world=2, steps=12,
                           logged=12, processes={1: gone})
    assert ("it left early: it started no step after step 7 (its last heartbeat: stage forward, within that step), "
            "and its process") in within.text(12), within.text(12)
    [plain] = short_ranks({0: Beat(step=12, ends_steps=False, every=1), 1: Beat(step=6, ends_steps=False, every=1)},
                          world=2, steps=12, logged=12, processes={1: gone})
    assert "it left early: it started no step after step 6, the last it started (its heartbeats mark no step's end)" \
           in plain.text(12), plain.text(12)


def test_a_trainer_that_runs_past_the_steps_asked_is_NO_GO_with_its_finding():
    """A Hugging Face script that sets its own max_steps (16) over the harness's --max_steps 12
    exited 0 with every gate passed: GO, its 'last 6 steps' and loss drop read from a run that was
    not the one asked for."""
    from validation.judge.findings.failures import short_runs
    from validation.judge.record import PhaseRecord, PointKey, Summary
    from validation.judge.verdict import process_verdict

    said = "ran past the steps asked: training.csv logs step 16 of 12 asked, exit 0"
    assert process_verdict(Outcome("train", exit_code=0, steps_requested=12, steps_completed=16)) == (Status.FAIL, said)
    assert process_verdict(Outcome("train", exit_code=0, steps_requested=12, steps_completed=12)) is None
    rec = PhaseRecord(key=PointKey("rb", "cpu", "single"), test_id="rb/cpu/single/default", kind="train",
                      status=Status.FAIL, reason=said, exit_code=0, steps=12, out_dir="runs/x",
                      metrics=Summary(steps_completed=16))
    [finding] = short_runs([rec])
    assert finding.kind == "long_run" and finding.title == f"single [default]: {said}", finding
