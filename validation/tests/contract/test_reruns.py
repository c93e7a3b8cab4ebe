"""Steps a trainer wrote twice: a trainer resumed in place goes back to its checkpoint and writes
the steps after it again into the same training.csv and heartbeat files. The judge reads the
occurrence written after the resume (validation/contract/reruns.py) and says that it happened."""
from __future__ import annotations

import json

import pytest

from nsa.contract import CSV_COLUMNS
from validation.contract.check import read as read_contract
from validation.contract.files import read_heartbeats, read_training_csv
from validation.contract.reruns import Rerun, latest
from validation.judge.evidence import read_train
from validation.judge.metrics import RunData, compute, rank_step_times
from validation.judge.verdict import Outcome, process_verdict
from validation.tests.conftest import train_phase


def _row(step, toks=100.0, loss=2.0):
    return [step, loss, 1e-4, toks, 0.5, 1.0, 0.5, 1.0]


def _write_csv(path, rows):
    (path / "training.csv").write_text(
        ",".join(CSV_COLUMNS) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))


def _beat(step, time, pid=None, stage="step"):
    rec = {"time": time, "rank": 0, "step": step, "stage": stage}
    return rec if pid is None else {**rec, "pid": pid}


def _write_beats(path, rank, recs):
    (path / f"heartbeat_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_step_logged_again_begins_a_rerun_and_supersedes_every_later_step():
    # steps 1..10, the process restarts from its checkpoint at 6 and gets to 8
    kept, reruns = latest([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7, 8], one_per_step=True)
    assert kept == [0, 1, 2, 3, 4, 5, 10, 11]
    assert reruns == [Rerun(7, 10, 4)]
    assert reruns[0].text() == "went back from step 10 to step 7 (4 earlier entries superseded)"
    # a rerun from the last step only, and none at all
    assert latest([1, 2, 3, 3, 4], one_per_step=True) == ([0, 1, 3, 4], [Rerun(3, 3, 1)])
    assert latest([1, 2, 3], one_per_step=True) == ([0, 1, 2], [])


def test_heartbeats_share_a_step_between_stages_and_go_back_only_on_a_rerun():
    steps = [1, 1, 2, 2, 3, 3, 2, 2, 3]  # two records a step; the restarted process from step 2
    kept, reruns = latest(steps, one_per_step=False)
    assert [steps[i] for i in kept] == [1, 1, 2, 2, 3] and kept[2:] == [6, 7, 8]
    assert reruns == [Rerun(2, 3, 4)]
    # another process that starts at the step the last one reached: known by its pid
    new = [False, False, False, True, False]
    assert latest([1, 2, 3, 3, 4], one_per_step=False, new_process=new) == ([0, 1, 3, 4], [Rerun(3, 3, 1)])
    assert latest([1, 2, 3, 3, 4], one_per_step=False)[1] == []
    # records of no step are kept where they stand
    assert latest([1, None, 2, 1], one_per_step=False)[0] == [1, 3]


def test_records_of_steps_done_that_come_late_are_no_rerun(tmp_path):
    """This project's trainer, profiling steps 2-3 (the CPU smoke runbook's nvtx phase), writes their
    step records after the profile's: once read as a resume in place from step 2, a false warning."""
    seq = [(1, "data"), (1, "step"), (2, "data"), (2, "optimizer"), (3, "data"), (3, "optimizer"), (3, "profile"),
           (2, "step"), (3, "step"), (4, "data"), (4, "step")]
    recs = [{"time": float(i), "rank": 0, "pid": 5500, "step": step, "stage": stage}
            for i, (step, stage) in enumerate(seq)]
    _write_beats(tmp_path, 0, recs)
    assert read_heartbeats(tmp_path)[0] == recs
    assert read_contract(tmp_path).reruns == {}
    # the same order without a pid, and a stage within a step going back: that is a rerun
    kept, reruns = latest([s for s, _ in seq] + [3], one_per_step=False,
                          late=[st in ("step", "profile") for _, st in seq] + [False])
    assert reruns == [Rerun(3, 4, 6)]


def test_a_trainer_writing_only_step_records_without_a_pid_shows_its_rerun(tmp_path):
    """Records of steps done may come late, but a step done that the file already holds, written again,
    is a process that went back (a trainer whose heartbeats are one 'step' record a step, no pid)."""
    steps = [1, 2, 3, 4, 5, 3, 4, 5, 6]
    _write_beats(tmp_path, 0, [{"time": float(i), "step": s, "stage": "step"} for i, s in enumerate(steps)])
    beats = read_heartbeats(tmp_path)[0]
    assert [(r["step"], r["time"]) for r in beats] == [(1, 0.0), (2, 1.0), (3, 5.0), (4, 6.0), (5, 7.0), (6, 8.0)]


def test_training_csv_of_a_resume_in_place_reads_the_later_rows(tmp_path):
    _write_csv(tmp_path, [_row(s) for s in range(1, 11)] + [_row(s, toks=50.0, loss=3.0) for s in range(7, 13)])
    df = read_training_csv(tmp_path)
    assert df["step"].tolist() == list(range(1, 13))
    assert df.loc[df["step"] >= 7, "toks_per_s"].tolist() == [50.0] * 6
    run = RunData(tmp_path, csv=df)
    # before: steps 8-10 were read twice, their first rows among them: a mean of 68.75, not 50
    assert compute("toks_per_s_mean", run, 5) == pytest.approx(50.0)
    found = read_contract(tmp_path)
    assert found.reruns == {"training.csv": [Rerun(7, 10, 4)]}
    csv_item = next(i for i in found.items if i.file == "training.csv" and i.field is None)
    # the file holds 16 rows: it said '12 rows', the rows kept, as though that were the file
    assert "12 rows read of 16 in the file, steps 1..12; resumed in place: went back from step 10 to step 7 (4 earlier entries superseded), " \
           "the later occurrence read" in csv_item.detail


def test_a_stall_after_a_resume_in_place_is_after_the_step_the_later_process_reached(tmp_path):
    """A run that logged steps 1..10, was restarted from its checkpoint at step 6 and hung in step
    9: the stall is after step 8. Before, the earlier process's rows of steps 9 and 10 said 10."""
    _write_csv(tmp_path, [_row(s) for s in range(1, 11)] + [_row(s) for s in (7, 8)])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 1}))
    _write_beats(tmp_path, 0, [_beat(s, 100.0 + s, pid=11) for s in range(1, 11)] + [_beat(11, 111.0, 11, "data")]
                 + [_beat(s, 200.0 + s, pid=12) for s in (7, 8)] + [_beat(9, 209.0, 12, "data")])
    run = RunData(tmp_path, exit_code=None, stalled_s=60.0, stacks_tried=1, steps_requested=20)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    assert not errors
    status, reason = process_verdict(Outcome.of_run("train", run, errors))
    assert "no progress for 60s after step 8;" in reason
    assert compute("steps_completed", run, None) == 8.0


