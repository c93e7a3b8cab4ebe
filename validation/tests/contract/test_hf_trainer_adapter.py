"""The hf_trainer adapter on a Hugging Face Trainer's output folder as the Trainer writes it
(trainer_state.json's log_history, TensorBoard events under runs/, checkpoint-N/): what becomes
training.csv and env.json, what is UNMEASURED, and what the stall watch sees while it runs. The
end-to-end runs of a real Trainer are tests/faults/test_hf_trainer.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from validation.cli import main
from validation.contract import check as contract
from validation.contract.adapters import ADAPTERS
from validation.contract.adapters.base import RunFacts
from validation.contract.files import read_training_csv
from validation.launch.watch import StepWatch

HF = ADAPTERS["hf_trainer"]
needs_tb = pytest.mark.skipif(__import__("importlib").util.find_spec("tensorboard") is None,
                              reason="writing event files needs the tensorboard package (pip install -e '.[test]')")


def _log(step: int, loss: float) -> dict:
    return {"epoch": step / 10, "grad_norm": 1.5 + step / 100, "learning_rate": 1e-3 / step, "loss": loss, "step": step}


def _state(folder: Path, steps: list[int], losses: dict[int, float] | None = None, summary: int | None = None,
           evaluations: dict[int, dict[str, float]] | None = None) -> None:
    """``evaluations``: per step, the evaluation entries' runtimes logged after it, by metric prefix
    (``eval``, or ``eval_<name>`` for each dataset of a dict ``eval_dataset``)."""
    losses = losses or {}
    history = []
    for s in steps:
        history.append(_log(s, losses.get(s, 5.0 - s / 10)))
        history += [{f"{prefix}_loss": 4.0, f"{prefix}_runtime": seconds, f"{prefix}_samples_per_second": 8.0,
                     "epoch": s / 10, "step": s} for prefix, seconds in (evaluations or {}).get(s, {}).items()]
    if summary is not None:
        history.append({"epoch": 1.0, "step": summary, "train_runtime": 1.5, "train_loss": 4.5,
                        "train_steps_per_second": 3.0, "total_flos": 1.0})
    folder.mkdir(parents=True, exist_ok=True)
    # Python's json, as the Trainer writes it: a NaN loss as a bare NaN
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": max(steps, default=0), "log_history": history}))


def _events(folder: Path, walls: dict[int, float], start: float,
            evaluations: dict[int, tuple[float, dict[str, float]]] | None = None) -> None:
    """Rank 0's events as the Trainer's TensorBoard callback writes them: the writer opened as
    training begins, then train/loss, train/grad_norm, train/learning_rate per logged step, and
    after a step with an evaluation (``evaluations``: its wall time as it ends, and its runtime by
    tag: ``eval/runtime``, ``eval/<name>_runtime``) eval/loss and its runtime."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    run = folder / "runs" / "Dec01_12-00-00_host"
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "events.out.tfevents.100.host.1.0", "ab") as fh:
        writer = RecordWriter(fh)
        if fh.tell() == 0:
            writer.write(Event(wall_time=start, file_version="brain.Event:2").SerializeToString())
        records = [(wall, step, tag, value) for step, wall in walls.items()
                   for tag, value in (("train/loss", 5.0 - step / 10), ("train/grad_norm", 1.5 + step / 100),
                                      ("train/learning_rate", 1e-3 / step))]
        records += [(ended, step, tag, value) for step, (ended, runtimes) in (evaluations or {}).items()
                    for tag, value in (("eval/loss", 4.0), *runtimes.items())]
        for wall, step, tag, value in sorted(records, key=lambda r: (r[0], r[1])):
            event = Event(wall_time=wall, step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
            writer.write(event.SerializeToString())


def _convert(trainer_dir: Path, out: Path, tokens: int | None = 512, world: int = 1) -> contract.ContractRead:
    HF.convert(trainer_dir, out, RunFacts(world, "hf.train", tokens_per_step=tokens))
    return contract.read(out, launched=world)


@needs_tb
def test_log_history_and_events_become_the_contract(tmp_path):
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3, 4], summary=4)
    _events(trainer, {1: 100.5, 2: 100.75, 3: 101.0, 4: 101.5}, start=100.0)
    found = _convert(trainer, tmp_path / "run", tokens=512, world=2)
    assert not found.problems(), found.problems()
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [1, 2, 3, 4]
    assert list(df["loss"]) == pytest.approx([4.9, 4.8, 4.7, 4.6])  # log_history's float64
    assert list(df["step_time_s"]) == pytest.approx([0.5, 0.25, 0.25, 0.5])
    assert list(df["toks_per_s"]) == pytest.approx([1024, 2048, 2048, 1024])
    assert list(df["lr"]) == pytest.approx([1e-3, 5e-4, 1e-3 / 3, 2.5e-4])
    assert df["mem_alloc_gb"].isna().all()
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["world_size"] == 2 and env["tokens_per_step"] == 512
    assert env["adapter"]["name"] == "hf_trainer" and env["adapter"]["summary_step"] == 4
    assert set(env["adapter"]["read"]) == {"trainer_state.json", "runs/Dec01_12-00-00_host/events.out.tfevents.100.host.1.0"}
    # no heartbeats: the check says UNMEASURED, not a missing required file
    beats = [i for i in found.items if i.file.startswith("heartbeat")]
    assert beats and not beats[0].required and "UNMEASURED" in beats[0].detail


