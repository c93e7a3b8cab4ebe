"""Profiling through the contract (nsa/train/profile.py): the busy fraction, device intervals and
NSA attribution of the harness's former worker (validation/profile_phase.py, validation/pace.py),
on made-up numbers, on a timeline that worker recorded on an H100 and on fake CUDA profiler events;
and the trainer's profiled window (CONTRACT_PROFILE_STEPS) on CPU: its steps only, its files, the
run going on to its requested steps."""
from __future__ import annotations

import contextlib
import csv
import gzip
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nsa import contract
from nsa.train import loop
from nsa.train.cli import run
from nsa.train.profile import (HOST_TABLE_HEADING, STEP_RANGE, WINDOW_RANGE, Window, busy_fraction, device_intervals,
                               nsa_attribution, profiled_window, summarize, write)

#: written by the harness's nvtx phase worker (validation/profile_phase.py: compile=True, 10
#: CUDA-graph steps of m7c_125m at 2 rows x 2 micro-batches x S=2048) on an H100 on 2026-11-23
RECORDED = Path(__file__).parent / "data" / "gpu_timeline_h100_compiled.json.gz"
CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


# --- the measurements ----------------------------------------------------------------------------


def test_busy_fraction_counts_overlaps_once_and_clips_to_the_window():
    assert busy_fraction([(0, 10)], (0, 10)) == 1.0
    assert busy_fraction([(0, 4), (2, 6), (8, 9)], (0, 10)) == pytest.approx(0.7)  # [0,6] + [8,9]
    assert busy_fraction([(-5, 2), (9, 20)], (0, 10)) == pytest.approx(0.3)        # clipped at both ends
    assert busy_fraction([(3, 3), (12, 15)], (0, 10)) == 0.0                       # empty, outside
    assert busy_fraction([(5, 6), (1, 2), (1.5, 5.5)], (0, 10)) == pytest.approx(0.5)  # unsorted input
    with pytest.raises(ValueError, match="empty window"):
        busy_fraction([], (3, 3))


def _sweep_union(intervals, lo, hi) -> float:
    """An independent computation: +1/-1 events along the time line, busy where the count > 0."""
    pts = sorted([(max(s, lo), 1) for s, e in intervals if e > lo and s < hi] +
                 [(min(e, hi), -1) for s, e in intervals if e > lo and s < hi])
    busy, depth, last = 0.0, 0, lo
    for t, d in pts:
        if depth > 0:
            busy += t - last
        depth, last = depth + d, t
    return busy / (hi - lo)


def test_busy_fraction_of_the_timeline_the_former_worker_recorded_on_an_h100():
    rec = json.loads(gzip.open(RECORDED, "rt").read())
    lo, hi = rec["window_us"]
    intervals = [tuple(iv) for iv in rec["device_intervals_us"]]
    got = busy_fraction(intervals, (lo, hi))
    assert got == pytest.approx(rec["gpu_busy_frac"], abs=1e-12)  # what the worker reported on the GPU
    assert got == pytest.approx(_sweep_union(intervals, lo, hi), abs=1e-9)
    assert sum(e - s for s, e in intervals) > hi - lo  # kernels overlap: a plain sum would be wrong
    assert 0.85 < got < 1.0


def _event(name, start, end, device=CUDA, **times):
    return SimpleNamespace(name=name, key=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           **times)


def test_device_intervals_are_the_device_events_only():
    events = [_event("sm80_gemm", 5, 9), _event("aten::mm", 4, 10, CPU), _event("Memcpy HtoD", 1, 2),
              _event(STEP_RANGE, 1, 9, is_user_annotation=True)]  # a range's GPU-side copy: not a kernel
    assert device_intervals(events) == [(5, 9), (1, 2)]


@pytest.mark.gpu
def test_a_step_that_waits_on_the_host_between_kernels_is_not_busy_on_a_gpu():
    """On a real profile: each step launches a short product, then the host sleeps 10 ms, four
    times. The device works well under a tenth of the window; the GPU-side copies of the step
    and window ranges, which span each step's first to last kernel, must not count as work."""
    x = torch.randn(512, 512, device="cuda")
    with profiled_window(torch.device("cuda")) as window:
        for _ in range(3):
            with window.step():
                for _ in range(4):
                    x @ x
                    torch.cuda.synchronize()
                    time.sleep(0.01)
    _, timeline, _ = summarize(window, steps=3, first_step=0, graphed=False)
    assert timeline.gpu_busy_frac < 0.2, timeline.gpu_busy_frac


def test_nsa_attribution_ranges_custom_ops_and_kernels():
    # torch.compile drops record_function ranges; the kernels' custom ops stay in the graph, and a
    # CUDA-graph replay leaves only the kernels themselves
    keys = ["aten::mm", "nsa.sel", "nsa::sel_fwd", "nsa::band_bwd", "nsa_other", "profile.step", "nsa::sel_fwd",
            "_sel_fwd_kernel", "sm90_gemm"]
    assert nsa_attribution(keys) == ["nsa.sel", "nsa::band_bwd", "nsa::sel_fwd"]
    assert nsa_attribution(keys, {"_sel_fwd_kernel", "_unused_kernel"}) == [
        "_sel_fwd_kernel", "nsa.sel", "nsa::band_bwd", "nsa::sel_fwd"]