def test_step_times_of_a_rerun_do_not_count_the_earlier_process(tmp_path):
    """Each step's time is read from the process that last ran it: the earlier process's steps
    8-10 (2 s each) are not this rank's pace once the later one (1 s each) ran them again."""
    _write_beats(tmp_path, 0, [_beat(s, 2.0 * s, pid=1) for s in range(1, 11)]
                 + [_beat(s, 100.0 + s, pid=2) for s in range(8, 21)])
    beats = read_heartbeats(tmp_path)
    assert [r["step"] for r in beats[0]] == list(range(1, 21))
    # before: the first record of each step was read, so steps 8-10 (and the gap from 10 to the later
    # process's 11) were the earlier process's: the median over steps 2-20 was 2 s, not 1 s
    assert rank_step_times(beats) == {0: 1.0}


def test_a_trainer_resumed_in_place_is_a_warning_and_its_numbers_are_the_later_ones(fake_run):
    """The fake trainer logs steps 1..6, 'restarts' from step 3 and runs to 10: steps 4-6 twice,
    the first time at 1 token/s. The gate's window reads the second rows only."""
    run = fake_run([train_phase(fault="rerun:step=6:back=3", steps=10, gates=[
        {"metric": "toks_per_s_mean", "op": ">=", "threshold": 150, "window": "last 8 steps"}])])
    rec = run.record
    assert rec.status == "PASS", rec.reason
    assert rec.metrics.toks_per_s_mean == pytest.approx(201.0, abs=1.0)
    assert rec.metrics.steps_completed == 10
    warnings = [f for f in run.findings("warning") if "resumed in place" in f]
    assert len(warnings) == 1
    assert warnings[0].startswith("trainer resumed in place in baseline_ddp [default]: it went back to a checkpoint "
                                  "and wrote again from step 4 into the same files")
    assert "heartbeat_rank0.jsonl: went back from step 6 to step 4 (3 earlier entries superseded)" in warnings[0]
    assert "training.csv: went back from step 6 to step 4 (3 earlier entries superseded)" in warnings[0]
    assert "why the earlier process ended is in the trainer's log" in run.report