@needs_tb
def test_the_evaluations_between_steps_are_not_training_time(tmp_path):
    """eval_strategy="steps": the Trainer logs step 2, evaluates (2 s), then trains step 3, so
    step 3's time from the events was the evaluation's too (tokens/s of an eval-heavy window a
    hundredth of the training's). Each evaluation's eval_runtime comes out of the logged step
    after it, one a dataset where eval_dataset is a dict, and eval_on_start's (step 0) out of the
    first step."""
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3, 4, 5, 6], summary=6,
           evaluations={0: {"eval": 1.0}, 2: {"eval": 2.0}, 4: {"eval_a": 1.0, "eval_b": 0.5}})
    _events(trainer, {1: 101.5, 2: 102.0, 3: 104.5, 4: 105.0, 5: 107.0, 6: 107.5}, start=100.0,
            evaluations={0: (101.0, {"eval/runtime": 1.0}), 2: (104.0, {"eval/runtime": 2.0}),
                         4: (106.5, {"eval/a_runtime": 1.0, "eval/b_runtime": 0.5})})
    found = _convert(trainer, tmp_path / "run", tokens=512)
    assert not found.problems(), found.problems()
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(df["step_time_s"]) == pytest.approx([0.5] * 6)
    assert list(df["toks_per_s"]) == pytest.approx([1024] * 6)
    note = json.loads((tmp_path / "run" / "env.json").read_text())["adapter"]["evaluations"]
    assert note.startswith("the evaluation after step 0 (1 s) left out of step 1's time; the evaluation after "
                           "step 2 (2 s) left out of step 3's time; the evaluation after step 4 (1.5 s) left out "
                           "of step 5's time"), note


@needs_tb
def test_evaluations_the_events_alone_hold_and_one_inside_a_logging_window(tmp_path):
    """A run killed after checkpoint-2: the evaluation after step 3 is in the events only. Logged
    every 2 steps, an evaluation after step 5 (eval_steps 5) lies inside the window of steps 5-6."""
    trainer = tmp_path / "trainer_out"
    _state(trainer / "checkpoint-2", [2])
    _events(trainer, {2: 101.0, 4: 104.0, 6: 106.0}, start=100.0,
            evaluations={3: (103.0, {"eval/runtime": 1.0}), 5: (105.5, {"eval/runtime": 1.0})})
    _convert(trainer, tmp_path / "run")
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [2, 4, 6]
    assert list(df["step_time_s"]) == pytest.approx([0.5, 1.0, 0.5])


@needs_tb
def test_an_evaluation_at_the_step_a_run_resumed_from_was_the_earlier_runs(tmp_path):
    """Resumed from checkpoint-3, whose log_history holds the earlier run's evaluation after step
    3: it ran in that process, not before this run's step 4, which keeps its whole time."""
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3, 4, 5, 6], summary=6, evaluations={3: {"eval": 0.4}})
    _events(trainer, {4: 100.5, 5: 100.75, 6: 101.0}, start=100.0)
    _convert(trainer, tmp_path / "run", tokens=512)
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [4, 5, 6]
    assert list(df["step_time_s"]) == pytest.approx([0.5, 0.25, 0.25])
    assert "evaluations" not in json.loads((tmp_path / "run" / "env.json").read_text())["adapter"]


@needs_tb
def test_steps_after_the_last_saved_state_come_from_the_events(tmp_path):
    """A run killed after checkpoint-2: its state stops at step 2, its events (flushed at every
    log) at step 3; the last step is 3, and no summary says train() returned."""
    trainer = tmp_path / "trainer_out"
    _state(trainer / "checkpoint-2", [1, 2])
    _events(trainer, {1: 10.5, 2: 11.0, 3: 11.5}, start=10.0)
    _convert(trainer, tmp_path / "run")
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [1, 2, 3]
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["adapter"]["summary_step"] is None and "checkpoint-2/trainer_state.json" in env["adapter"]["read"]