class _FakeCudaProfile:
    """What summarize reads of a torch.profiler run on CUDA: key averages and raw events."""

    def __init__(self, averages, raw):
        self.averages, self.raw = averages, raw

    def key_averages(self):
        table = SimpleNamespace(table=lambda sort_by, row_limit: f"table by {sort_by}, {row_limit} rows")
        return type("Averages", (list,), {"table": lambda self, **kw: table.table(**kw)})(self.averages)

    def events(self):
        return self.raw


def _avg(key, cpu_total=0.0, self_cpu=0.0, self_device=0.0):
    return SimpleNamespace(key=key, cpu_time_total=cpu_total, self_cpu_time_total=self_cpu,
                           self_device_time_total=self_device)


def test_summarize_on_cuda_events_and_the_files_it_writes(tmp_path):
    # Kineto's GPU-side copies of the ranges come first (first to last kernel): neither is the
    # window nor busy time
    raw = [_event(WINDOW_RANGE, 110, 250, is_user_annotation=True), _event(STEP_RANGE, 110, 250, is_user_annotation=True),
           _event(WINDOW_RANGE, 100, 200, CPU), _event("_sel_fwd_kernel", 110, 150), _event("sm90_gemm", 140, 160),
           _event("Memset", 190, 250)]  # busy [110,160] + [190,200] = 60 of 100
    averages = [_avg(STEP_RANGE, cpu_total=80_000), _avg("aten::mm", self_cpu=20_000, self_device=30_000),
                _avg("aten::add", self_cpu=20_000, self_device=1_000), _avg("_sel_fwd_kernel", self_device=40_000),
                _avg("train.forward", self_device=99_000), _avg("nsa::sel_fwd", self_cpu=5_000)]
    window = Window(torch.device("cuda"), True, _FakeCudaProfile(averages, raw), wall_s=0.25)
    profile, timeline, table = summarize(window, steps=2, first_step=7, graphed=True,
                                         kernel_names={"_sel_fwd_kernel"})
    assert profile.gpu_busy_frac == pytest.approx(0.6) and timeline.window_us == (100, 200)
    assert timeline.device_intervals_us == [(110, 150), (140, 160), (190, 250)]
    assert [(op.name, op.ms_per_step) for op in profile.top_ops] == [  # device time, no train.* ranges
        ("_sel_fwd_kernel", 20.0), ("aten::mm", 15.0), ("aten::add", 0.5)]
    assert profile.nsa_ranges == ["_sel_fwd_kernel", "nsa::sel_fwd"]
    assert profile.python_overhead_frac == pytest.approx(0.5)  # 40 ms of aten in 80 ms of steps
    assert (profile.cuda_graphs, profile.device, profile.profiled_steps, profile.first_step) == (True, "cuda", 2, 7)
    assert table == f"table by self_cuda_time_total, 25 rows\n\n{HOST_TABLE_HEADING}\ntable by cpu_time_total, 25 rows"

    names = write(tmp_path, profile, timeline, table)
    assert names == [contract.PROFILE_JSON, contract.PROFILE_TOP_OPS, contract.GPU_TIMELINE]
    got = json.loads((tmp_path / contract.PROFILE_JSON).read_text())
    assert set(got) == set(contract.PROFILE_FIELDS) and got["contract_version"] == contract.VERSION
    assert got["top_ops"][0] == {"name": "_sel_fwd_kernel", "ms_per_step": 20.0}
    with gzip.open(tmp_path / contract.GPU_TIMELINE, "rt") as fh:
        assert json.load(fh) == {"window_us": [100, 200], "device_intervals_us": [[110, 150], [140, 160], [190, 250]],
                                 "gpu_busy_frac": pytest.approx(0.6)}


def test_a_rank_that_does_not_profile_only_runs_the_steps():
    ran = []
    with profiled_window(torch.device("cpu"), profiling=False) as window:
        with window.step():
            ran.append(1)
    assert ran == [1] and window.prof is None


# --- the trainer's window, on CPU -----------------------------------------------------------------

# on CPU wherever they run: what these tests pin (steady from step 2, no GPU timeline) is the CPU case
TINY = "model.n_layers=1 train.seq_len=32 train.print_every=100 train.save_final=false train.device=cpu"


def _train(out: Path, extra: str, steps: int, profile_steps: int) -> int:
    return run("tiny", [f"{TINY} train.steps={steps} train.out_dir={out} {extra}"],
               env={contract.PROFILE_STEPS_ENV: str(profile_steps)})


def _steps_logged(out: Path) -> list[int]:
    with open(out / contract.TRAINING_CSV, newline="") as fh:
        return [int(r["step"]) for r in csv.DictReader(fh)]


def _ancestors(event) -> list[str]:
    names = []
    while event.cpu_parent is not None:
        event = event.cpu_parent
        names.append(event.name)
    return names