def test_a_run_that_did_not_resume_says_nothing_of_it(fake_run):
    run = fake_run([train_phase()])
    assert not [f for f in run.findings() if "resumed in place" in f]
    assert run.record.evidence.reruns == {}


def test_a_step_logged_again_by_one_process_is_no_resume_but_a_malformed_csv(tmp_path):
    """user15's pass: a DDP trainer whose every rank appended its rows to training.csv (1,1,2,2,...)
    got PASS with a WARNING 'trainer resumed in place ... went back to a checkpoint and wrote again
    from step 1, 2, 3, 4, 5, 6, 7, 8', every later row (rank 1's) read as what happened. Rank 0's
    heartbeats, one pid throughout and never going back, say no process started again."""
    _write_csv(tmp_path, [_row(s) for s in range(1, 7) for _ in range(2)])
    for rank, pid in ((0, 100), (1, 101)):
        _write_beats(tmp_path, rank, [{**_beat(s, float(s), pid=pid), "rank": rank} for s in range(1, 7)])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 2}))
    found = read_contract(tmp_path)
    assert not found.ok
    (problem,) = found.problems()
    assert ("training.csv step: malformed (step 2 logged twice, then steps up to 6 (6 rows log a step again in "
            "all), yet one process wrote the run: rank 0's heartbeats, every one from pid 100, cover steps 1..6"
            ) in problem, problem
    assert "a second writer" in problem
    assert "training.csv" not in found.reruns
    assert not [i for i in found.items if "resumed in place" in i.detail]


def test_a_run_that_logs_its_step_again_and_never_advances_is_named_by_that_step_first(tmp_path):
    """A user's trainer stuck at step 5 of 12 logged it 8 times: the ERROR said 'step 5 logged again
    (...; 7 such row(s) in all)' and 'a second writer ... or a step logged twice', never that the run
    logged no step after 5."""
    _write_csv(tmp_path, [_row(s) for s in [1, 2, 3, 4] + [5] * 8])
    _write_beats(tmp_path, 0, [_beat(s, float(s), pid=100) for s in [1, 2, 3, 4] + [5] * 8])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 1}))
    (problem,) = read_contract(tmp_path, steps=12).problems()
    assert problem.endswith(
        "training.csv step: malformed (step 5 logged 8 times and no step after it: the run never got past step 5 of "
        "the 12 asked, yet one process wrote the run: rank 0's heartbeats, every one from pid 100, cover steps 1..5 "
        "and never go back. Only a resume in place (a new process) may log a step again; training.csv is rank 0's "
        "alone, one row per step: a loop that logs its step again without moving on (a step counter not advanced, "
        "the same step retried), or a second writer (every rank appending its rows?))"), problem
    (unasked,) = read_contract(tmp_path).problems()  # check-artifacts: the steps asked are not known
    assert "the run never got past step 5, yet one process" in unasked, unasked


@pytest.mark.parametrize("beats", [
    # a resume in place: another process wrote steps 4.. again
    [_beat(s, float(s), pid=100) for s in range(1, 7)] + [_beat(s, 10.0 + s, pid=200) for s in range(4, 9)],
    # heartbeats without a pid say nothing of the processes
    [_beat(s, float(s)) for s in range(1, 9)],
])
def test_a_step_logged_again_where_the_heartbeats_allow_a_resume_stays_a_rerun(tmp_path, beats):
    _write_csv(tmp_path, [_row(s) for s in [1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8]])
    _write_beats(tmp_path, 0, beats)
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 1}))
    found = read_contract(tmp_path)
    assert found.ok, found.problems()
    assert found.reruns["training.csv"] == [Rerun(4, 6, 3)]


def test_a_restart_from_the_first_step_names_the_rank_that_failed_not_a_checkpoint():
    """A user's pass: under torchrun --max-restarts=1 rank 1 crashed at step 3 and the restarted
    ranks trained from step 1. The warning said the trainer 'went back to a checkpoint' (there was
    none) and named neither the rank nor its exception, which the record held."""
    from validation.contract.torchrun_log import RankFailure
    from validation.judge.findings.resume import resumed_in_place
    from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

    evidence = Evidence(reruns={"training.csv": [Rerun(first=1, through=3, dropped=3)]}, rank_failures={
        0: RankFailure(exception="RuntimeError: Connection closed by peer [127.0.0.1]:4702"),
        1: RankFailure(exception="RuntimeError: injected one-time crash on rank 1 at step 3")})
    rec = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.PASS, "", steps=8,
                      evidence=evidence)
    [warning] = resumed_in_place([rec])
    assert warning.title == ("trainer resumed in place in ddp [default]: it started again from step 1 and wrote its "
                             "steps again into the same files"), warning.title
    assert any("the earlier process ended as rank 1 failed: RuntimeError: injected one-time crash on rank 1 at step 3"
               in d for d in warning.detail), warning.detail