def test_without_events_or_tokens_the_rate_is_unmeasured_not_malformed(tmp_path):
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3], summary=3)
    found = _convert(trainer, tmp_path / "run", tokens=None)
    assert not found.problems(), found.problems()
    df = read_training_csv(tmp_path / "run")
    assert df["toks_per_s"].isna().all() and df["step_time_s"].isna().all()
    missing = {i.field for i in found.items if i.file == "training.csv" and i.presence == contract.Presence.MISSING}
    assert {"toks_per_s", "step_time_s"} <= missing
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert "tokens_per_step" not in env and "toks_per_s" in env["adapter"]["unmeasured"]
    # and its gates are UNMEASURED with the adapter's reason (they were no data: a FAIL, NO-GO)
    from validation.judge.gates import Gate, GateVerdict, Window, evaluate
    from validation.judge.metrics import RunData, unprovided_by_files

    run = RunData(tmp_path / "run", csv=found.csv, env=found.env)
    gate = Gate("toks_per_s_mean", ">=", 1.0, Window(None))
    [result] = evaluate([gate], run, unprovided_by_files(run))
    assert result.verdict == GateVerdict.UNMEASURED, result
    assert "the runbook gives no trainer.tokens_per_step for this point" in result.note


def test_a_contract_trainer_that_leaves_tokens_per_s_empty_is_still_malformed(tmp_path):
    """Only an adapter's word makes an empty rate column UNMEASURED: a trainer's own training.csv
    without a rate is broken."""
    (tmp_path / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                           "1,5.0,0.001,nan,0.1,1.0,nan,nan\n")
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 1}))
    found = contract.read(tmp_path)
    assert any(i.field == "toks_per_s" and i.presence == contract.Presence.MALFORMED for i in found.items)


def test_a_nan_loss_is_kept_as_nan(tmp_path):
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3], losses={3: math.nan}, summary=3)
    _convert(trainer, tmp_path / "run", tokens=None)
    df = read_training_csv(tmp_path / "run")
    assert math.isnan(df["loss"].iloc[-1]) and df["loss"].iloc[0] == pytest.approx(4.9)


def test_a_loss_the_trainers_nan_filter_logged_as_0_beside_a_nan_grad_norm_is_read_as_nan(tmp_path):
    """By default the Trainer logs a non-finite step's loss as the mean of its window's finite
    ones, 0 for a window of that step alone, and keeps the gradient norm: a run whose loss went
    NaN from step 3 was GO. A loss of 0 beside a finite gradient norm stays 0."""
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3, 4, 5], losses={3: 0.0, 4: 0.0, 5: 0.0}, summary=5)
    state = json.loads((trainer / "trainer_state.json").read_text())
    for entry in state["log_history"]:
        if entry["step"] in (3, 4):
            entry["grad_norm"] = math.nan
    (trainer / "trainer_state.json").write_text(json.dumps(state))
    _convert(trainer, tmp_path / "run", tokens=None)
    df = read_training_csv(tmp_path / "run")
    assert [math.isnan(v) for v in df["loss"]] == [False, False, True, True, False]
    assert df["loss"].iloc[-1] == 0.0
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["adapter"]["filtered_nonfinite_loss"].startswith("steps 3, 4: logged with loss 0")
    # and the report says it beside what was read: the Trainer's own console and state say loss 0 there
    from validation.judge.record import PhaseRecord, PointKey, Status
    from validation.report.build import adapter_reads

    rec = PhaseRecord(key=PointKey("rb", "cpu", "hf"), test_id="rb/cpu/hf/default", kind="train", status=Status.FAIL,
                      reason="", exit_code=0, steps=5, out_dir="run")
    [line] = adapter_reads([rec], tmp_path)
    assert "; NON-FINITE LOSS: steps 3, 4: logged with loss 0 and a non-finite grad_norm" in line, line


def test_check_artifacts_reads_an_output_folder_through_the_adapter(tmp_path, capsys):
    trainer = tmp_path / "out"
    _state(trainer, [1, 2], summary=2)
    assert main(["check-artifacts", str(trainer), "--adapter", "hf_trainer"]) == 0
    said = capsys.readouterr().out
    assert "(through adapter hf_trainer)" in said and "training.csv" in said