def test_the_trainer_profiles_steady_steps_only_and_goes_on(tmp_path, monkeypatch):
    windows = []

    def keep(window, *args, **kwargs):
        windows.append(window)
        return summarize(window, *args, **kwargs)

    monkeypatch.setattr(loop, "summarize", keep)
    assert _train(tmp_path, "train.log_every=2", steps=6, profile_steps=3) == 0
    got = json.loads((tmp_path / contract.PROFILE_JSON).read_text())
    assert set(got) == set(contract.PROFILE_FIELDS)
    # eager on CPU the run is steady from its second step; the run then went on to its 6 steps,
    # logging by log_every and the last step
    assert (got["profiled_steps"], got["first_step"], got["device"]) == (3, 2, "cpu")
    assert got["gpu_busy_frac"] is None and got["cuda_graphs"] is False and got["wall_s"] > 0
    assert len(got["nsa_ranges"]) >= 4 and all(r.startswith("nsa.") for r in got["nsa_ranges"])
    assert 1 <= len(got["top_ops"]) <= 5 and all(op["ms_per_step"] > 0 for op in got["top_ops"])
    assert not [op for op in got["top_ops"] if op["name"].startswith(("train.", "profile."))]
    assert 0.0 <= got["python_overhead_frac"] <= 1.0
    assert "Self CPU" in (tmp_path / contract.PROFILE_TOP_OPS).read_text()
    assert not (tmp_path / contract.GPU_TIMELINE).exists()
    assert _steps_logged(tmp_path) == [2, 4, 6]
    envj = json.loads((tmp_path / contract.ENV_JSON).read_text())
    assert envj["profile"] == {"requested_steps": 3, "first_step": 2, "profiled_steps": 3, "note": "steps 2..4",
                               "files": [contract.PROFILE_JSON, contract.PROFILE_TOP_OPS]}
    assert envj["env_toggles"][contract.PROFILE_STEPS_ENV]["key"] == "train.profile_steps"
    assert envj["env"][contract.PROFILE_STEPS_ENV] == "3"

    # the window holds the steps and nothing else: every op in it ran inside one of its steps (the
    # loop's logging, with its gate statistics, ran after the window closed)
    (window,) = windows
    events = window.prof.events()
    assert sum(e.name == STEP_RANGE for e in events) == 3
    in_window = [e for e in events if WINDOW_RANGE in _ancestors(e) and e.name != STEP_RANGE]
    assert in_window and all(STEP_RANGE in _ancestors(e) for e in in_window), \
        sorted({e.name for e in in_window if STEP_RANGE not in _ancestors(e)})


def test_the_heartbeats_end_the_windows_last_step_before_the_profiler_stops(tmp_path, monkeypatch):
    """Stopping the profiler is the profile's work, which the step times leave out: the window's last
    step's heartbeats end before it (a `profile` record), or the harness saw that step take the
    profiler's stop too, and the cpu_smoke nvtx phase's 4 steps read 'step times not believed'."""
    real = loop.profiled_window

    @contextlib.contextmanager
    def slow_to_stop(*args, **kwargs):
        with real(*args, **kwargs) as window:
            yield window
            time.sleep(0.5)  # after the steps, while the window closes

    monkeypatch.setattr(loop, "profiled_window", slow_to_stop)
    assert _train(tmp_path, "", steps=5, profile_steps=3) == 0
    recs = [json.loads(line) for line in (tmp_path / "heartbeat_rank0.jsonl").read_text().splitlines()]
    last_start = next(r["time"] for r in recs if r["step"] == 4)  # the window holds steps 2..4
    profile = next(r for r in recs if r["stage"] == "profile")
    assert profile["step"] == 4 and profile["time"] - last_start < 0.5, (profile, last_start)


def test_a_window_cut_by_the_end_of_the_run_or_never_reached(tmp_path):
    assert _train(tmp_path / "cut", "", steps=3, profile_steps=5) == 0
    got = json.loads((tmp_path / "cut" / contract.PROFILE_JSON).read_text())
    assert got["profiled_steps"] == 2 and got["first_step"] == 2
    status = json.loads((tmp_path / "cut" / contract.ENV_JSON).read_text())["profile"]
    assert status["note"] == "steps 2..3: 2 of the 5 asked, as the run ends at step 3"

    assert _train(tmp_path / "short", "", steps=1, profile_steps=2) == 0
    assert not (tmp_path / "short" / contract.PROFILE_JSON).exists()
    status = json.loads((tmp_path / "short" / contract.ENV_JSON).read_text())["profile"]
    assert status["profiled_steps"] == 0 and "the run ends at step 1, before its first steady step 2" in status["note"]


def test_a_nonfinite_loss_inside_the_window_logs_its_completed_steps_and_writes_no_profile(tmp_path):
    assert _train(tmp_path, "train.log_every=10 fault.spec=nan:step=4", steps=8, profile_steps=4) == 4
    # steps 2 and 3 completed inside the window, waiting to be logged: 3, the last completed, is
    assert _steps_logged(tmp_path) == [3]
    assert not (tmp_path / contract.PROFILE_JSON).exists()
    status = json.loads((tmp_path / contract.ENV_JSON).read_text())["profile"]
    assert status["note"] == "stopped inside the profiled window (steps 2..5): no profile written"
