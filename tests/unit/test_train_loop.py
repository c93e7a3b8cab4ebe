"""The trainer in one process (tiny model, CPU): outputs contract, learning, exact resume,
NaN halt, operator .HALT, clear errors."""
from __future__ import annotations

import csv
import json
import re
import math
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from nsa import contract
from nsa.train.cli import main, run
from nsa.config import ConfigError
from nsa.train.checkpoint import CheckpointError, find_resume
from nsa.train.faults import InjectedFault, parse_faults
from nsa.train.telemetry import CSV_HEADER

TINY = "model.n_layers=1 train.print_every=100"


def train(out: Path, extra: str = "", steps: int = 4, env: dict | None = None) -> int:
    return run("tiny", [f"{TINY} train.steps={steps} train.out_dir={out} {extra}"], env=env or {})


def csv_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "training.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def heartbeats(out: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (out / f"heartbeat_rank{rank}.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in heartbeats(out) if r["stage"] == "step"}


def test_outputs_contract_and_the_pattern_is_learned(tmp_path: Path):
    env = {"NSA_DDP_BUCKET_MB": "50", "NSA_PREFILL_BATCHED": "1", "NSA_SDPA_AUDIT": "1", "NCCL_PROTO": "Simple"}
    assert train(tmp_path, "train.grad_accum=2", steps=10, env=env) == 0
    header = (tmp_path / "training.csv").read_text().splitlines()[0]
    assert header == "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"
    assert header.split(",")[3] == "toks_per_s" and CSV_HEADER == header.split(",")
    rows = csv_rows(tmp_path)
    assert [int(r["step"]) for r in rows] == list(range(1, 11))
    losses = [float(r["loss"]) for r in rows]
    assert losses[-1] < 0.75 * losses[0], losses  # the pattern is learnable; random bytes are not
    # tokens/s is global: batch 2 x seq 64 x accum 2 x world 1 per step
    r = rows[-1]
    assert float(r["toks_per_s"]) == pytest.approx(256 / float(r["step_time_s"]), rel=1e-3)
    # on CPU the memory columns are the process's resident set (they were constant zeros, so the
    # memory-growth gate passed whatever happened)
    assert 0.01 < float(r["mem_reserved_gb"]) < 64 and float(r["mem_alloc_gb"]) == float(r["mem_reserved_gb"])

    hb = heartbeats(tmp_path)
    stages = [h["stage"] for h in hb if h.get("step") == 2]
    assert stages == ["data", "forward", "backward", "data", "forward", "backward", "optimizer", "step"]
    # a record's step means what the contract says of its stage: the step in progress in its stage
    # records, the step completed in its step record; a run that completed ends on the latter
    assert set(stages[:-1]) <= set(contract.HEARTBEAT_STAGES_IN_STEP)
    assert stages[-1] in contract.HEARTBEAT_STAGES_AFTER_STEP
    assert hb[-1]["step"] == 10 and hb[-1]["stage"] in contract.HEARTBEAT_STAGES_AFTER_STEP
    step = [h for h in hb if h["stage"] == "step"][-1]
    assert {"time", "rank", "step", "toks_per_s", "mem_alloc_gb", "gpu_util", "gates", "routes", "fallbacks"} <= set(step)
    # where the rank ran: one process is node 0 (torchrun's GROUP_RANK under torchrun), on this host
    assert all(h["node"] == 0 and h["host"] == socket.gethostname() for h in hb)
    assert set(step["gates"]) == {"cmp", "sel", "win"} and all(0 < g < 1 for g in step["gates"].values())

    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["status"] == "completed 10 steps" and envj["world_size"] == 1
    assert envj["contract_version"] == contract.VERSION
    assert envj["memory_source"] == "process resident set size (CPU run)"
    assert set(envj["attention_backends"]) >= {"cmp", "sel", "win"}
    assert all(b["backend"] and b["reason"] for b in envj["attention_backends"].values())
    assert envj["env"] == env and envj["config"]["dist"]["ddp_bucket_mb"] == 50
    assert "NSA_PREFILL_BATCHED" in envj["noop_toggles"]
    assert envj["torch"] and "git_sha" in envj and envj["fault_injection"] is None
    assert (tmp_path / "checkpoints" / "step_0000010.pt").exists()


def test_resume_continues_the_loss_curve_exactly(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    extra = "train.grad_accum=2 train.ckpt_every=2"
    assert train(a, extra, steps=6) == 0
    assert train(b, extra + " train.run_steps=3", steps=6) == 0  # stops (and saves) at step 3
    assert [int(r["step"]) for r in csv_rows(b)] == [1, 2, 3]
    assert train(b, extra + " train.resume=auto", steps=6) == 0
    timing = ("toks_per_s", "step_time_s", "mem_alloc_gb", "mem_reserved_gb")  # measured, not trained
    assert csv_rows(b) == [{**r, **{k: r2[k] for k in timing}} for r, r2 in zip(csv_rows(a), csv_rows(b))]
    assert step_losses(a) == step_losses(b)  # full float precision, steps 1..6
    assert json.loads((b / "env.json").read_text())["resumed_from"].endswith("step_0000003.pt")


def test_an_in_place_resume_drops_the_heartbeats_past_the_checkpoint_as_it_does_the_rows(tmp_path: Path):
    """A run that crashed in step 5 after a checkpoint at step 3, resumed into its own out_dir:
    training.csv was cut back to step 3, but the heartbeat file kept steps 4 and 5 of the crashed
    run, so the harness read step 4 twice and step 5's stages twice. A record torn mid-line by the
    crash is dropped too (appending after it would corrupt both lines)."""
    extra = "train.ckpt_every=3"
    with pytest.raises(InjectedFault):
        train(tmp_path, extra + " fault.spec=crash:step=5", steps=6)
    hb = tmp_path / "heartbeat_rank0.jsonl"
    with open(hb, "a") as fh:
        fh.write('{"time": 1, "step": 5, "sta')
    assert train(tmp_path, extra + " train.resume=auto", steps=6) == 0
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == [1, 2, 3, 4, 5, 6]
    records = heartbeats(tmp_path)
    assert [r["step"] for r in records if r["stage"] == "step"] == [1, 2, 3, 4, 5, 6]
    stages = [(r["step"], r["stage"]) for r in records]
    assert len(stages) == len(set(stages)), stages  # each stage of each step once
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)