@needs_tb
def test_the_stall_watch_sees_the_output_folder_grow(tmp_path):
    trainer = tmp_path / "trainer_out"
    trainer.mkdir()
    watch = StepWatch(trainer, trainer / "training.csv", live_steps=HF.live_steps(trainer))
    assert not watch.look() and watch.highest is None
    _events(trainer, {1: 1.0, 2: 2.0}, start=0.5)
    assert watch.look() and watch.highest == 2
    assert not watch.look()  # nothing new
    (trainer / "checkpoint-5").mkdir()
    assert watch.look() and watch.highest == 5


def test_the_runbook_gives_global_tokens_per_step_from_its_factors(tmp_path):
    from validation.errors import RunbookError
    from validation.launch.foreign import tokens_per_step
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand

    rb = load_runbook(Path(__file__).resolve().parents[3] / "runbooks" / "hf_trainer_cpu.yaml")
    assert rb.trainer.adapter == "hf_trainer" and rb.trainer.tokens_per_step == ("train.batch_size", "train.block_size")
    points = {p.phase.name: p for p in expand(rb, load_profile("cpu"))}
    assert tokens_per_step(points["single_process"], rb.trainer) == 4 * 64
    assert tokens_per_step(points["ddp"], rb.trainer) == 2 * 4 * 64  # both ranks' tokens

    import yaml
    data = yaml.safe_load(rb.path.read_text())
    data["trainer"]["root"] = "examples/hf_trainer"
    data["trainer"]["tokens_per_step"] = ["train.batch_size", "train.seq_len"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(RunbookError, match=r"trainer.tokens_per_step\[1\].*'train.seq_len': expected a key of trainer.params"):
        load_runbook(bad)


def test_a_run_logged_every_5_steps_of_12_is_said_to_have_ended_at_its_summarys_step(tmp_path):
    """logging_steps 5 of max_steps 12: the logs hold steps 5 and 10 and the summary train() logs as
    it returns says 12. The verdict read 'stopped after step 10 of 12', a run that stopped early; it
    says training.csv ends at step 10 while the Trainer reached step 12, and the gates judge."""
    from validation.judge.evidence import collect, read_train
    from validation.judge.metrics import RunData
    from validation.judge.record import PhaseRecord, PointKey, Status, Summary
    from validation.judge.verdict import Outcome, process_verdict

    _state(tmp_path / "trainer_out", [5, 10], summary=12)
    _convert(tmp_path / "trainer_out", tmp_path / "run")
    run = RunData(tmp_path / "run", exit_code=0, steps_requested=12)
    run = read_train(run).onto(run)
    outcome = Outcome.of_run("train", run, [])
    assert process_verdict(outcome) is None and not outcome.stopped_short, process_verdict(outcome)
    assert outcome.csv_behind == "training.csv ends at step 10 while the trainer reached step 12 (its own summary)"
    ev = collect(run, tmp_path / "run" / "trainer.stderr.log", [])
    assert ev.summary_step == 12 and not ev.last_heartbeat, ev
    rec = PhaseRecord(key=PointKey("rb", "cpu", "hf"), test_id="rb/cpu/hf/default", kind="train", status=Status.FAIL,
                      reason="", exit_code=0, steps=12, evidence=ev, metrics=Summary(steps_completed=10))
    rec = PhaseRecord.from_json(rec.to_json(), "the store")  # the stored record keeps the summary step
    assert Outcome.of_record(rec).csv_behind == outcome.csv_behind
    # a run whose summary says it ended early is a short run, and its summary says where
    _state(tmp_path / "short", [5], summary=7)
    _convert(tmp_path / "short", tmp_path / "run2")
    short = RunData(tmp_path / "run2", exit_code=0, steps_requested=12)
    short = read_train(short).onto(short)
    # a Trainer writes no .HALT: its short run is not said to have written none
    assert process_verdict(Outcome.of_run("train", short, [])) == (
        Status.FAIL, "stopped after step 5 (training.csv; its own summary reached step 7) of 12, exit 0")
    ev = collect(short, tmp_path / "run2" / "trainer.stderr.log", [])
    stored = PhaseRecord(key=PointKey("rb", "cpu", "hf"), test_id="rb/cpu/hf/default", kind="train",
                         status=Status.FAIL, reason="", exit_code=0, steps=12, evidence=ev,
                         metrics=Summary(steps_completed=5))
    stored = PhaseRecord.from_json(stored.to_json(), "the store")  # the stored record knows it too
    assert Outcome.of_record(stored).short_text().endswith("of 12, exit 0"), Outcome.of_record(stored).short_text()


def test_a_folder_without_the_trainers_files_says_what_was_looked_for(tmp_path, capsys):
    """check-artifacts --adapter hf_trainer on an empty output folder said only 'training.csv: not
    written', naming a file the Trainer never writes."""
    (tmp_path / "out").mkdir()
    assert main(["check-artifacts", "--adapter", "hf_trainer", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert ("missing              training.csv: not written: its adapter (hf_trainer) found no trainer_state.json, "
            "checkpoint or TensorBoard events in the output folder") in out, out


@needs_tb
def test_a_run_resumed_from_a_checkpoint_holds_the_steps_it_trained(tmp_path, capsys):
    """A Trainer resumed from checkpoint-3 into a new output folder: its trainer_state.json's
    log_history holds steps 1-3 of the run it resumed from and its own 4-6, its events steps 4-6.
    The inherited rows were written with no step time (nan tokens/s: 'malformed' in the acceptance
    run, which gives tokens_per_step; check-artifacts, which does not, passed), and step 4 with none
    too. Its training.csv is the steps it trained, the first timed from the events' first record."""
    trainer = tmp_path / "trainer_out"
    _state(trainer, [1, 2, 3, 4, 5, 6], summary=6)
    _events(trainer, {4: 100.5, 5: 100.75, 6: 101.0}, start=100.0)
    found = _convert(trainer, tmp_path / "run", tokens=512)
    assert not found.problems(), found.problems()
    df = read_training_csv(tmp_path / "run")
    assert list(df["step"]) == [4, 5, 6]
    assert list(df["step_time_s"]) == pytest.approx([0.5, 0.25, 0.25])
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert contract.adapter_trained(env) == contract.TrainedSteps(
        4, 6, "its TensorBoard events", (str(next(trainer.rglob("events.out.tfevents.*"))),))
    assert env["adapter"]["inherited"].startswith("steps 1-3 of trainer_state.json's log_history")
    assert main(["check-artifacts", str(trainer), "--adapter", "hf_trainer"]) == 0


@needs_tb
@pytest.mark.parametrize("text, why", [("{\"global_step\": 3, \"log_history\": [{\"loss\": 4.9, \"st", "cut off or not JSON"),
                                       ("{\"log_history\": \"oops\"}", "not a Trainer's state (no log_history list)")])
def test_a_trainer_state_it_cannot_read_is_said_not_listed_as_read(tmp_path, capsys, text, why):
    """A trainer_state.json cut off mid-write, beside events of every step: the rows came from the
    events, but env.json's adapter.read (the report's 'read through its adapter' line) listed the
    file as read for its log_history, and check-artifacts said nothing of it."""
    trainer = tmp_path / "trainer_out"
    _events(trainer, {1: 10.5, 2: 11.0, 3: 11.5}, start=10.0)
    (trainer / "trainer_state.json").write_text(text)
    found = _convert(trainer, tmp_path / "run")
    assert not found.problems(), found.problems()
    assert list(read_training_csv(tmp_path / "run")["step"]) == [1, 2, 3]
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert "trainer_state.json" not in env["adapter"]["read"]
    said = contract.adapter_unreadable(env)["trainer_state.json"]
    assert said.startswith(why) and said.endswith("no log_history read from it; the rows are the TensorBoard events' alone")
    assert main(["check-artifacts", str(trainer), "--adapter", "hf_trainer"]) == 0
    assert f"  warning: trainer_state.json: {why}" in capsys.readouterr().out
    # the report's line says it beside what was read
    from validation.judge.record import PhaseRecord, PointKey, Status
    from validation.report.build import adapter_reads

    rec = PhaseRecord(key=PointKey("rb", "cpu", "hf"), test_id="rb/cpu/hf/default", kind="train", status=Status.PASS,
                      reason="", exit_code=0, steps=3, out_dir="run")
    [line] = adapter_reads([rec], tmp_path)
    assert f"; UNREADABLE: `trainer_state.json` ({why}" in line and "read `runs/" in line, line


def test_check_artifacts_says_why_a_column_has_no_value_in_any_row(tmp_path, capsys):
    """An output folder without TensorBoard events (no --report_to tensorboard): check-artifacts said
    'step_time_s: no value in any row', not the adapter's reason, which names the flag to add."""
    _state(tmp_path / "out", [1, 2, 3], summary=3)
    assert main(["check-artifacts", str(tmp_path / "out"), "--adapter", "hf_trainer", "--tokens-per-step", "4x64"]) == 0
    out = capsys.readouterr().out
    assert ("training.csv step_time_s: no value in any row: no TensorBoard events (report_to tensorboard): no time "
            "per logged step (the metrics that read this field are UNMEASURED)") in out, out
    assert "training.csv mem_alloc_gb: no value in any row: a Trainer logs no memory" in out, out
