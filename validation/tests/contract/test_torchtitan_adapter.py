"""The torchtitan adapter on what torchtitan itself wrote: output recorded from torchtitan 0.2.2 on
one H200 (validation/tests/evidence/torchtitan_*, bench/gpu/torchtitan_evidence.sh), and the
metrics lines of 0.3.x and of the older format fla's flame pins, written by their own format
strings (torchtitan/components/metrics.py ``MetricsProcessor.log``; flame/train.py)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from nsa.contract import HALT, TRAINING_CSV
from validation import REPO_ROOT
from validation.cli import main
from validation.judge import check_command
from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.adapters.tfevents import read_scalars
from validation.contract.files import read_training_log
from validation.contract.check import adapter_restarts
from validation.contract.reruns import Rerun, Restart
from validation.launch.kinds import _poll
from validation.launch.watch import StepWatch

EVIDENCE = Path(__file__).parents[1] / "evidence"
ADAPTER = ADAPTERS["torchtitan"]


def _convert(tmp_path: Path, case: str, world: int = 1) -> Path:
    """The recorded case as the harness holds it after a run: its stdout captured beside the
    dump folder, then converted into the run directory."""
    src = EVIDENCE / f"torchtitan_{case}"
    run = tmp_path / case
    shutil.copytree(src / "torchtitan", ADAPTER.trainer_dir(run))
    shutil.copy(src / "stdout.log", run / "trainer.stdout.log")
    ADAPTER.convert(ADAPTER.trainer_dir(run), run, RunFacts(world, "torchtitan"))
    return run


def _csv(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / TRAINING_CSV)


def test_the_loss_is_tensorboards_full_precision_and_agrees_with_the_log(tmp_path):
    run = _convert(tmp_path, "go")
    csv = _csv(run)
    assert list(csv["step"]) == list(range(1, 31))
    (events,) = sorted((EVIDENCE / "torchtitan_go").rglob("events.out.tfevents.*"))
    tb = {s.step: s.value for s in read_scalars(events) if s.tag == "loss_metrics/global_avg_loss"}
    assert len(tb) == 30 and list(csv["loss"]) == [tb[s] for s in range(1, 31)]
    # the log prints 5 decimals: the same numbers, rounded
    logged = [line for line in (run / "trainer.stdout.log").read_text().splitlines() if "step: 30" in line]
    assert f"{tb[30]:8.5f}" in logged[0]
    assert (csv["mem_alloc_gb"] > 0).all() and (csv["lr"] > 0).all() and (csv["grad_norm"] > 0).all()


def test_tokens_per_second_are_global_from_the_world_size(tmp_path):
    one, two = _csv(_convert(tmp_path / "a", "go", world=1)), _csv(_convert(tmp_path / "b", "go", world=2))
    assert (two["toks_per_s"] == 2 * one["toks_per_s"]).all()
    env = json.loads((tmp_path / "b" / "go" / "env.json").read_text())
    assert env["world_size"] == 2 and env["tokens_per_step"] == 8 * 2048


def test_the_converted_run_holds_to_the_contract_and_says_what_was_read(tmp_path, capsys):
    run = _convert(tmp_path, "go")
    env = json.loads((run / "env.json").read_text())
    read = env["adapter"]["read"]
    assert read["log"] == ["trainer.stdout.log"] and len(read["tensorboard"]) == 1 and read["comm_traces"] == []
    assert env["device_mem_gb"] == pytest.approx(139.8)
    beats = [json.loads(line) for line in (run / "heartbeat_rank0.jsonl").read_text().splitlines()]
    assert [b["step"] for b in beats] == list(range(1, 31)) and {b["stage"] for b in beats} == {"step"}
    # by hand: the dump folder with its log kept beside it (``| tee .../train.log``)
    folder = tmp_path / "byhand"
    shutil.copytree(EVIDENCE / "torchtitan_go" / "torchtitan", folder)
    shutil.copy(EVIDENCE / "torchtitan_go" / "stdout.log", folder / "train.log")
    assert check_command.check(folder, "torchtitan") == 0
    assert "through adapter torchtitan" in capsys.readouterr().out


def test_a_log_beside_the_run_with_no_line_of_its_own_is_no_run_of_its_own(tmp_path, capsys):
    """The dump folder with stdout and stderr kept apart (``> train.log 2> train.err.log``), the
    second empty or holding only a traceback, as torchtitan's stderr often is: written last, it was
    taken for a later run by its modification time, and env.json's adapter.restarts named a restart
    ("attempt 2 began at a step its log does not say ... and logged no step") of a run that had none.
    A log with no timestamped line of its own belongs to the run it was written beside."""
    folder = tmp_path / "byhand"
    shutil.copytree(EVIDENCE / "torchtitan_go" / "torchtitan", folder)
    shutil.copy(EVIDENCE / "torchtitan_go" / "stdout.log", folder / "train.log")
    for name, text in (("train.zerr.log", ""), ("train.aerr.log", "Traceback (most recent call last):\n  File "
                                                                 "\"x.py\", line 1, in <module>\nOSError: disk\n")):
        (folder / name).write_text(text)
        run = tmp_path / f"run_{name}"
        ADAPTER.convert(folder, run, RunFacts(1, "torchtitan"))
        adapter = json.loads((run / "env.json").read_text())["adapter"]
        assert "restarts" not in adapter, adapter
        assert name in adapter["read"]["log"] and list(read_training_log(run).rows["step"]) == list(range(1, 31))
    assert check_command.check(folder, "torchtitan") == 0
    assert "restart" not in capsys.readouterr().out


def test_a_folder_without_torchtitans_files_says_what_was_looked_for(tmp_path, capsys):
    """check-artifacts --adapter torchtitan on a folder holding none of its files (a wrong path): it
    said 'training.csv: header only, no steps logged' of a CSV the adapter had made up."""
    (tmp_path / "empty").mkdir()
    assert check_command.check(tmp_path / "empty", "torchtitan") == 1
    out = capsys.readouterr().out
    assert ("missing              training.csv: not written: its adapter (torchtitan) found no torchtitan log (its "
            "stdout, or *.log files), TensorBoard events or structured logs in the folder") in out, out
    assert "header only" not in out, out


def test_faults_as_torchtitan_wrote_them(tmp_path):
    nan = _csv(_convert(tmp_path, "nan"))
    assert math.isfinite(nan["loss"].iloc[0]) and nan["loss"].isna().iloc[-1] and len(nan) == 20
    assert _csv(_convert(tmp_path, "kill"))["step"].max() == 6
    hang = _convert(tmp_path, "hang")
    assert _csv(hang)["step"].max() == 8
    # the flight recorder's dump is copied into the run directory by rank, and named
    assert (hang / "comm_trace_rank0").read_bytes() == (EVIDENCE / "torchtitan_hang/torchtitan/comm_traces/rank_0").read_bytes()
    assert json.loads((hang / "env.json").read_text())["adapter"]["read"]["comm_traces"] == ["comm_trace_rank0"]


#: torchtitan 0.3.x's metrics line and its non-finite loss error, by its format strings (colour on)
_V03 = ("[titan] 2026-01-05 10:00:0{s},000 - root - INFO - \x1b[31mstep: {step:2}  \x1b[32mloss: {loss:8.5f}  "
        "\x1b[33mgrad_norm: {gn:7.4f}  \x1b[36mmemory: {mem:5.2f}GiB(1.00%)  \x1b[34mtps: {tps:,}  "
        "\x1b[36mtflops: 1.00  \x1b[35mmfu: N/A\x1b[39m")
#: the older format (fla's flame pins torchtitan 0b44d4c): no grad_norm there; flame's own line after it
_OLD = ("[titan] 2026-01-05 10:00:0{s},000 - root - INFO - step: {step:2}  loss: {loss:7.4f}  "
        "memory: {mem:5.2f}GiB(1.00%)  tps: {tps:,}  tflops: 1.00  mfu: 0.10%")
_FLAME = "[titan] 2026-01-05 10:00:0{s},100 - root - INFO - lr: {lr:.4e} gnorm: {gn:5.2f} [0:00:0{s}<0:01:00]"


def _run_of_log(tmp_path: Path, lines: list[str], world: int = 1) -> Path:
    run = tmp_path / "run"
    ADAPTER.trainer_dir(run).mkdir(parents=True)
    (run / "trainer.stdout.log").write_text("\n".join(lines) + "\n")
    ADAPTER.convert(ADAPTER.trainer_dir(run), run, RunFacts(world, "torchtitan"))
    return run


def test_v03_lines_a_second_rank_and_the_nonfinite_error_without_tensorboard(tmp_path):
    lines = []
    for step in (1, 2, 3):
        line = _V03.format(s=step, step=step, loss=9.0 - step, gn=1.5, mem=2.0, tps=1000 * step)
        lines += [line, line.replace("tps: ", "tps: 9")]  # rank 1's line of the same step comes second
    lines.append("RuntimeError: Loss is not finite (global_avg_loss=nan) at step 4. Stopping training.")
    run = _run_of_log(tmp_path, lines)
    csv = _csv(run)
    assert list(csv["step"]) == [1, 2, 3] and list(csv["toks_per_s"]) == [1000.0, 2000.0, 3000.0]
    assert list(csv["loss"]) == [8.0, 7.0, 6.0] and list(csv["grad_norm"]) == [1.5] * 3
    # without events: step time from the lines' timestamps, lr and allocated memory unmeasured
    assert csv["step_time_s"].iloc[1] == pytest.approx(1.0) and csv["lr"].isna().all() and csv["mem_alloc_gb"].isna().all()
    halt = json.loads((run / HALT).read_text())
    assert halt["source"] == "nonfinite" and halt["step"] == 4 and halt["losses"] == ["nan"]


def test_a_validation_between_logged_steps_is_not_their_step_time(tmp_path):
    """--validation.enable without TensorBoard: the step time from the lines' timestamps held the
    validation's time (step 3 at 3 s and step 7 at 1.33 s a step where training took 1 s, beside
    tps that torchtitan measures from the validation's end). As torchtitan's tps, a step after a
    validation is timed from the validation's line over the steps since it: one at a logged step
    (2), and one between two (5, of steps 4 and 7)."""
    def validate(s: int, step: int) -> str:
        return (f"[titan] 2026-01-05 10:00:0{s},000 - root - INFO - validate step: {step:2}  loss:  5.0000  "
                "memory:  2.00GiB(1.00%)  tps: 9,000")

    metrics = {step: _V03.format(s=t, step=step, loss=9.0 - step / 10, gn=1.5, mem=2.0, tps=1000)
               for step, t in ((1, 0), (2, 1), (3, 4), (4, 5), (7, 9))}
    lines = [metrics[1], metrics[2], validate(3, 2), metrics[3], metrics[4], validate(7, 5), metrics[7]]
    csv = _csv(_run_of_log(tmp_path, lines))
    assert list(csv["step"]) == [1, 2, 3, 4, 7]
    assert list(csv["step_time_s"].iloc[1:]) == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_the_older_format_with_flames_lr_line(tmp_path):
    lines = []
    for step in (1, 2):
        lines += [_OLD.format(s=step, step=step, loss=5.0 / step, mem=3.0, tps=2500),
                  _FLAME.format(s=step, lr=3e-4 * step, gn=0.5 * step)]
    csv = _csv(_run_of_log(tmp_path, lines, world=4))
    assert list(csv["lr"]) == pytest.approx([3e-4, 6e-4]) and list(csv["grad_norm"]) == [0.5, 1.0]
    assert list(csv["toks_per_s"]) == [10000.0, 10000.0] and list(csv["mem_reserved_gb"]) == [3.0, 3.0]


def test_structured_logs_are_every_ranks_heartbeats(tmp_path):
    run = tmp_path / "run"
    folder = ADAPTER.trainer_dir(run) / "structured_logs"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        recs = [{"rank": rank, "pid": 100 + rank, "host_name": "h", "step": step, "time_ms": 1000 * step + i,
                 "log_type_name": name}
                for step in (1, 2) for i, name in enumerate(("step_start", "fwd_bwd_start", "fwd_bwd_end", "step_end"))]
        (folder / f"training.global_rank_{rank}.20260105-100000-ABCDEF.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs))
    (run / "trainer.stdout.log").write_text(_V03.format(s=1, step=1, loss=2.0, gn=1.0, mem=1.0, tps=10) + "\n")
    ADAPTER.convert(ADAPTER.trainer_dir(run), run, RunFacts(1, "torchtitan"))
    beats = [json.loads(line) for line in (run / "heartbeat_rank1.jsonl").read_text().splitlines()]
    assert [b["stage"] for b in beats[:4]] == ["data", "forward", "forward", "step"]
    assert {b["pid"] for b in beats} == {101} and beats[-1]["time"] == pytest.approx(2.003)
    assert json.loads((run / "env.json").read_text())["world_size"] == 2  # the ranks the logs show


def test_the_progress_line_of_a_torchtitan_point_is_global_tokens_per_second(tmp_path):
    """The live line showed torchtitan's per-device tps (12,345 of two ranks) while the report showed
    the global figure (24,690)."""
    point = SimpleNamespace(test_id="tt/cpu/p/default", nproc=2,
                            phase=SimpleNamespace(steps=10, kind="train", stall_after_s=60.0))
    log = tmp_path / "trainer.stdout.log"
    log.write_text(_V03.format(s=1, step=7, loss=2.0, gn=1.0, mem=1.0, tps=12345) + "\n")
    lines: list[str] = []
    _poll(point, tmp_path, lines.append, log, ADAPTER)(1.0)
    assert lines == ["tt/cpu/p/default:     1s step 7/10, 24,690 tok/s (global)"]


def test_the_stall_watch_reads_progress_from_the_log(tmp_path):
    log = tmp_path / "trainer.stdout.log"
    log.write_text("[titan] starting\n")

    def step_of(line: str) -> int | None:
        seen = ADAPTER.progress(line)
        return seen[0] if seen else None

    watch = StepWatch(tmp_path, log, step_of)
    assert not watch.look()
    with open(log, "a") as fh:
        fh.write(_V03.format(s=1, step=7, loss=2.0, gn=1.0, mem=1.0, tps=12345) + "\n")
    assert watch.look() and watch.highest == 7
    assert ADAPTER.progress(_V03.format(s=1, step=7, loss=2.0, gn=1.0, mem=1.0, tps=12345)) == (7, 12345.0)
    # the live line says the global tokens/s training.csv and the report hold, not torchtitan's per device
    assert ADAPTER.progress(_V03.format(s=1, step=7, loss=2.0, gn=1.0, mem=1.0, tps=12345), world_size=2) == \
        (7, 24690.0)
    assert ADAPTER.progress("[titan] validate step:  7  loss: 2.0") is None


def _dump_folder_of_runs(folder: Path, runs: dict[str, tuple[int, range, int | None]]) -> None:
    """Logs kept in a dump folder by hand, one per run: name -> (minute it began, steps, step of
    its non-finite loss error); a step's loss is its minute plus its step, nan from that error's step."""
    folder.mkdir(parents=True)
    for name, (minute, steps, nan_at) in runs.items():
        lines = [_V03.format(s=0, step=step, loss=math.nan if nan_at and step >= nan_at else minute + step / 100,
                             gn=1.0, mem=1.0, tps=100).replace("10:00:00", f"10:{minute:02}:{step:02}")
                 for step in steps]
        if nan_at:
            lines.append(f"RuntimeError: Loss is not finite (global_avg_loss=nan) at step {nan_at}. Stopping training.")
        (folder / name).write_text("\n".join(lines) + "\n")


def test_a_later_runs_log_supersedes_the_steps_it_ran_again_and_the_earlier_runs_halt(tmp_path, capsys):
    """A dump folder with a crashed run's log and its resumed run's: the dead run's steps 11-14
    (NaN) were kept, step 15's time was the 10 minutes between the runs, and the dead run's
    non-finite .HALT stood. The file names sort against the order the runs were written in."""
    folder = tmp_path / "dump"
    _dump_folder_of_runs(folder, {"b_crashed.log": (10, range(1, 15), 12), "a_resumed.log": (20, range(11, 21), None)})
    run = tmp_path / "run"
    ADAPTER.convert(folder, run, RunFacts(1, "torchtitan"))
    log = read_training_log(run)
    assert list(log.rows["step"]) == list(range(1, 21)) and log.rows["loss"].notna().all()
    assert list(log.rows["loss"].iloc[10:12]) == [20.11, 20.12]  # the resumed run's
    assert [r.text() for r in log.reruns] == ["went back from step 14 to step 11 (4 earlier entries superseded)"]
    # no step time across the two runs: the resumed run's first step has none
    assert math.isnan(log.rows["step_time_s"].iloc[10]) and (log.rows["step_time_s"].iloc[11:] == 1.0).all()
    assert not (run / HALT).exists()
    assert json.loads((run / "env.json").read_text())["adapter"]["read"]["log"] == ["b_crashed.log", "a_resumed.log"]
    assert check_command.check(folder, "torchtitan") == 0
    assert "went back from step 14 to step 11" in capsys.readouterr().out


def test_a_later_runs_own_nonfinite_loss_stands_and_ranks_logs_of_one_run_are_one_run(tmp_path):
    folder = tmp_path / "dump"
    _dump_folder_of_runs(folder, {"crashed.log": (10, range(1, 15), 12), "resumed.log": (20, range(11, 21), 18),
                                  "resumed_rank1.log": (20, range(11, 19), 18)})
    run = tmp_path / "run"
    ADAPTER.convert(folder, run, RunFacts(1, "torchtitan"))
    assert json.loads((run / HALT).read_text())["step"] == 18
    # rank 1's log overlaps the resumed run's in time: its lines are that run's, not a third run
    log = read_training_log(run)
    assert len(log.reruns) == 1 and list(log.rows["step"]) == list(range(1, 21))


#: the recorded run to GO played back as the attempts of a run restarted by torchrun's --max-restarts
#: (tests/trainers/torchtitan_replay.py --attempts): what one stdout holds after the restart
REPLAY = REPO_ROOT / "tests" / "trainers" / "torchtitan_replay.py"
#: torchrun's agent after a failed attempt (its error line, as in torchtitan_kill/torchrun.stderr.log)
_AGENT_FAILED = ("E1201 22:16:0{i}.236000 483 torch/distributed/elastic/multiprocessing/api.py:986] failed "
                 "(exitcode: {code}) local_rank: 0 (pid: 70{i}) of binary: /opt/torch/.venv/bin/python3\n")


def _attempts(spec: str, dump: Path, out: Path, err: Path | None, only: int | None = None) -> None:
    """Every attempt of ``spec`` (``only``: that one) as torchrun runs them, appending to the same
    ``out`` and ``err`` (``err`` None: stderr into ``out``, ``2>&1``, as ``| tee train.log`` keeps it)."""
    for i in range(len(spec.split(","))) if only is None else [only]:
        with open(out, "a") as o, open(err or out, "a") as e:
            code = subprocess.run([sys.executable, str(REPLAY), "--evidence", "go", "--job.dump_folder", str(dump),
                                   "--line-s", "0", "--attempts", spec], stdout=o, stderr=e, timeout=60,
                                  env={**os.environ, "TORCHELASTIC_RESTART_COUNT": str(i), "RANK": "0"}).returncode
        if code:
            with open(err or out, "a") as e:
                e.write(_AGENT_FAILED.format(i=i, code=code))


def _three_ways(tmp_path: Path, spec: str) -> dict[str, Path]:
    """The restarted run converted as the harness reads it (stdout and stderr captured apart), as
    check-artifacts reads a dump folder with its one log (``2>&1 | tee train.log``), and as it reads
    one with a log per attempt (f0ea551); the run directory of each."""
    capture = tmp_path / "capture"
    ADAPTER.trainer_dir(capture).mkdir(parents=True)
    _attempts(spec, ADAPTER.trainer_dir(capture), capture / "trainer.stdout.log", capture / "trainer.stderr.log")
    ADAPTER.convert(ADAPTER.trainer_dir(capture), capture, RunFacts(1, "torchtitan"))
    runs = {"capture": capture}
    for name in ("one_log", "log_per_attempt"):
        folder = tmp_path / name
        folder.mkdir()
        for i in range(len(spec.split(","))):
            _attempts(spec, folder, folder / ("train.log" if name == "one_log" else f"attempt{i}.log"), None, only=i)
        runs[name] = tmp_path / f"{name}_run"
        ADAPTER.convert(folder, runs[name], RunFacts(1, "torchtitan"))
    return runs


def _go_losses() -> dict[int, float]:
    """The recorded run's loss by step, as its log prints it."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", (EVIDENCE / "torchtitan_go" / "stdout.log").read_text())
    return {int(m[1]): float(m[2]) for m in re.finditer(r"step:\s*(\d+)\s+loss:\s*([\d.]+)", text)}


