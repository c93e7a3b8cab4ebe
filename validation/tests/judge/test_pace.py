"""Who sets the pace (validation/judge/pace.py): the step-time fit and the host-bound finding it
drives, on synthetic sweep records; and the GPU's busy share and idle gaps of one profiled window,
which the harness computes from the timeline a trainer leaves (and checks the trainer's own claim
against)."""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from nsa.contract import GPU_TIMELINE, PROFILE_JSON
from validation.judge.findings import throughput as findings
from validation.judge.metrics import RunData
from validation.judge.pace import HOST_BOUND_FIXED_SHARE, DeviceIdle, device_idle, fit_step_time
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.launch.kinds import read_profile_evidence

#: a timeline this project's trainer left on an H100 (nvtx, compiled, CUDA graphs; tests/unit)
RECORDED = Path(__file__).resolve().parents[3] / "tests" / "unit" / "data" / "gpu_timeline_h100_compiled.json.gz"

def _rec(phase, tokens, step_s, i, exit_code=0, accelerator="cuda"):
    return PhaseRecord(PointKey("rb", "cpu", phase, {"train.batch_size": i}), f"rb/cpu/{phase}/{i}", "train",
                       Status.PASS, "", sweep_index=i, params_order=["train.batch_size"], exit_code=exit_code,
                       metrics=Summary(tokens_per_step=tokens, step_time_s_mean=step_s, step_time_s_median=step_s,
                                       toks_per_s_mean=tokens / step_s),
                       out_dir=f"runs/{phase}/{i}", accelerator=accelerator)


#: the seed runbook's scaling sweep on two H200s before CUDA graphs (issue 12): 0.21-0.24 s per
#: step from 1,024 to 8,192 tokens per rank
FLAT = [(2048, 0.210), (4096, 0.214), (4096, 0.218), (8192, 0.226), (8192, 0.229), (16384, 0.240)]
#: the same sweep with CUDA graphs (docs/examples/nsa_ddp_a100/)
GRAPHED = [(2048, 0.03515), (4096, 0.03762), (4096, 0.03901), (8192, 0.04641), (8192, 0.04987), (16384, 0.06627)]
LINEAR = [(t, 2e-6 * t + 0.001) for t in (2048, 4096, 8192, 16384)]


def test_fit_recovers_fixed_cost_and_slope():
    fit = fit_step_time([(t, 0.2 + 1e-6 * t) for t in (1000, 2000, 4000, 8000)])
    assert fit.fixed_s == pytest.approx(0.2) and fit.per_token_s == pytest.approx(1e-6)
    assert fit.token_range == 8.0 and fit.fixed_share == pytest.approx(0.2 / 0.208)
    assert fit_step_time([(1000, 0.1), (2000, 0.2)]) is None          # too few points
    assert fit_step_time([(1000, 0.1)] * 3) is None                    # one token count
    falling = fit_step_time([(1000, 0.2), (2000, 0.19), (4000, 0.18)])  # a negative cost per token: noise
    assert falling.per_token_s < 0 and not falling.meaningful and not falling.host_bound


@pytest.mark.parametrize("points, fires", [(FLAT, True), (GRAPHED, False), (LINEAR, False)])
def test_host_bound_finding(points, fires):
    recs = [_rec("scaling_sweep", t, s, i) for i, (t, s) in enumerate(points)]
    out = findings.host_bound(recs)
    assert bool(out) is fires
    fit = fit_step_time(points)
    assert (fit.fixed_share >= HOST_BOUND_FIXED_SHARE) is fires
    if fires:
        (f,) = out
        assert f.severity == "warning" and f.phase == "scaling_sweep"
        assert "median step time 0.21-0.24 s while tokens per step grow 8.0x (2,048 -> 16,384)" in f.title
        assert f"{fit.fixed_s * 1e3:.1f} ± {fit.fixed_se * 1e3:.1f} ms fixed" in f.detail[0]
        assert "least squares over 6 points" in f.detail[0]
        assert "train.cuda_graphs" in f.detail[1]  # this project's trainer, on CUDA


def _warmed(phase, points, warmup_s=0.3, warm=2, steps=8):
    """Sweep records of runs whose first ``warm`` steps take ``warmup_s`` (a compile, a warm-up:
    the same at every point) and the rest the point's steady step time, with the mean and the
    median of the steps as the window's metrics compute them."""
    recs = []
    for i, (tokens, step_s) in enumerate(points):
        times = [warmup_s] * warm + [step_s] * (steps - warm)
        rec = _rec(phase, tokens, step_s, i)
        rec.metrics = dataclasses.replace(rec.metrics, step_time_s_mean=float(np.mean(times)),
                                          step_time_s_median=float(np.median(times)))
        recs.append(rec)
    return recs


def test_slow_warm_up_steps_make_no_host_bound_finding_of_a_sweep_whose_steps_grow_with_the_tokens():
    """A user's trainer whose first two steps of eight took 0.3 s at every batch size and whose
    other steps grew with the tokens (7.4, 13.8, 26.6 ms: the GPU sets the pace) was called
    host-bound ('the fixed cost is 80% of the step'): the fit read the mean step times, which the
    warm-up steps lift by the same amount at every point, a fixed cost per step that is not there.
    It reads the medians; a sweep whose steady steps are flat is still host-bound, warm-up or not."""
    assert findings.host_bound(_warmed("scaling_sweep", LINEAR)) == []
    [f] = findings.host_bound(_warmed("scaling_sweep", FLAT))
    assert "median step time 0.21-0.24 s" in f.title