def test_files_of_ranks_an_earlier_run_had_and_this_one_has_not_are_removed(tmp_path: Path):
    """A run of 2 ranks (torchrun) that stalled, then a run of 1 into the same out_dir: its
    heartbeat_rank1.jsonl and stackdump_rank1.txt stayed, and the contract check called the new
    run's files malformed (rank 1 does not exist at world_size 1); the earlier stall's
    stackdump_rank0.txt stayed beside a run that completed. Resumed, the rank-1 files go too."""
    def earlier_run_of_two_ranks():
        for name in ("heartbeat_rank1.jsonl", "stackdump_rank1.txt", "stackdump_rank0.txt", "stackdump_rank12.txt"):
            (tmp_path / name).write_text('{"time": 1, "step": 2}\n' if name.endswith(".jsonl") else
                                         "Thread 0x1 (most recent call first):\n")

    earlier_run_of_two_ranks()
    assert train(tmp_path, "train.run_steps=2", steps=4) == 0
    assert sorted(p.name for p in tmp_path.glob("*_rank*")) == ["heartbeat_rank0.jsonl"]
    earlier_run_of_two_ranks()
    assert train(tmp_path, "train.resume=auto", steps=4) == 0
    assert sorted(p.name for p in tmp_path.glob("*_rank*")) == ["heartbeat_rank0.jsonl", "stackdump_rank0.txt"]
    assert [r["step"] for r in heartbeats(tmp_path) if r["stage"] == "step"] == [1, 2, 3, 4]


def test_heartbeats_of_a_profiled_window_are_cut_by_step_not_at_the_first_later_step(tmp_path: Path):
    """A profiled window (train.profile_steps) runs steps 2..4 and logs them after: the records of
    steps 2 and 3 done, and step 3's checkpoint, follow step 4's stages. A resume from step 3 keeps
    them and drops step 4's and later, wherever they are in the file."""
    from nsa.train.telemetry import truncate_heartbeats

    order = [(1, "data"), (1, "step"), (2, "data"), (3, "data"), (4, "data"), (4, "profile"), (2, "step"),
             (3, "step"), (3, "checkpoint"), (4, "step"), (5, "data")]
    path = tmp_path / "heartbeat_rank0.jsonl"
    path.write_text("".join(json.dumps({"time": 1, "step": n, "stage": st}) + "\n" for n, st in order))
    truncate_heartbeats(path, 3)
    assert [(r["step"], r["stage"]) for r in heartbeats(tmp_path)] == [r for r in order if r[0] <= 3]


def test_a_run_without_heartbeats_leaves_none_of_an_earlier_runs_past_its_start(tmp_path: Path):
    """telemetry.heartbeat=false over an out_dir with an earlier run's heartbeat file kept that file
    whole: the harness read the earlier run's records (its last step, its pid) as this run's."""
    assert train(tmp_path, "train.run_steps=2", steps=4) == 0
    heartbeat = tmp_path / "heartbeat_rank0.jsonl"
    with open(heartbeat, "a") as fh:  # as if the earlier run had gone on past its checkpoint
        fh.write(json.dumps({"time": 1, "step": 3, "stage": "step"}) + "\n")
    assert train(tmp_path, "train.resume=auto telemetry.heartbeat=false", steps=4) == 0
    assert [r["step"] for r in heartbeats(tmp_path) if r["stage"] == "step"] == [1, 2]
    assert train(tmp_path, "telemetry.heartbeat=false", steps=2) == 0  # afresh: none of the earlier run's
    assert not heartbeat.exists()


def _data_position(out: Path) -> dict[str, int]:
    return json.loads((out / "env.json").read_text())["data_position"]


def test_resume_from_another_run_directory_continues_it_in_its_own(tmp_path: Path):
    """train.resume=<out_dir of an earlier run>: its latest checkpoint, this run's files in its own
    directory (rows from the step after the checkpoint's); env.json says where the data started
    and ended. With dropout the RNG state is part of what is restored."""
    ref, first, second = tmp_path / "ref", tmp_path / "first", tmp_path / "second"
    extra = "model.dropout=0.2"
    assert train(ref, extra, steps=5) == 0
    assert train(first, extra + " train.run_steps=2", steps=5) == 0
    assert train(second, f"{extra} train.resume={first}", steps=5) == 0
    assert [int(r["step"]) for r in csv_rows(second)] == [3, 4, 5]
    assert {**step_losses(first), **step_losses(second)} == step_losses(ref)
    assert (_data_position(first), _data_position(second), _data_position(ref)) == (
        {"start": 0, "end": 2}, {"start": 2, "end": 5}, {"start": 0, "end": 5})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="the directory holds no checkpoint"):
        find_resume(tmp_path / "x", str(empty))


@pytest.mark.parametrize("fault, start", [("resume_skip:batches=2", 4), ("resume_reseed", 2)])
def test_injected_resume_faults_break_the_continuation(tmp_path: Path, fault, start):
    """resume_skip starts the data past the checkpoint's position (and env.json says where it
    really started); resume_reseed draws other dropout masks: either way the resumed loss curve
    leaves the uninterrupted one at the first step after the resume."""
    ref, first, second = tmp_path / "ref", tmp_path / "first", tmp_path / "second"
    extra = "model.dropout=0.2"
    assert train(ref, extra, steps=4) == 0
    assert train(first, extra + " train.run_steps=2", steps=4) == 0
    assert train(second, f"{extra} train.resume={first} fault.spec={fault}", steps=4) == 0
    assert step_losses(second)[3] != step_losses(ref)[3]
    assert _data_position(second)["start"] == start
    assert json.loads((second / "env.json").read_text())["fault_injection"] == fault


def test_a_model_without_dropout_draws_no_random_numbers():
    import torch

    from nsa.model import NSATransformer
    from nsa.model.config import load_model_config

    idx = torch.randint(0, 256, (1, 32))
    for p, draws in ((0.0, False), (0.1, True)):
        model = NSATransformer(load_model_config("tiny", [f"model.dropout={p}"])).train()
        before = torch.get_rng_state()
        model(idx)
        assert (not torch.equal(before, torch.get_rng_state())) is draws


def test_injected_spike_scales_one_steps_loss_and_the_run_goes_on(tmp_path: Path):
    assert train(tmp_path, "fault.spec=spike:step=3:scale=10", steps=4) == 0
    clean = tmp_path / "clean"
    assert train(clean, steps=4) == 0
    spiked, ref = step_losses(tmp_path), step_losses(clean)
    assert spiked[3] == pytest.approx(10 * ref[3], rel=1e-6) and spiked[1] == ref[1]
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == [1, 2, 3, 4]