@pytest.mark.parametrize("spec, steps, superseded, halt, restarted", [
    # non-finite at step 12 (the loss climbing from step 9), restarted from step 10's checkpoint: it
    # was read as the run (the climbing step 11 kept, the restarted step 11 dropped as another rank's,
    # and step 12's .HALT): NO-GO for a run that recovered and trained on to step 30
    ("1:nan@12,11:", range(1, 31), [Rerun(11, 11, 1)], None, range(11, 31)),
    # ... restarted with no checkpoint: it trained from step 1 again
    ("1:nan@12,1:", range(1, 31), [Rerun(1, 11, 11)], None, range(1, 31)),
    # killed at step 9, resumed at step 6, non-finite at step 15: the last attempt's, which stands
    ("1:kill@9,6:nan@15", range(1, 15), [Rerun(6, 8, 3)], 15, range(6, 12)),
    # the resumed attempt met the non-finite loss at step 12 again: it stands
    ("1:nan@12,11:nan@12", range(1, 12), [Rerun(11, 11, 1)], 12, ()),
    # ... or another at step 15: that stands (stderr's two errors, each placed by its step)
    ("1:nan@12,11:nan@15", range(1, 15), [Rerun(11, 11, 1)], 15, range(11, 12)),
])
def test_a_restart_in_one_stdout_is_read_as_a_dump_folders_log_per_attempt(tmp_path, spec, steps, superseded,
                                                                            halt, restarted):
    """torchrun --max-restarts restarts the workers into the same stdout: each attempt's lines from
    where torchtitan starts again ('Starting job', 'Training starts at step N') are a later run, read
    as a dump folder's later log is (f0ea551): the harness's capture (the non-finite error on stderr,
    apart from the steps), one log of both attempts and a log per attempt give the same training.csv
    and .HALT."""
    runs = _three_ways(tmp_path, spec)
    go = _go_losses()
    for way, run in runs.items():
        log = read_training_log(run)
        assert list(log.rows["step"]) == list(steps), way
        assert log.reruns == superseded, (way, log.reruns)
        assert log.rows["loss"].notna().all(), way
        # the later attempt's rows of the steps it trained again (the recorded losses), none across the restart
        assert [log.rows["loss"].iloc[s - 1] for s in restarted] == [go[s] for s in restarted], way
        first = int(spec.split(",")[-1].split(":")[0])
        if first in steps and first in restarted:
            assert math.isnan(log.rows["step_time_s"].iloc[first - 1]), way
        said = json.loads((run / HALT).read_text()) if (run / HALT).is_file() else None
        assert (said and said["step"]) == halt, (way, said)
        assert said is None or said["text"].endswith(f"Loss is not finite (global_avg_loss=nan) at step {halt}. "
                                                     "Stopping training."), said
    csv = {way: (run / TRAINING_CSV).read_text() for way, run in runs.items()}
    assert csv["capture"] == csv["one_log"] == csv["log_per_attempt"]
    assert json.loads((runs["capture"] / "env.json").read_text())["adapter"]["read"]["log"] == [
        "trainer.stdout.log", "trainer.stderr.log"]


