"""Who sets the pace (validation/judge/pace.py): the step-time fit and the host-bound finding it
drives, on synthetic sweep records. (The GPU-busy share is the trainer's: tests/unit/test_train_profile.py.)"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from validation.judge.findings import throughput as findings
from validation.judge.pace import HOST_BOUND_FIXED_SHARE, fit_step_time
from validation.judge.record import PhaseRecord, PointKey, Status, Summary

def _rec(phase, tokens, step_s, i, exit_code=0, accelerator="cuda"):
    return PhaseRecord(PointKey("rb", "cpu", phase, {"train.batch_size": i}), f"rb/cpu/{phase}/{i}", "train",
                       Status.PASS, "", sweep_index=i, params_order=["train.batch_size"], exit_code=exit_code,
                       metrics=Summary(tokens_per_step=tokens, step_time_s_mean=step_s, toks_per_s_mean=tokens / step_s),
                       out_dir=f"runs/{phase}/{i}", accelerator=accelerator)


#: the seed runbook's scaling sweep on two H200s before CUDA graphs (issue 12): 0.21-0.24 s per
#: step from 1,024 to 8,192 tokens per rank
FLAT = [(2048, 0.210), (4096, 0.214), (4096, 0.218), (8192, 0.226), (8192, 0.229), (16384, 0.240)]
#: the same sweep with CUDA graphs (docs/examples/2026-11-23_nsa_ddp_a100__a100.md)
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
        assert "step time 0.21-0.24 s while tokens per step grow 8.0x (2,048 -> 16,384)" in f.title
        assert f"{fit.fixed_s * 1e3:.1f} ± {fit.fixed_se * 1e3:.1f} ms fixed" in f.detail[0]
        assert "least squares over 6 points" in f.detail[0]
        assert "train.cuda_graphs" in f.detail[1]  # this project's trainer, on CUDA


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
