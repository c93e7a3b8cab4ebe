"""Memory that keeps growing (validation/judge/memory.py): which rank, how fast, when it would run
out; never a plateau, its noise, the allocator's warm-up, one spike or a one-off step up."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from validation.contract.reruns import Rerun
from validation.judge.memory import growing_ranks, growth
from validation.tests.conftest import train_phase

#: the resident set (GiB) of this project's trainer over the CPU smoke runbook's long_run, 40 steps
#: (2026-11-27): a creep of 2.3 MiB in steps of a few KiB and a dip, no leak
CPU_SMOKE_LONG_RUN = [
    0.3862, 0.387833, 0.387836, 0.388081, 0.388252, 0.388313, 0.388317, 0.388317, 0.388317, 0.388317, 0.388325,
    0.388325, 0.388325, 0.388325, 0.388325, 0.388332, 0.388332, 0.388332, 0.388546, 0.388546, 0.388546, 0.388546,
    0.388546, 0.388546, 0.38855, 0.388554, 0.388554, 0.388554, 0.388252, 0.388283, 0.388283, 0.388283, 0.388374,
    0.388374, 0.388374, 0.388374, 0.388374, 0.388374, 0.388374, 0.388374]


def _steps(n):
    return list(range(1, n + 1))


def test_the_cpu_smoke_runs_resident_set_is_no_growth():
    assert growth(_steps(40), CPU_SMOKE_LONG_RUN) is None


@pytest.mark.parametrize("name, series", [
    ("a noisy plateau", [20.0 + random.Random(1).gauss(0, 0.05) for _ in range(200)]),
    ("the allocator's warm-up, then flat", [min(20.0, 2.0 + 3.0 * s) for s in range(1, 101)]),
    ("one spike on a plateau", [20.0 + (5.0 if s == 70 else 0.0) for s in range(1, 101)]),
    ("a one-off step up that then holds", [20.0 + (2.0 if s > 60 else 0.0) for s in range(1, 101)]),
    ("memory that falls", [30.0 - 0.01 * s for s in range(1, 101)]),
])
def test_no_growth_where_memory_holds(name, series):
    assert growth(_steps(len(series)), series) is None, name


def test_a_steady_leak_under_noise_and_a_spike_is_found_with_its_rate():
    rnd = random.Random(7)
    series = [10.0 + 0.004 * s + rnd.gauss(0, 0.01) + (3.0 if s == 150 else 0.0) for s in range(1, 301)]
    fit = growth(_steps(300), series)
    assert fit is not None and fit.first_step == 76 and fit.last_step == 300
    assert fit.slope * 1000 == pytest.approx(4.0, rel=0.05)


def test_a_staircase_of_allocator_segments_is_growth():
    # 20 MiB more reserved every 10 steps: the caching allocator's large segments
    series = [4.0 + 0.01953125 * (s // 10) for s in range(1, 201)]
    fit = growth(_steps(200), series)
    assert fit is not None and fit.slope * 1000 == pytest.approx(1.953, rel=0.05)


def test_too_few_steps_or_too_small_a_rise_is_no_growth():
    assert growth(_steps(15), [1.0 + 0.1 * s for s in range(15)]) is None  # 12 steps after warm-up are needed
    assert growth(_steps(100), [1.0 + 0.00005 * s for s in range(100)]) is None  # 4 MiB in all


def test_which_ranks_grow_and_when_they_run_out():
    csv = pd.DataFrame({"step": _steps(100), "mem_reserved_gb": [20.0 + 0.05 * s for s in range(1, 101)],
                        "mem_alloc_gb": [10.0] * 100})
    flat = [{"time": s, "step": s, "stage": st, "mem_alloc_gb": 8.0 + (2.0 if st == "backward" else 0.0)}
            for s in range(1, 101) for st in ("forward", "backward")]
    leaking = [{"time": s, "step": s, "mem_alloc_gb": 8.0 + 0.01 * s} for s in range(1, 101)]
    grown = growing_ranks(csv, {0: flat, 1: flat, 2: leaking}, {"device_mem_gb": 80.0})
    assert [(g.rank, g.source) for g in grown] == [(0, "training.csv mem_reserved_gb"), (2, "heartbeat mem_alloc_gb")]
    assert grown[0].gb_per_1k_steps == pytest.approx(50.0) and grown[0].runs_out_at == 1200  # 20 + 0.05 x 1200 = 80
    assert grown[1].runs_out_at == 7200
    assert grown[0].text() == ("rank 0: 50 GiB per 1000 steps (training.csv mem_reserved_gb, fitted: 21.3 -> 25 GiB "
                               "over steps 26-100); at this rate it reaches the device's 80 GiB at about step 1,200")
    assert growing_ranks(csv, {}, None)[0].runs_out_at is None


def test_a_leaking_trainer_gets_a_warning_naming_rank_rate_and_step(fake_run):
    run = fake_run([train_phase(fault="leak:mb=50", steps=40, env={"NSA_FAKE_WORLD": "2"})])
    warnings = [f for f in run.findings("warning") if f.startswith("memory keeps growing")]
    assert len(warnings) == 1, run.findings()
    assert warnings[0].startswith("memory keeps growing in baseline_ddp [default]: ranks 0, 1, up to 48.8 GiB per "
                                  "1000 steps (rank ")
    assert "at this rate rank 0 reaches the device's 80 GiB at about step 1,618" in warnings[0]
    assert "rank 1: 48.8 GiB per 1000 steps (heartbeat mem_alloc_gb, fitted: " in warnings[0]
    assert "Memory kept growing at the rate the finding gives" in run.report
    assert run.record.status == "PASS"  # a finding, no verdict: the phase's gates judge


def test_a_trainer_with_flat_memory_has_no_memory_finding(fake_run):
    run = fake_run([train_phase(steps=40)])
    assert not [f for f in run.findings() if "memory" in f]


def test_of_a_trainer_resumed_in_place_only_its_last_process_counts():
    """Memory belongs to a process: a trainer that leaked until step 40 and resumed in place from
    step 30 starts low again. Read across the restart, the block medians fell and rose (no growth:
    the leak went unseen); read from the last process's steps, it grows at its rate."""
    old = [(s, 2.0 + 0.01 * s) for s in range(1, 41)]
    new = [(s, 0.5 + 0.01 * (s - 30)) for s in range(31, 61)]
    rows = old[:30] + new
    csv = pd.DataFrame({"step": [s for s, _ in rows], "mem_reserved_gb": [v for _, v in rows]})
    beats = [{"step": s, "pid": 1, "mem_alloc_gb": v} for s, v in old[:30]] + \
            [{"step": s, "pid": 2, "mem_alloc_gb": v} for s, v in new]
    reruns = {"training.csv": [Rerun(31, 40, 10)], "heartbeat_rank1.jsonl": [Rerun(31, 40, 10)]}
    assert growing_ranks(csv, {}, None) == []
    grown = growing_ranks(csv, {1: beats}, None, reruns)
    assert [(g.rank, g.first_step, g.last_step, g.gb_per_1k_steps) for g in grown] == [
        (0, 39, 60, pytest.approx(10.0)), (1, 39, 60, pytest.approx(10.0))]
    # the heartbeats' pid says which records are the last process's where no rerun shows
    assert [(g.rank, g.first_step) for g in growing_ranks(None, {1: beats}, None)] == [(1, 39)]


def test_one_growing_rank_is_named_with_its_rate(fake_run):
    run = fake_run([train_phase(fault="leak:mb=50", steps=40)])
    warnings = [f for f in run.findings("warning") if f.startswith("memory keeps growing")]
    assert warnings and warnings[0].split("\n")[0] == (
        "memory keeps growing in baseline_ddp [default]: rank 0 at 48.8 GiB per 1000 steps; at this rate rank 0 "
        "reaches the device's 80 GiB at about step 1,618")