def test_host_bound_ignores_crashed_points_and_one_token_count():
    recs = [_rec("bucket_sweep", 8192, s, i) for i, s in enumerate((0.2, 0.21, 0.22))]  # same tokens
    assert findings.host_bound(recs) == []
    recs = [_rec("scaling_sweep", t, s, i, exit_code=1 if i < 4 else 0) for i, (t, s) in enumerate(FLAT)]
    assert findings.host_bound(recs) == []  # two finished points are no sweep


def test_old_records_without_tokens_per_step_use_toks_times_step_time():
    recs = [_rec("scaling_sweep", t, s, i) for i, (t, s) in enumerate(FLAT)]
    for r in recs:
        r.metrics = dataclasses.replace(r.metrics, tokens_per_step=None)
    assert findings.host_bound(recs)
    assert np.isclose(findings._tokens_per_step(recs[0]), FLAT[0][0])


# --- device_idle: the GPU timeline of one profiled window -------------------------------------


def test_device_idle_counts_overlaps_once_clips_and_splits_gaps_by_length():
    # window 0..10,000 us over 2 steps; work [0,1000] and [500,4000] overlap (streams), then a
    # 1,500 us pause, [5500,9990], and a 10 us tail
    idle = device_idle([(500, 4000), (-50, 1000), (5500, 9990), (20_000, 30_000)], (0, 10_000), steps=2)
    assert idle.busy_frac == pytest.approx((4000 + 4490) / 10_000)
    assert idle.host_pause_ms == pytest.approx(1.5 / 2)  # the one gap of >= 1 ms, a step
    assert idle.launch_gap_ms == pytest.approx(0.010 / 2)
    assert idle.longest_gap_ms == pytest.approx(1.5)
    assert device_idle([], (0, 3000), steps=1) == DeviceIdle(0.0, 3.0, 0.0, 3.0)  # nothing ran: one long gap
    with pytest.raises(ValueError):
        device_idle([], (5, 5), steps=1)


def test_device_idle_agrees_with_the_trainers_busy_share_on_a_recorded_h100_timeline():
    """A timeline our trainer recorded on an H100 (compiled, CUDA graphs): the harness's busy
    share is the trainer's own (nsa/train/profile.py computes it from the same intervals)."""
    with gzip.open(RECORDED, "rt") as fh:
        data = json.load(fh)
    idle = device_idle([tuple(iv) for iv in data["device_intervals_us"]], tuple(data["window_us"]), steps=10)
    assert idle.busy_frac == pytest.approx(data["gpu_busy_frac"], abs=1e-9)
    assert 0 < idle.host_pause_ms and 0 < idle.launch_gap_ms


def _profile_files(out: Path, claimed: float | None, intervals, window=(0.0, 10_000.0), steps=2) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / PROFILE_JSON).write_text(json.dumps({
        "contract_version": 2, "profiled_steps": steps, "first_step": 3, "wall_s": 0.01, "gpu_busy_frac": claimed,
        "top_ops": [], "nsa_ranges": ["nsa.sel"], "python_overhead_frac": 0.5, "cuda_graphs": True, "device": "cuda"}))
    with gzip.open(out / GPU_TIMELINE, "wt") as fh:
        json.dump({"window_us": list(window), "device_intervals_us": [list(iv) for iv in intervals]}, fh)


def test_the_harness_gates_on_its_own_busy_share_and_refuses_a_claim_the_timeline_contradicts(tmp_path):
    """profile.json's gpu_busy_frac is the trainer's claim: the harness recomputes it from the
    timeline the trainer left beside it (the metric the gate reads) and names a claim that does
    not match as an error; a trainer that left no timeline is taken at its word."""
    intervals = [(0, 4000), (5500, 10_000)]  # busy 0.85, one 1.5 ms pause over 2 steps
    for claimed, errs in ((0.85, 0), (0.93, 1), (None, 0)):
        run, errors = RunData(tmp_path / str(claimed)), []
        _profile_files(run.out_dir, claimed, intervals)
        read_profile_evidence(run.out_dir, run, errors)
        assert run.counts["gpu_busy_frac"] == pytest.approx(0.85)
        assert run.counts["gpu_host_pause_ms"] == pytest.approx(0.75)
        assert len(errors) == errs, errors
        if errs:
            assert "says gpu_busy_frac 0.9300" in errors[0] and "gives 0.8500" in errors[0]
    run, errors = RunData(tmp_path / "no_timeline"), []
    _profile_files(run.out_dir, 0.93, intervals)
    (run.out_dir / GPU_TIMELINE).unlink()
    read_profile_evidence(run.out_dir, run, errors)
    assert run.counts["gpu_busy_frac"] == 0.93 and "gpu_host_pause_ms" not in run.counts and not errors
    (run.out_dir / GPU_TIMELINE).write_bytes(b"not gzip")
    read_profile_evidence(run.out_dir, run, errors)
    assert errors and "not a GPU timeline" in errors[0] and GPU_TIMELINE in errors[0]