@pytest.mark.parametrize("spec, message", [
    ("resume_reseed:step=2", "resume_reseed takes no key"),
    ("resume_skip", "resume_skip needs batches=K with K >= 1"),
    ("spike:stage=data", "spike takes rank, step, scale only"),
    ("crash:batches=2", "crash takes rank, step, stage, seconds only"),
    ("stall:foo=1", "unknown key 'foo'; keys: batches, rank, scale, seconds, stage, step"),
])
def test_new_fault_kinds_take_only_their_keys(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_faults(spec)


def strict_json(text: str):
    """JSON as jq, JSON.parse and Go read it: a bare NaN / Infinity is an error."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_nan_loss_halts_with_step_and_values(tmp_path: Path):
    """The .HALT and the halt heartbeat said "losses": [NaN], "grad_norm": NaN (Python's json
    default), which strict readers refuse: now every JSON file is strict, a non-finite number
    spelled as the contract's string."""
    assert train(tmp_path, "fault.spec=nan:step=2", steps=5) == contract.EXIT_NONFINITE == 4
    halt = strict_json((tmp_path / ".HALT").read_text())
    assert halt["source"] == contract.HALT_NONFINITE and halt["step"] == 2
    assert halt["losses"] == ["nan"] and halt["grad_norm"] == "nan"
    assert halt["text"].startswith("non-finite loss at step 2")
    # the halted step did not complete (no optimizer step): no row; its losses are in its halt beat
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == [1]
    beats = [strict_json(line) for line in (tmp_path / contract.heartbeat_name(0)).read_text().splitlines()]
    assert beats[-1]["stage"] == "halt" and beats[-1]["step"] == 2 and beats[-1]["losses"] == ["nan"]
    envj = strict_json((tmp_path / "env.json").read_text())
    assert "non-finite loss at step 2" in envj["status"] and envj["fault_injection"] == "nan:step=2"


@pytest.mark.parametrize("fault, steps, rc, logged", [
    ("", 7, 0, [3, 6, 7]),                              # done: the last step though 7 % 3 != 0
    ("nan:step=5", 7, contract.EXIT_NONFINITE, [3, 4]),  # 4 is the last completed, 5 halted
    ("crash:step=5:stage=backward", 7, None, [3, 4]),    # an exception: 4 is the last completed
])
def test_the_last_completed_step_is_logged_whatever_log_every(tmp_path: Path, fault, steps, rc, logged):
    extra = "train.log_every=3" + (f" fault.spec={fault}" if fault else "")
    if rc is None:
        with pytest.raises(InjectedFault):
            train(tmp_path, extra, steps=steps)
    else:
        assert train(tmp_path, extra, steps=steps) == rc
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == logged
    assert [h["step"] for h in heartbeats(tmp_path) if h["stage"] == "step"] == logged
    if rc is None:
        assert json.loads((tmp_path / "env.json").read_text())["status"].startswith("error at step 5: InjectedFault")


def test_injected_quit_early_exits_0_after_its_step_without_halt(tmp_path: Path):
    assert train(tmp_path, "fault.spec=quit_early:step=3 train.log_every=5", steps=8) == contract.EXIT_OK
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == [3]  # its last step, logged as a final one
    assert not (tmp_path / ".HALT").exists()
    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["status"] == "quit after step 3 of 8 (injected fault quit_early: exit 0 without .HALT)"
    with pytest.raises(ConfigError, match="quit_early takes step only"):
        parse_faults("quit_early:rank=1:step=2")
    assert parse_faults("quit_early:step=2,crash:step=1:stage=backward")[1].stage == "backward"


def test_operator_halt_stops_cleanly_at_the_next_step(tmp_path: Path):
    def touch_after_first_row():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (tmp_path / "training.csv").exists() and len(csv_rows(tmp_path)) >= 2:
                (tmp_path / ".HALT").touch()
                return
            time.sleep(0.01)

    t = threading.Thread(target=touch_after_first_row)
    t.start()
    assert train(tmp_path, "", steps=200) == 0
    t.join()
    last = int(csv_rows(tmp_path)[-1]["step"])
    assert 2 <= last < 200
    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["status"] == f"stopped by operator .HALT after step {last}"
    assert (tmp_path / "checkpoints" / f"step_{last:07d}.pt").exists()


def test_a_stale_halt_from_an_earlier_run_is_cleared_and_recorded(tmp_path: Path):
    (tmp_path / ".HALT").write_text(json.dumps({"source": "watchdog", "rank": 1}))
    assert train(tmp_path, "", steps=1) == 0
    assert json.loads((tmp_path / "env.json").read_text())["previous_halt"]["source"] == "watchdog"


def test_an_operators_halt_written_while_the_run_starts_stops_it_after_its_first_step(tmp_path: Path):
    """An operator who stops a run seconds after launching it (a wrong config seen in the first
    log lines), while it still imports and builds: the .HALT was removed as an earlier run's and
    the run trained to its end. One written since the launch is this run's (here: since this
    process started, the launch of an in-process run)."""
    (tmp_path / ".HALT").touch()
    assert train(tmp_path, "", steps=6) == 0
    assert [r["step"] for r in csv_rows(tmp_path)] == ["1"]
    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["status"] == "stopped by operator .HALT after step 1" and envj["previous_halt"] is None
    assert (tmp_path / "checkpoints" / "step_0000001.pt").exists()


def test_an_operators_halt_older_than_the_launch_is_an_earlier_runs_and_cleared(tmp_path: Path):
    halt = tmp_path / ".HALT"
    halt.touch()
    an_hour_ago = time.time() - 3600
    os.utime(halt, (an_hour_ago, an_hour_ago))
    assert train(tmp_path, "", steps=2) == 0
    assert [r["step"] for r in csv_rows(tmp_path)] == ["1", "2"] and not halt.exists()
    assert json.loads((tmp_path / "env.json").read_text())["previous_halt"]["source"] == "operator"


def test_injected_crash_raises(tmp_path: Path):
    with pytest.raises(InjectedFault, match="step 1 stage backward"):
        train(tmp_path, "fault.spec=crash:step=1:stage=backward", steps=2)


def test_bad_config_and_bad_data_give_one_line_errors(tmp_path: Path, capsys):
    assert main(["--config", "tiny", "--override", "train.seq_lenn=3"]) == 2
    assert "train.seq_lenn" in capsys.readouterr().err
    assert main(["--config", "tiny", "--out-dir", str(tmp_path),
                 "--override", f"data.dataset=parquet data.path={tmp_path}/missing.parquet"]) == 2
    assert "missing.parquet': no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 garbage")
    assert main(["--config", "tiny", "--out-dir", str(tmp_path),
                 "--override", f"data.dataset=fineweb_edu data.path={bad}"]) == 2
    assert "bad.parquet: cannot read as parquet" in capsys.readouterr().err
    assert main(["--config", "tiny", "--out-dir", str(tmp_path), "--override", "fault.spec=explode"]) == 2
    assert "unknown fault 'explode'" in capsys.readouterr().err
    assert main(["--config", "tiny", "--out-dir", str(tmp_path), "--override", "dist.mode=ddp dist.ddp_compress=bf16"]) == 2
    assert "needs the NCCL backend" in capsys.readouterr().err