def _checked_dump(tmp_path, spec: str, capsys) -> str:
    """check-artifacts' output of a dump folder holding the restarted run's one log (``2>&1 | tee
    train.log``), which it must find to hold the contract."""
    folder = tmp_path / "dump"
    folder.mkdir()
    _attempts(spec, folder, folder / "train.log", None)
    assert main(["check-artifacts", str(folder), "--adapter", "torchtitan"]) == 0
    return capsys.readouterr().out


def test_check_artifacts_reads_a_restart_in_one_log_as_a_resume_in_place(tmp_path, capsys):
    """The dump folder with the restarted run's one log (``2>&1 | tee train.log``), through the CLI."""
    out = _checked_dump(tmp_path, "1:nan@12,11:", capsys)
    assert ("steps 1..30; resumed in place: went back from step 11 to step 11 (1 earlier entry superseded), the "
            "later occurrence read") in out, out
    assert "nonfinite" not in out and ".HALT" not in out, out


@pytest.mark.parametrize("spec, steps, restart", [
    # non-finite at step 12, restarted from step 5's checkpoint and killed before it logged step 6:
    # steps 6-11 were undone by going back, so the run stands at step 5 (read as steps 1..11, and
    # no word of the restart, a run further on than it was)
    ("1:nan@12,6:kill@6", range(1, 6), Restart(2, 6, 11, None)),
    # killed after step 8, resumed at step 9: no step logged twice, so no rerun in training.csv
    ("1:kill@9,9:", range(1, 31), Restart(2, 9, 8, 30)),
])
def test_a_restart_that_logs_nothing_again_is_read_and_named(tmp_path, spec, steps, restart):
    """A restarted attempt that logged no step still went back to the step it began at, undoing the
    earlier attempt's rows from there; and every restart is named in env.json's adapter.restarts,
    where training.csv has no rerun to show it. The harness's capture, one log and a log per
    attempt alike."""
    for way, run in _three_ways(tmp_path, spec).items():
        log = read_training_log(run)
        assert list(log.rows["step"]) == list(steps), way
        assert adapter_restarts(json.loads((run / "env.json").read_text())) == [restart], way