def test_each_attempt_of_a_restarted_run_is_given_its_own_failure(tmp_path):
    """Under torchrun --max-restarts=1 rank 0 was killed at step 9 and the restart, from step 6, met
    a non-finite loss at step 15: the warning said 'the earlier process ended as rank 0 failed:
    RuntimeError: Loss is not finite ... at step 15', the whole log's exception, the later attempt's.
    torchrun's agent writes a line per failed attempt; what a rank printed before it is that attempt's."""
    from validation.contract.torchrun_log import AttemptEnd, RankFailure, attempt_ends
    from validation.judge.findings.resume import resumed_in_place
    from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

    agent = ("E1201 22:16:0{i}.236000 483 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
             "(exitcode: {code}) local_rank: 0 (pid: 70{i}) of binary: /opt/torch/.venv/bin/python3\n")
    nan = "RuntimeError: Loss is not finite (global_avg_loss=nan) at step 15. Stopping training."
    log = tmp_path / "trainer.stderr.log"
    log.write_text(agent.format(i=1, code=-9) + "[rank0]: Traceback (most recent call last):\n"
                   f"[rank0]:   File \"train.py\", line 3, in step\n[rank0]: {nan}\n" + agent.format(i=2, code=1)
                   + "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 702)\n")  # torchrun's summary as it gave up
    attempts = attempt_ends(log)
    assert attempts == [AttemptEnd(1, 0, 701, -9, restarted=True, rank=0), AttemptEnd(2, 0, 702, 1, nan, rank=0)]
    evidence = Evidence(reruns={"training.csv": [Rerun(first=6, through=8, dropped=3)]}, stderr_log=log.name,
                        rank_failures={0: RankFailure(exception=nan, exit_code=1)}, attempts=attempts)
    rec = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL, "", steps=30,
                      evidence=evidence)
    [warning] = resumed_in_place([rec])
    assert warning.detail[-1] == (
        "every number and finding of this run reads the occurrence written later; by torchrun's log "
        "(trainer.stderr.log), attempt 1 ended as rank 0 (pid 701) was killed by SIGKILL; attempt 2 ended as "
        "rank 0 (pid 702) failed: RuntimeError: Loss is not finite (global_avg_loss=nan) at step 15"
    ), warning.detail


def test_a_heartbeat_record_cut_off_in_a_run_that_exited_0_is_a_problem_as_a_cut_off_row_is(tmp_path):
    """A user's pass: a trainer that exited 0 with its last heartbeat record of rank 1 (step 8 of 8)
    lacking its line end was judged 'heartbeats stop after step 7 of 8 ... trained on without
    writing them', the torn record never named, while a torn training.csv row is the point's error.
    A record cut off mid-write is not read; of a trainer that exited 0, it is the error."""
    _write_csv(tmp_path, [_row(s) for s in range(1, 9)])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 2}))
    _write_beats(tmp_path, 0, [_beat(s, float(s)) for s in range(1, 9)])
    last = json.dumps({**_beat(8, 8.0), "rank": 1})[:25]  # cut off mid-record
    (tmp_path / "heartbeat_rank1.jsonl").write_text(
        "".join(json.dumps({**_beat(s, float(s)), "rank": 1}) + "\n" for s in range(1, 8)) + last)
    files = read_train(RunData(tmp_path, world_size=2, exit_code=0))
    [torn] = [p for p in files.problems if "heartbeat_rank1.jsonl" in p]
    assert "the last record has no line end though the trainer exited 0" in torn and last in torn, torn
    assert not read_train(RunData(tmp_path, world_size=2, exit_code=None, stalled_s=30.0)).problems  # a killed writer
    # check-artifacts, which cannot know whether the trainer still runs, names it beside the count
    [beats] = [i for i in read_contract(tmp_path).items if i.file == "heartbeat_rank{R}.jsonl" and not i.field]
    assert f"rank 1: 7 records; its last record has no line end (cut off mid-write?): {last!r}" in beats.detail, beats