@pytest.mark.parametrize("override, value", [
    ("model.attn.backend_cmp=triton", "attn.backend_cmp='triton' cannot run on cpu/torch.float32: Triton kernels "
                                      "need CUDA"),
    ("model.attn.backend_win=flex", "attn.backend_win='flex' cannot run on cpu/torch.float32"),
    ("model.attn.kind=dense model.attn.backend_dense=cudnn train.dtype=bfloat16",
     "attn.backend_dense='cudnn' cannot run on cpu/torch.bfloat16"),
])
def test_a_backend_that_needs_cuda_is_refused_on_cpu_before_the_model_is_built(tmp_path: Path, capsys, monkeypatch,
                                                                                override, value):
    """A CUDA-only backend named in the config of a CPU run was refused at step 1: after the model
    was built, and after the out_dir's earlier training.csv had been replaced by an empty one."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # with it, Triton runs on CPU
    assert train(tmp_path, "train.device=cpu", steps=2) == 0  # a CPU run on a GPU box too
    before = (tmp_path / "training.csv").read_text()
    capsys.readouterr()
    assert train(tmp_path, f"train.device=cpu {override}", steps=2) == contract.EXIT_INPUT
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1 and value in err[0] and "tiny.yaml: " in err[0], err
    assert "; what runs here: auto, torch (set on the command line: model.attn.backend_" in err[0], err
    assert "[model]" not in out, out  # the line the trainer prints once the model is built
    assert (tmp_path / "training.csv").read_text() == before


def test_an_out_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path, capsys):
    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        assert main(["--config", "tiny", "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"train.out_dir={out}: cannot make the output directory" in err and "Traceback" not in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc: a directory no one can write into")
def test_an_out_dir_that_takes_no_files_is_a_one_line_error(capsys):
    """An existing directory the run cannot write into (a read-only mount, another user's) once
    gave a traceback from the watchdog's open of its stack dump file (exit 1)."""
    assert main(["--config", "tiny", "--out-dir", "/proc/self", "--override", "train.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert "train.out_dir=/proc/self: cannot write into the output directory" in err and "Traceback" not in err


def test_resume_into_another_model_shape_names_the_keys(tmp_path: Path, capsys):
    assert train(tmp_path, steps=2) == 0
    capsys.readouterr()
    assert train(tmp_path, "train.resume=auto model.dim=96", steps=3) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.dim: 64 in the checkpoint, 96 now" in err[0], err
    assert train(tmp_path, "train.resume=auto model.attn.window=8", steps=3) == 0  # same shapes: a warning
    assert "the model config differs from the checkpoint's: model.attn.window" in capsys.readouterr().out
    # the LR schedule spans train.steps: resumed with more steps (or another lr), every later step's
    # learning rate differs from the first run's, which once went without a word
    assert train(tmp_path, "train.resume=auto train.lr=0.02", steps=5) == 0
    out = capsys.readouterr().out
    assert ("the LR schedule differs from the checkpoint's run: train.lr: 0.01 in the checkpoint, 0.02 now" in out
            and "train.steps: 3 in the checkpoint, 5 now" in out), out
    assert train(tmp_path, steps=2) == 0  # no resume: afresh, and said so
    assert f"{tmp_path} holds an earlier run; starting afresh at step 1" in capsys.readouterr().out


def test_a_fresh_run_over_an_earlier_one_sets_its_checkpoints_aside(tmp_path: Path, capsys):
    """A run started afresh in an earlier run's out_dir said the earlier checkpoints stayed beside
    its own, and overwrote the one of the same step: the folder mixed two runs, and a
    train.resume=auto after a crash before its first save continued the earlier run."""
    import hashlib

    from nsa.train import checkpoint as ckpt

    assert train(tmp_path, "train.ckpt_every=2", steps=4) == 0
    folder = ckpt.ckpt_dir(tmp_path)
    digest = hashlib.md5((folder / "step_0000002.pt").read_bytes()).hexdigest()
    capsys.readouterr()
    assert train(tmp_path, "train.ckpt_every=2", steps=2) == 0
    aside = tmp_path / "checkpoints.earlier-1"
    assert f"its checkpoints moved to {aside}" in capsys.readouterr().out
    assert hashlib.md5((aside / "step_0000002.pt").read_bytes()).hexdigest() == digest
    assert (aside / "step_0000004.pt").is_file() and not (folder / "step_0000004.pt").exists()
    assert ckpt.find_resume(tmp_path, "auto") == folder / "step_0000002.pt"  # this run's, not the earlier one's
    assert train(tmp_path, steps=1) == 0
    assert (tmp_path / "checkpoints.earlier-2" / "step_0000002.pt").is_file()


def test_injected_oom_is_reported_with_a_memory_file(tmp_path: Path):
    import torch

    with pytest.raises(torch.OutOfMemoryError, match="injected out-of-memory on rank 0 at step 2"):
        train(tmp_path, "fault.spec=oom:step=2:stage=backward", steps=3)
    assert "out of memory" in (tmp_path / "oom_rank0.txt").read_text()
    assert json.loads((tmp_path / "env.json").read_text())["status"].startswith("out of memory at step 2")


def test_bf16_autocast_and_fused_adamw_toggle(tmp_path: Path):
    assert train(tmp_path, "train.dtype=bfloat16", steps=2, env={"NSA_OPT_FUSED": "1"}) == 0
    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["config"]["train"]["fused_adamw"] == "on" and envj["env_toggles"]["NSA_OPT_FUSED"]
    assert envj["optimizer"] == {"name": "AdamW", "fused_setting": "on", "fused": True}
    assert all(math.isfinite(float(r["loss"])) for r in csv_rows(tmp_path))


def test_fused_adamw_auto_is_fused_on_cuda_only(tmp_path: Path):
    """The default, auto: the foreach kernels on the CPU (env.json says which ran), the fused kernel
    on CUDA; on and off are taken as they are anywhere."""
    from nsa.train.optim import fused_adamw

    assert train(tmp_path, steps=1) == 0
    envj = json.loads((tmp_path / "env.json").read_text())
    assert envj["optimizer"] == {"name": "AdamW", "fused_setting": "auto", "fused": False}
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [fused_adamw(s, cuda) for s in ("auto", "on", "off")] == [True, True, False]
    assert [fused_adamw(s, cpu) for s in ("auto", "on", "off")] == [False, True, False]


def test_resume_csv_rewrite_is_atomic_and_a_bad_header_is_a_checkpoint_error(tmp_path):
    from nsa.train.checkpoint import CheckpointError
    from nsa.train.telemetry import CSV_HEADER, truncate_csv

    csv_path = tmp_path / "training.csv"
    csv_path.write_text(",".join(CSV_HEADER) + "\n" + "".join(f"{s},1,1,1,1,1,0,0\n" for s in range(1, 6)))
    truncate_csv(csv_path, 3)
    assert [line.split(",")[0] for line in csv_path.read_text().splitlines()[1:]] == ["1", "2", "3"]
    assert [p.name for p in tmp_path.iterdir()] == ["training.csv"]  # no temp file left behind
    csv_path.write_text("when,what\n1,2\n")
    with pytest.raises(CheckpointError, match="training.csv: unexpected header"):
        truncate_csv(csv_path, 3)
    assert csv_path.read_text() == "when,what\n1,2\n"


def test_a_full_disk_at_a_checkpoint_names_it_and_keeps_the_last_one(tmp_path: Path, monkeypatch, capsys):
    """ENOSPC while a checkpoint is written: one line names the file and the reason (no traceback,
    exit 1), the half-written file is gone (it held the space), `latest` still names the last good
    checkpoint, env.json says why the run stopped and where (the checkpoint of the step completed,
    not the next step), and the run resumes from that checkpoint."""
    import errno

    real_save, saves = torch.save, []

    def disk_fills_at_the_third(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) < 3:
            return real_save(obj, f, *args, **kwargs)
        fh = open(f, "wb") if isinstance(f, (str, Path)) else f
        fh.write(b"\0" * 1000)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:  # as torch's writer reports a failed write of the file
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", disk_fills_at_the_third)
    capsys.readouterr()
    assert train(tmp_path, "train.ckpt_every=1", steps=4) == contract.EXIT_ERROR
    said = capsys.readouterr().err
    assert re.fullmatch(r"\[rank 0\] error at the checkpoint of step 3: cannot write checkpoint \S+step_0000003\.pt: "
                        r"No space left on device; the last checkpoint saved, step_0000002\.pt, is intact\n", said), said
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_0000001.pt", "step_0000002.pt"]
    assert (ckpts / "latest").read_text() == "step_0000002.pt\n"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    # the save of step 3 failed, after step 3 completed: once labelled "error at step 4"
    assert json.loads((tmp_path / "env.json").read_text())["status"].startswith(
        "error at the checkpoint of step 3: CheckpointError: cannot write checkpoint")
    monkeypatch.setattr(torch, "save", real_save)
    assert train(tmp_path, "train.ckpt_every=1 train.resume=auto", steps=4) == 0
    assert [r["step"] for r in csv_rows(tmp_path)] == ["1", "2", "3", "4"]


def test_a_first_checkpoint_that_cannot_be_written_says_there_is_none_before_it(tmp_path: Path, monkeypatch,
                                                                                  capsys):
    """It said 'the last checkpoint saved, none, is intact'."""
    def no_room(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_room)
    assert train(tmp_path, "train.ckpt_every=2", steps=4) == contract.EXIT_ERROR
    assert capsys.readouterr().err.endswith(
        f"cannot write checkpoint {tmp_path / 'checkpoints' / 'step_0000002.pt'}: No space left on device; no "
        "checkpoint was saved before it\n")
    assert [f.name for f in (tmp_path / "checkpoints").iterdir()] == []


def _train_under_file_size_limit(out: Path, limit: int, extra: str, steps: int):
    """``python -m nsa.train`` in a process of its own whose files may not grow past ``limit`` bytes
    (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails with EFBIG, as one on a full disk fails
    with ENOSPC), through the trainer's real write paths."""
    import resource
    import signal
    import subprocess
    import sys

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_") and k != "CONFIG"}
    # no repository for the git the trainer runs (env.json's git_sha): it inherits the limit, and its
    # describe --dirty, refreshing the index, left index.lock behind in this checkout
    env.update(OMP_NUM_THREADS="1", GIT_DIR=str(out / "no-repository"))
    return subprocess.run([sys.executable, "-m", "nsa.train", "--config", "tiny", "--override",
                           f"{TINY} train.steps={steps} train.out_dir={out} {extra}"],
                          env=env, capture_output=True, text=True, timeout=120, preexec_fn=limited)


def test_a_real_checkpoint_write_past_the_file_size_limit_ends_with_one_line(tmp_path: Path):
    """The real write path (torch.save into write_atomic's temp file) failing for want of room. It
    ended in a full traceback; now one line names the file and the OS's reason, exit 1, nothing
    half-written is left, and the run resumes from the checkpoint before."""
    assert train(tmp_path, "train.ckpt_every=2 train.run_steps=2", steps=6) == 0
    ckpts = tmp_path / "checkpoints"
    size = (ckpts / "step_0000002.pt").stat().st_size
    # the training.csv, heartbeats and env.json fit; a checkpoint does not
    p = _train_under_file_size_limit(tmp_path, size // 2, "train.ckpt_every=2 train.resume=auto", steps=6)
    assert p.returncode == contract.EXIT_ERROR, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"[rank 0] error at the checkpoint of step 4: cannot write checkpoint {ckpts / 'step_0000004.pt'}: File too "
        "large; the last checkpoint saved, step_0000002.pt, is intact"), p.stderr
    assert sorted(f.name for f in ckpts.iterdir()) == ["latest", "step_0000002.pt"]
    assert json.loads((tmp_path / "env.json").read_text())["status"] == (
        f"error at the checkpoint of step 4: CheckpointError: cannot write checkpoint {ckpts / 'step_0000004.pt'}: "
        "File too large; the last checkpoint saved, step_0000002.pt, is intact")
    assert train(tmp_path, "train.ckpt_every=2 train.resume=auto", steps=6) == 0
    assert [r["step"] for r in csv_rows(tmp_path)] == ["1", "2", "3", "4", "5", "6"]


def test_a_disk_full_while_setting_up_ends_with_one_line_naming_the_file(tmp_path: Path):
    """env.json, the first file of some size the trainer writes, past the limit: a traceback ending in
    'OSError: [Errno 27] File too large', naming no file (the temp file's close raised it)."""
    p = _train_under_file_size_limit(tmp_path, 3000, "", steps=2)
    assert p.returncode == contract.EXIT_ERROR, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"[rank 0] error while setting up: [Errno 27] File too large: '{tmp_path / 'env.json'}'"), p.stderr
    assert "Traceback" not in p.stderr and not list(tmp_path.glob(".*.tmp")), p.stderr


def test_write_atomic_leaves_the_old_file_and_no_temp_when_the_write_fails(tmp_path: Path):
    from nsa.atomic import write_atomic

    target = tmp_path / "latest"
    write_atomic(target, b"step_0000001.pt\n")

    def half_then_fail(fh):
        fh.write(b"step_00")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "step_0000001.pt\n" and [p.name for p in tmp_path.iterdir()] == ["latest"]


@pytest.mark.parametrize("damage, message", [
    (lambda ck: ck.write_bytes(b""), r"step_0000002\.pt: cannot load checkpoint \(EOFError: the file is cut short\)"),
    (lambda ck: ck.write_bytes(ck.read_bytes()[:5000]), r"step_0000002\.pt: cannot load checkpoint"),
    (lambda ck: ck.write_text("garbage\n"), r"step_0000002\.pt: cannot load checkpoint \(not a torch checkpoint"),
    (lambda ck: torch.save({"format": 1, "step": 2}, ck),
     r"step_0000002\.pt: not a whole checkpoint of format 1: no data_position, world_size, model"),
    (lambda ck: torch.save({**torch.load(ck, weights_only=True), "config": {}}, ck),
     r"step_0000002\.pt: not a whole checkpoint of format 1: no train\.batch_size in its config"),
    (lambda ck: (ck.parent / "latest").write_text(""), r"latest: expected the file name of a checkpoint beside "
                                                       r"it, got ''"),
    (lambda ck: (ck.parent / "latest").write_text("../../x.pt\n"), r"latest: expected the file name .*'\.\./\.\./x\.pt'"),
])
def test_resume_from_a_damaged_checkpoint_is_a_one_line_error(tmp_path: Path, capsys, damage, message):
    """An empty or cut checkpoint, one missing its keys, an empty or path-like `latest`: each once gave
    a traceback (IndexError formatting an empty EOFError, KeyError) or named the wrong thing ("checkpoints: Is a directory")."""
    assert train(tmp_path, steps=2) == 0
    damage(tmp_path / "checkpoints" / "step_0000002.pt")
    capsys.readouterr()
    assert train(tmp_path, "train.resume=auto", steps=3) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err


def test_resume_under_another_global_micro_batch_is_refused_naming_the_batch_that_fits(tmp_path: Path, capsys):
    """The data position counts global micro-batches; a run of 2 ranks resumed by one process at
    the same per-rank batch once re-read the rows the first run had trained on, silently. A world
    of 2 is simulated by the checkpoint's own world_size (torchrun runs: tests/integration)."""
    assert train(tmp_path, "train.batch_size=2 train.run_steps=2", steps=4) == 0
    ck = tmp_path / "checkpoints" / "step_0000002.pt"
    payload = torch.load(ck, weights_only=True)
    torch.save({**payload, "world_size": 2}, ck)
    capsys.readouterr()
    assert train(tmp_path, "train.batch_size=2 train.resume=auto", steps=4) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("counts micro-batches of 4 rows (train.batch_size=2 x world size 2), this run's "
                              "have 2 (2 x 1)") in err[0] and "resume with train.batch_size=4 here" in err[0], err
    assert train(tmp_path, "train.batch_size=4 train.resume=auto", steps=4) == 0  # the same rows per micro-batch
    assert [r["step"] for r in csv_rows(tmp_path)] == ["1", "2", "3", "4"]


def test_resume_under_another_seq_len_is_refused_naming_both(tmp_path: Path, capsys):
    """The data position counts micro-batches of rows of train.seq_len + 1 tokens; resumed with
    another seq_len, a run went on without a word from a point of its text that the first run had
    not reached (a longer row) or had trained on already (a shorter one)."""
    data = tmp_path / "doc.txt"
    data.write_text("".join(f"line {i} of a text file long enough for a few rows\n" for i in range(200)))
    text = f"data.dataset=text data.path={data}"
    assert train(tmp_path / "run", f"{text} train.run_steps=2", steps=4) == 0
    capsys.readouterr()
    assert train(tmp_path / "run", f"{text} train.resume=auto train.seq_len=32", steps=4) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rows of train.seq_len=64 (+1) tokens, this run's of 32" in err[0], err
    assert "resume with train.seq_len=64" in err[0], err
    assert train(tmp_path / "run", f"{text} train.resume=auto", steps=4) == 0


def test_resume_on_other_data_says_what_differs(tmp_path: Path, capsys):
    """Resumed on another dataset (or files, or text column), the run reads the new data from the
    checkpoint's data position; it once did so without a word, as it does not for a model or LR
    schedule that differs."""
    assert train(tmp_path, "data.dataset=pattern train.run_steps=2", steps=4) == 0
    capsys.readouterr()
    assert train(tmp_path, "data.dataset=synthetic train.resume=auto", steps=4) == 0
    out = capsys.readouterr().out
    assert ("the data differs from the checkpoint's run: data.dataset: 'pattern' in the checkpoint, 'synthetic' "
            "now; this run reads its data from micro-batch 2") in out, out
    assert train(tmp_path, "data.dataset=synthetic data.loader_timeout_s=60 train.resume=auto", steps=5) == 0
    assert "the data differs" not in capsys.readouterr().out  # how it is read is no other data


def test_an_out_dir_deleted_during_the_run_stops_it_with_an_error(tmp_path: Path, monkeypatch):
    """Deleted mid-run (rm -rf of the out_dir), a run once wrote on into the deleted files, made the
    directory again for its checkpoints and ended with exit 0 and env.json 'completed', beside no
    training.csv and no heartbeats (torchrun DDP x2 and one process)."""
    import shutil

    from nsa.train import telemetry

    out = tmp_path / "run"
    real_log_step = telemetry.Telemetry.log_step

    def rm_rf_before_step_3(self, row, extra, garbled=False):
        if row["step"] == 3:
            shutil.rmtree(out)
        real_log_step(self, row, extra, garbled)

    monkeypatch.setattr(telemetry.Telemetry, "log_step", rm_rf_before_step_3)
    with pytest.raises(RuntimeError, match=r"training\.csv was deleted while the run wrote it"):
        train(out, "train.ckpt_every=1", steps=5)
    env = out / "env.json"  # written into a directory the run made again, it must not claim success
    assert not env.exists() or "OutputLost" in json.loads(env.read_text())["status"]


def test_temp_files_of_a_process_killed_mid_save_are_removed_at_the_next_save(tmp_path: Path):
    """SIGTERM while a checkpoint was written left .step_N.pt.<pid>.tmp, as large as a checkpoint,
    behind for good; a preemptible run killed mid-save again and again filled its disk with them."""
    stale = tmp_path / "checkpoints" / ".step_0000001.pt.99999.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\0" * 4096)
    assert train(tmp_path, "train.ckpt_every=1", steps=1) == 0
    assert sorted(p.name for p in stale.parent.iterdir()) == ["latest", "step_0000001.pt"]


def test_resume_past_train_steps_is_an_error_not_a_run_that_stopped_at_step_3_of_2(tmp_path: Path, capsys):
    assert train(tmp_path, steps=3) == 0
    capsys.readouterr()
    assert train(tmp_path, "train.resume=auto", steps=2) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the checkpoint is at step 3, past train.steps=2: nothing to train" in err[0], err
    assert train(tmp_path, "train.resume=auto", steps=3) == 0  # at its end already: done, and said so
    assert json.loads((tmp_path / "env.json").read_text())["status"] == "completed 3 steps"


def test_a_full_disk_while_logging_names_the_file(tmp_path: Path):
    """ENOSPC on a heartbeat or training.csv write once ended the run with a bare "[Errno 28] No
    space left on device" (tmpfs filled while a run logged), naming no file."""
    import errno

    from nsa.train.telemetry import Telemetry

    class FullDisk:
        def __init__(self, real):
            self.name, self.fileno = real.name, real.fileno

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    tel = Telemetry(tmp_path, 0, True, torch.device("cpu"), heartbeat=True, nvtx=False)
    real_hb = tel._hb
    tel._hb = FullDisk(real_hb)
    with pytest.raises(OSError, match=r"No space left on device: '.*heartbeat_rank0\.jsonl'"):
        tel.heartbeat({"step": 1, "stage": "data"})
    tel._hb = real_hb
    real_csv, tel._csv_fh = tel._csv_fh, FullDisk(tel._csv_fh)
    tel._csv = csv.writer(tel._csv_fh)
    row = dict.fromkeys(CSV_HEADER, 1.0)
    with pytest.raises(OSError, match=r"No space left on device: '.*training\.csv'"):
        tel.log_step(row, {})
    tel._csv_fh = real_csv
    tel.close()


def test_closing_a_file_on_a_full_disk_does_not_replace_the_error_that_stopped_the_run(tmp_path: Path, capsys):
    """Its last flush failing again, telemetry's close raised from the trainer's clean-up, and the
    error that stopped the run (naming its file) was printed nowhere: the clean-up's ExitStack drops
    the exception in flight from the chain."""
    from nsa.train.telemetry import Telemetry

    tel = Telemetry(tmp_path, 0, True, torch.device("cpu"), heartbeat=True, nvtx=False)
    real_hb = tel._hb

    class FlushFails:
        name = real_hb.name

        def close(self):
            real_hb.close()
            raise OSError(28, "No space left on device")

    tel._hb = FlushFails()
    tel.close()
    assert tel._csv_fh.closed and real_hb.closed
    assert "could not close" in capsys.readouterr().err


def test_a_bad_record_the_run_reaches_fails_before_the_model_is_built(tmp_path: Path, capsys):
    """A malformed line at line N of a jsonl corpus surfaced only when the loader reached it: here at
    step 19 of 20, after the model was built and the out_dir's files replaced; on a real corpus,
    hours into the run. Now the records the run reads are read first, and the error names the
    config file, the data file, the line and what was expected."""
    data = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(1, 401)]  # 7-8 tokens each, 130 a step
    lines[299] = '{"text": "doc 300", '
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    assert train(out, f"data.dataset=jsonl data.path={data}", steps=20) == contract.EXIT_INPUT
    stdout, err = capsys.readouterr()
    assert "[model]" not in stdout and not (out / "training.csv").exists(), stdout
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[rank 0] error: ") and err[0].endswith(
        f"tiny.yaml: {data}:300: not valid JSON (Expecting property name enclosed in double quotes, at the end of "
        "the line); expected one JSON object per line with a string 'text' (data.text_column)"), err
    # a run too short to reach it trains, and says how much of the data it checked
    assert train(out, f"data.dataset=jsonl data.path={data}", steps=2) == 0
    assert re.search(r"\[data\] checked 3\d records \(2\d\d tokens\) in \d+\.\d\d s: what the run reads \(its first "
                     r"260 tokens\)", capsys.readouterr().out)


