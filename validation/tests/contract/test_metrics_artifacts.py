"""Metric extraction (pandas, windows), gate comparison by table, artifact readers, stack-dump
parsing, and the subprocess runner's argv and timeout."""
from __future__ import annotations

import json
import re
import sys
import time

import pytest

from nsa.contract import CSV_COLUMNS
from validation.contract.check import read as read_contract
from validation.contract.files import read_heartbeats, read_training_csv, torn_last_row
from validation.contract.stacks import Frame, main_thread_frames, parse_faulthandler
from validation.contract.torchrun_log import RankFailure
from validation.errors import ArtifactError
from validation.judge.gates import OPS, GateVerdict, check
from validation.judge.metrics import METRICS, RunData, compute
from validation.launch import commands
from validation.launch import process as runner


def _csv(tmp_path, rows, header=",".join(CSV_COLUMNS)):
    (tmp_path / "training.csv").write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return read_training_csv(tmp_path)


def _row(step, toks, mem=1.0, loss=2.0):
    return [step, loss, 1e-4, toks, 0.5, 1.0, mem / 2, mem]


def test_window_last_n_steps_mean_and_pstdev(tmp_path):
    df = _csv(tmp_path, [_row(s, 10.0 if s <= 50 else 100.0 + (s % 2) * 2) for s in range(1, 101)])
    run = RunData(tmp_path, csv=df)
    assert compute("toks_per_s_mean", run, 50) == pytest.approx(101.0)
    assert compute("toks_per_s_stdev", run, 50) == pytest.approx(1.0)  # population stdev, like the runbook
    assert compute("toks_per_s_mean", run, None) == pytest.approx(55.5)
    assert compute("toks_per_s_mean", run, 100) == pytest.approx(55.5)  # steps 1..100 cover 'last 100 steps'
    assert compute("toks_per_s_mean", run, 101) is None  # ... not 'last 101 steps': no made-up window


def test_memory_plateau_and_loss_finite(tmp_path):
    df = _csv(tmp_path, [_row(s, 100, mem=1.0 + 0.1 * s, loss="nan" if s == 3 else 2.0) for s in range(1, 11)])
    run = RunData(tmp_path, csv=df)
    assert compute("mem_growth_gb", run, 5) == pytest.approx(0.4)
    assert compute("loss_finite", run, None) == 0.0


def test_loss_finite_reads_a_ranks_exit_code_for_a_nonfinite_loss(tmp_path):
    # a trainer that stops on a NaN with the contract's exit 4 and no .HALT, logging finite losses
    # only: as one process loss_finite was 0, under torchrun (whose own exit is 1, the rank's 4 in
    # its log) it was 1, a PASS of the gate for the same stop
    df = _csv(tmp_path, [_row(s, 100) for s in range(1, 4)])
    assert compute("loss_finite", RunData(tmp_path, csv=df, exit_code=4), None) == 0.0
    torchrun = RunData(tmp_path, csv=df, exit_code=1, world_size=2,
                       rank_failures={0: RankFailure(signal="SIGTERM", exit_code=-15), 1: RankFailure(exit_code=4)})
    assert compute("loss_finite", torchrun, None) == 0.0
    crashed = RunData(tmp_path, csv=df, exit_code=1, world_size=2, rank_failures={1: RankFailure(exit_code=1)})
    assert compute("loss_finite", crashed, None) == 1.0  # another exit code says nothing of the loss


def test_a_csv_step_that_goes_back_begins_a_rerun(tmp_path):
    # a row of step 1 after step 2 is a process that resumed in place from the start: it supersedes
    # the earlier process's step 2 (validation/tests/contract/test_reruns.py), it is not sorted in before it
    df = _csv(tmp_path, [_row(2, 20), _row(1, 10)])
    assert df["step"].tolist() == [1] and df["toks_per_s"].tolist() == [10]