def test_a_non_finite_loss_that_a_restart_went_back_before_is_no_halt_though_the_restart_logged_nothing(tmp_path):
    """Non-finite at step 12, restarted from step 6 and killed before it logged a step: the rows of
    steps 6-11 are undone and the run stands at step 5, and a .HALT of step 12 made the verdict
    'non-finite loss at step 12' of a run whose end was the restart's SIGKILL at step 6 (the
    harness's capture also gave the error to the restart: it began before step 12 and logged no
    step; torchrun's agent line per attempt says it was the first attempt's)."""
    for way, run in _three_ways(tmp_path, "1:nan@12,6:kill@6").items():
        assert list(read_training_log(run).rows["step"]) == list(range(1, 6)), way
        assert not (run / ".HALT").exists(), (way, (run / ".HALT").read_text())


def test_check_artifacts_names_a_restart_that_repeated_no_step(tmp_path, capsys):
    """The dump folder's one log of a run killed after step 8 and resumed at step 9 (``2>&1 | tee
    train.log``): check-artifacts names the restart though no step was logged twice."""
    out = _checked_dump(tmp_path, "1:kill@9,9:", capsys)
    assert ("env.json adapter.restarts: restarted into the same files: attempt 2 began at step 9 (attempt 1 had "
            "logged up to step 8) and logged up to step 30") in out, out