@pytest.mark.parametrize("override, said", [
    ("data.dataset=jsonl data.path={tmp}/nope.jsonl",
     "data.path='{tmp}/nope.jsonl': no such file or directory; expected a local file, a directory of files or a "
     "glob (set on the command line: data.path={tmp}/nope.jsonl)"),
    ("train.resume={tmp}/nockpt", "train.resume='{tmp}/nockpt': checkpoint file not found (set on the command line: "
                                  "train.resume={tmp}/nockpt)"),
    ("dist.mode=ddp dist.ddp_compress=bf16", "dist.ddp_compress=bf16 needs the NCCL backend (CUDA); the gloo backend "
                                             "cannot all-reduce compressed buckets. Set dist.ddp_compress=none (or "
                                             "unset NSA_DDP_COMPRESS) (set on the command line: dist.ddp_compress=bf16)"),
    ("train.device=cuda", "train.device=cuda but torch.cuda.is_available() is False; expected auto or cpu on a machine "
                          "without a usable CUDA GPU (set on the command line: train.device=cuda)"),
], ids=["data", "checkpoint", "ddp_compress", "device"])
def test_a_value_found_wrong_in_set_up_names_the_config_file_the_key_and_comes_before_the_model(
        tmp_path: Path, capsys, override, said):
    """They named the key but not the config file, and a missing checkpoint or a compression hook
    that gloo cannot run came after the model was built."""
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    assert train(tmp_path / "run", override.format(tmp=tmp_path), steps=2) == contract.EXIT_INPUT
    stdout, err = capsys.readouterr()
    assert "[model]" not in stdout, stdout
    assert err.strip().endswith(f"tiny.yaml: {said.format(tmp=tmp_path)}"), err