@pytest.mark.parametrize("content, words", [
    ("", "empty file"),
    (",".join(CSV_COLUMNS) + "\n", "header only"),
    ("step,loss\n1,2\n", "header is step,loss"),
    (",".join(CSV_COLUMNS) + "\n1,2,3,four,5,6,7,8\n", "line 2 (step 1), column toks_per_s: 'four' is not a number"),
    (",".join(CSV_COLUMNS) + '\n1,2,3,"4\n', "not a readable CSV"),
    # a step that is no optimizer step crashed the reader (pandas' int cast) and with it the whole run
    (",".join(CSV_COLUMNS) + "\n1,2,3,4,5,6,7,8\nnan,2,3,4,5,6,7,8\n", "line 3, column step: 'nan' is not a step (an integer from 1)"),
    (",".join(CSV_COLUMNS) + "\n1.5,2,3,4,5,6,7,8\n", "line 2, column step: '1.5' is not a step (an integer from 1)"),
    (",".join(CSV_COLUMNS) + "\n0,2,3,4,5,6,7,8\n", "line 2, column step: '0' is not a step (an integer from 1)"),
    # tokens/s, times, norms and memory cannot be negative: a mean over such rows is no measurement
    (",".join(CSV_COLUMNS) + "\n1,2,3,4,5,6,7,8\n2,2,3,-4,5,6,7,8\n", "line 3 (step 2), column toks_per_s: '-4' is negative"),
    (",".join(CSV_COLUMNS) + "\n1,2,3,4,5,6,-inf,8\n", "line 2 (step 1), column mem_alloc_gb: '-inf' is negative"),
    # a row short of a field was read with the missing one as '': "column mem_reserved_gb: '' is not
    # a number" of a value the row never had; one with a field too many, "Error tokenizing data. C
    # error: Expected 8 fields in line 3, saw 9" from pandas
    (",".join(CSV_COLUMNS) + "\n1,2,3,4,5,6,7,8\n2,2,3,4,5,6,7\n", "line 3 (step 2): 7 of 8 fields"),
    (",".join(CSV_COLUMNS) + "\n1,2,3,4,5,6,7,8\n2,2,3,4,5,6,7,8,9\n", "line 3 (step 2): 9 of 8 fields"),
    # lines after a blank one were numbered a line too early (pandas skips blank lines and counts rows)
    (",".join(CSV_COLUMNS) + "\n\n1,2,3,four,5,6,7,8\n", "line 3 (step 1), column toks_per_s: 'four' is not a number"),
])
def test_bad_csv_is_named(tmp_path, content, words):
    (tmp_path / "training.csv").write_text(content)
    with pytest.raises(ArtifactError, match=re.escape(words)):
        read_training_csv(tmp_path)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_tokens_per_s_that_is_not_finite_in_any_row_breaks_the_contract(tmp_path, bad):
    """user13: a trainer that logged nan tokens/s at step 2 (outside the gate's window) was GO, and
    check-artifacts said OK; one that logged it inside the window crashed the harness
    (statistics.pstdev of a nan). Every logged step's tokens/s is a finite number."""
    _csv(tmp_path, [_row(s, bad if s == 2 else 100.0) for s in range(1, 9)])
    found = read_contract(tmp_path)
    [item] = [i for i in found.items if i.field == "toks_per_s"]
    assert item.problem and item.detail.startswith(f"step 2 holds {bad} (1 of 8 rows)"), item.line()


def test_the_stdev_of_a_window_with_a_nan_is_no_value_not_a_crash(tmp_path):
    df = _csv(tmp_path, [_row(s, "nan" if s == 7 else 100.0) for s in range(1, 9)])
    assert compute("toks_per_s_stdev", RunData(tmp_path, csv=df), 4) is None


def test_gates_use_the_operator_table_only():
    assert set(OPS) == {">=", ">", "<=", "<", "==", "!="}
    assert check(39.0, ">=", 39.0) == GateVerdict.PASS and check(38.9, ">=", 39.0) == GateVerdict.FAIL
    assert check(None, ">=", 39.0) == GateVerdict.NO_DATA and check(50.0, ">=", None) == GateVerdict.UNMEASURED
    with pytest.raises(KeyError):
        check(1.0, "__import__('os').system('id')", 0.0)


def test_every_metric_returns_none_not_a_guess_without_data(tmp_path):
    run = RunData(tmp_path)
    for name in METRICS:
        if name not in ("timed_out", "halt"):
            assert compute(name, run, None) is None, name