def _ckpt_names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def test_older_checkpoints_are_removed_past_train_keep_checkpoints(tmp_path: Path):
    """Every train.ckpt_every checkpoint was kept, so a run of days filled its disk. Now the
    newest train.keep_checkpoints (default 3) stay; 0 keeps all."""
    assert train(tmp_path / "two", "train.ckpt_every=1 train.keep_checkpoints=2", steps=5) == 0
    assert _ckpt_names(tmp_path / "two") == ["latest", "step_0000004.pt", "step_0000005.pt"]
    assert (tmp_path / "two" / "checkpoints" / "latest").read_text() == "step_0000005.pt\n"
    assert train(tmp_path / "default", "train.ckpt_every=1", steps=5) == 0
    assert _ckpt_names(tmp_path / "default") == ["latest", "step_0000003.pt", "step_0000004.pt", "step_0000005.pt"]
    assert train(tmp_path / "all", "train.ckpt_every=2 train.keep_checkpoints=0", steps=6) == 0
    assert _ckpt_names(tmp_path / "all") == ["latest", "step_0000002.pt", "step_0000004.pt", "step_0000006.pt"]


def test_the_checkpoint_a_run_resumed_from_is_never_removed(tmp_path: Path):
    assert train(tmp_path, "train.ckpt_every=1 train.keep_checkpoints=0", steps=3) == 0
    first = tmp_path / "checkpoints" / "step_0000001.pt"
    assert train(tmp_path, f"train.ckpt_every=1 train.keep_checkpoints=1 train.resume={first}", steps=4) == 0
    assert _ckpt_names(tmp_path) == ["latest", "step_0000001.pt", "step_0000004.pt"]