def test_a_csv_row_cut_off_mid_write_is_not_read_and_the_check_says_so(tmp_path):
    """A trainer killed while writing its last row leaves a row without a line end whose last
    value may be cut short ('0.3125' as '0.31', still a number): it is not read, and
    check-artifacts names it (before, the cut value was taken as the step's)."""
    rows = ["1,2.5,0.001,1000,0.5,0.3125,1.0,2.0", "2,2.4,0.001,1000,0.5,0.3125,1.0,2.0"]
    path = tmp_path / "training.csv"
    path.write_text(",".join(CSV_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    assert torn_last_row(path) is None and read_training_csv(tmp_path)["grad_norm"].tolist() == [0.3125, 0.3125]
    path.write_bytes(path.read_bytes()[:-3])  # '...,0.3125,1.0,2.0\n' cut to '...,0.3125,1.0,2'
    assert torn_last_row(path) == "2,2.4,0.001,1000,0.5,0.3125,1.0,2"
    assert read_training_csv(tmp_path)["step"].tolist() == [1]
    (item,) = [i for i in read_contract(tmp_path).items if i.file == "training.csv"]
    assert item.detail == ("1 rows, steps 1..1; the last row has no line end (cut off mid-write), not read: "
                           "'2,2.4,0.001,1000,0.5,0.3125,1.0,2'")


def test_heartbeats_skip_torn_last_line_but_not_middle(tmp_path):
    good = json.dumps({"time": 1.0, "rank": 0, "step": 1})
    (tmp_path / "heartbeat_rank0.jsonl").write_text(good + "\n" + '{"time": 2.0, "ra')
    assert read_heartbeats(tmp_path) == {0: [{"time": 1.0, "rank": 0, "step": 1}]}
    (tmp_path / "heartbeat_rank1.jsonl").write_text("garbage\n" + good + "\n")
    with pytest.raises(ArtifactError, match=r"heartbeat_rank1\.jsonl: line 1 is not JSON"):
        read_heartbeats(tmp_path)


def test_a_broken_heartbeat_line_names_the_rank_whose_file_it_is(tmp_path):
    # the contract item of every rank's heartbeats is one (heartbeat_rank{R}.jsonl): its problem
    # named only that pattern, so a run of two ranks read 'heartbeat_rank{R}.jsonl: malformed (line
    # 14 is not JSON)' and left the user to open both files to find which rank's writer broke
    good = json.dumps({"time": 1.0, "rank": 1, "step": 1})
    (tmp_path / "heartbeat_rank0.jsonl").write_text(json.dumps({"time": 1.0, "rank": 0, "step": 1}) + "\n")
    (tmp_path / "heartbeat_rank1.jsonl").write_text(good + "\nnot json\n" + good + "\n")
    (problem,) = [p for p in read_contract(tmp_path).problems() if "malformed" in p]
    assert problem == f"{tmp_path}/heartbeat_rank1.jsonl: malformed (line 2 is not JSON)", problem


DUMP = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/w/nsa/train/watchdog.py", line 70 in _run

Current thread 0x00007f02 (most recent call first):
  File "/w/torch/autograd/graph.py", line 825 in _engine_run_backward
  File "/w/nsa/train/loop.py", line 91 in train_step
  File "<frozen runpy>", line 88 in _run_code
  File "/w/nsa/train/__main__.py", line 5 in <module>
"""


def test_stackdump_main_thread_is_the_training_loop():
    threads = parse_faulthandler(DUMP)
    assert len(threads) == 2 and threads[1].current
    frames = main_thread_frames(threads)
    assert frames[0].func == "_engine_run_backward" and frames[1] == Frame("/w/nsa/train/loop.py", 91, "train_step")


def test_torchrun_argv_is_a_list_with_standalone_and_nproc():
    argv = commands.torchrun_argv("nsa.train", 2, ["--override", "train.seq_len=64 model.n_layers=2"])
    assert argv[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert "--nproc_per_node=2" in argv and argv[-1] == "train.seq_len=64 model.n_layers=2"
    multi = commands.torchrun_argv("nsa.train", 8, [], ["--nnodes=2", "--rdzv-endpoint=host:29400"])
    assert "--standalone" not in multi and "--nnodes=2" in multi


def test_a_trainer_flag_that_abbreviates_a_torchrun_option_reaches_the_trainer(tmp_path):
    """A user's pass: a trainer taking --nproc failed under the torchrun launcher with torchrun's
    'ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node' (exit 2, before the
    trainer started). '--' ends torchrun's options, for a script and a module alike."""
    import subprocess

    script = tmp_path / "show_args.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    for target in ([str(script)], "show_args"):
        argv = commands.torchrun_argv(target, 1, ["--nproc", "2", "--log", "x"])
        run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-1000:]
        assert "['--nproc', '2', '--log', 'x']" in run.stdout, run.stdout


def test_child_env_drops_inherited_nsa_vars(monkeypatch):
    monkeypatch.setenv("NSA_FAULT", "crash")
    env = commands.child_env({"NSA_NVTX": "1"})
    assert "NSA_FAULT" not in env and env["NSA_NVTX"] == "1"


def test_run_timeout_kills_and_reports(tmp_path):
    start = time.monotonic()
    res = runner.run([sys.executable, "-c", "import time; time.sleep(60)"], env=commands.child_env({}), cwd=tmp_path,
                     timeout_s=1, log_dir=tmp_path)
    assert res.timed_out and res.exit_code is None and time.monotonic() - start < 10
    assert "killed after 1s timeout" in res.stderr_tail()


def test_missing_executable_is_exit_127(tmp_path):
    res = runner.run(["/nonexistent/binary"], env={}, cwd=tmp_path, timeout_s=5, log_dir=tmp_path)
    assert res.exit_code == 127 and "cannot start" in res.stderr_tail()


@pytest.mark.parametrize("world,scale,flagged", [(2, 0.5, True), (1, 2.0, True), (2, 1.0, False), (2, 1.2, False)])
def test_a_tokens_per_s_that_is_not_the_global_rate_breaks_the_contract(tmp_path, world, scale, flagged):
    """user13: my two-rank trainer logged one rank's tokens/s (half the global rate) and was GO,
    check-artifacts OK. env.json's tokens_per_step (global tokens a step) over step_time_s is the
    global rate; a toks_per_s off by more than RATE_FACTOR is malformed."""
    _csv(tmp_path, [[s, 2.0, 1e-4, scale * 1000 / 0.5, 0.5, 1.0, 0.5, 1.0] for s in range(1, 9)])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": world, "tokens_per_step": 1000}))
    items = [i for i in read_contract(tmp_path).items if i.field == "toks_per_s"]
    assert bool(items) == flagged, [i.line() for i in items]
    if flagged:
        assert items[0].problem and items[0].detail.startswith(
            f"toks_per_s x step_time_s is {scale:g}x env.json's tokens_per_step 1000 (the median over 8 rows)")
        assert ("it reads as one rank's rate" in items[0].detail) == (world == 2)