def test_prune_spares_what_latest_names_and_an_earlier_runs_later_steps(tmp_path: Path):
    from nsa.train.checkpoint import prune

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (1, 2, 3, 4, 9):
        (folder / f"step_{step:07d}.pt").write_bytes(b"x")
    (folder / "notes.pt").write_bytes(b"x")
    saved = folder / "step_0000004.pt"
    (folder / "latest").write_text("step_0000003.pt\n")  # the pointer's write failed: judge nothing
    assert prune(tmp_path, 1, saved) == [] and len(list(folder.iterdir())) == 7
    (folder / "latest").write_text("step_0000004.pt\n")
    assert prune(tmp_path, 2, saved, protect=(folder / "step_0000001.pt",)) == [folder / "step_0000002.pt"]
    assert _ckpt_names(tmp_path) == ["latest", "notes.pt", "step_0000001.pt", "step_0000003.pt",
                                     "step_0000004.pt", "step_0000009.pt"]
    assert prune(tmp_path, 1, saved) == [folder / "step_0000001.pt", folder / "step_0000003.pt"]
    assert prune(tmp_path, 0, saved) == []


def test_write_atomic_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path: Path, monkeypatch):
    """The rename of the temp file into place was never made durable: after a power cut `latest`
    could name the checkpoint before (POSIX: a rename is durable once its directory is fsynced)."""
    import stat
    from nsa import atomic

    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        mode = os.fstat(fd).st_mode
        calls.append(("fsync", "dir" if stat.S_ISDIR(mode) else "file"))
        if stat.S_ISDIR(mode):
            assert os.path.samestat(os.fstat(fd), os.stat(tmp_path))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    atomic.write_atomic(tmp_path / "latest", b"step_0000001.pt\n")
    assert calls == [("fsync", "file"), ("replace", "latest"), ("fsync", "dir")]
    assert (tmp_path / "latest").read_text() == "step_0000001.pt\n"
    calls.clear()
    with pytest.raises(OSError):  # a failed write renames nothing and fsyncs no directory
        atomic.write_atomic(tmp_path / "latest", lambda fh: (_ for _ in ()).throw(OSError(28, "No space")))
    assert calls == []


@pytest.mark.parametrize("text", ["hello world\n", "step_0000002.pt\n", "i"])
def test_resume_from_a_text_file_says_it_is_not_a_torch_checkpoint(tmp_path: Path, capsys, text):
    """train.resume=/path/to/some.txt said 'cannot load checkpoint (KeyError: 105)' (torch's legacy
    reader taking the text's first byte, 'i', for a magic number)."""
    notes = tmp_path / "some.txt"
    notes.write_text(text)
    assert train(tmp_path / "run", f"train.resume={notes}", steps=2) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = (f"{notes}: cannot load checkpoint (not a torch checkpoint file: torch.save writes a zip archive, "
                f"which begins with b'PK\\x03\\x04', and this file begins with {text.encode()[:8]!r})")
    assert len(err) == 1 and err[0].endswith(expected), err
    assert not (tmp_path / "run" / "training.csv").exists()


def test_a_damaged_or_missing_latest_checkpoint_names_the_ones_to_go_back_to(tmp_path: Path, capsys):
    """train.keep_checkpoints keeps two to go back to if the newest is damaged, yet
    `train.resume=auto` over a cut-short step_N.pt, or with `latest` naming a deleted one, said only
    what was wrong with it: which checkpoints remained, and how to resume one, the user had to find."""
    out = tmp_path / "run"
    assert train(out, "train.ckpt_every=2", steps=6) == 0
    folder = out / "checkpoints"
    earlier = ("other checkpoints beside it: step_0000004.pt, step_0000002.pt; to go back to one, resume with "
               f"train.resume={folder / 'step_0000004.pt'}")
    (folder / "step_0000006.pt").write_bytes((folder / "step_0000006.pt").read_bytes()[:1000])
    assert train(out, "train.resume=auto", steps=8) == 2
    err = capsys.readouterr().err
    assert "step_0000006.pt: cannot load checkpoint" in err and earlier in err, err
    (folder / "step_0000006.pt").unlink()
    assert train(out, "train.resume=auto", steps=8) == 2
    err = capsys.readouterr().err
    assert "latest names step_0000006.pt, which does not exist; " + earlier in err, err
