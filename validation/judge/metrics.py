"""Metric extraction: one named function per metric, reading a finished run's artifacts.

training.csv metrics honour the gate's window ("last N steps"); the others (exit code, .HALT,
heartbeats, env.json, pytest counts) describe the whole run. A metric that cannot be computed
returns None, which a gate reports as NO_DATA rather than a number made up.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from validation.contract.files import window_rows


@dataclass
class RunData:
    """Everything a metric may read about one finished phase point."""

    out_dir: Path
    world_size: int = 1
    csv: pd.DataFrame | None = None
    heartbeats: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    exit_code: int | None = None
    timed_out: bool = False
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped a stalled run (None: no stall)."""
    halted: bool = False
    counts: dict[str, float] = field(default_factory=dict)
    """Phase-kind specific numbers: pytest outcome counts, preflight files, profiler results."""
    info: dict[str, Any] = field(default_factory=dict)
    """Phase-kind specific facts that are not numbers (the git SHA preflight read)."""


def _col(run: RunData, col: str, last: int | None) -> pd.Series | None:
    if run.csv is None or run.csv.empty:
        return None
    return window_rows(run.csv, last)[col]


def _series(col: str, reduce: str) -> Callable[[RunData, int | None], float | None]:
    """The window's ``reduce`` ('mean', 'max') of a training.csv column."""
    def f(run: RunData, last: int | None) -> float | None:
        s = _col(run, col, last)
        return None if s is None else float(getattr(s, reduce)())
    return f


def _mean(col: str) -> Callable[[RunData, int | None], float | None]:
    return _series(col, "mean")


def _stdev(run: RunData, last: int | None) -> float | None:
    s = _col(run, "toks_per_s", last)
    # population stdev, as the runbook's snippet (statistics.pstdev) computes it
    return None if s is None else float(statistics.pstdev(s.tolist()))


def _cv(run: RunData, last: int | None) -> float | None:
    s = _col(run, "toks_per_s", last)
    if s is None or s.mean() == 0:
        return None
    return float(statistics.pstdev(s.tolist()) / s.mean())


def _max(col: str) -> Callable[[RunData, int | None], float | None]:
    return _series(col, "max")


def _per_gpu(run: RunData, last: int | None) -> float | None:
    m = _mean("toks_per_s")(run, last)
    return None if m is None else m / max(run.world_size, 1)


def _mem_growth(run: RunData, last: int | None) -> float | None:
    """Reserved memory at the end of the window minus at its start: ~0 on a plateau."""
    s = _col(run, "mem_reserved_gb", last)
    return None if s is None or len(s) < 2 else float(s.iloc[-1] - s.iloc[0])


def _loss_finite(run: RunData, last: int | None) -> float | None:
    s = _col(run, "loss", None)
    return None if s is None else float(all(math.isfinite(v) for v in s))


def _steps(run: RunData, last: int | None) -> float | None:
    return None if run.csv is None or run.csv.empty else float(run.csv["step"].max())


def rank_step_times(heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Per rank, the median wall time between consecutive logged steps (heartbeat 'time')."""
    out = {}
    for rank, recs in heartbeats.items():
        by_step: dict[int, float] = {}
        for r in recs:
            if isinstance(r.get("step"), (int, float)) and isinstance(r.get("time"), (int, float)):
                by_step.setdefault(int(r["step"]), float(r["time"]))
        steps = sorted(by_step)
        gaps = [(by_step[b] - by_step[a]) / (b - a) for a, b in zip(steps, steps[1:]) if b > a]
        if gaps:
            out[rank] = statistics.median(gaps)
    return out


def _rank_ratio(run: RunData, last: int | None) -> float | None:
    if not run.heartbeats:
        return None
    if run.world_size < 2:
        return 1.0
    times = rank_step_times(run.heartbeats)
    if len(times) < run.world_size or min(times.values()) <= 0:
        return None
    return max(times.values()) / min(times.values())


def ranks_progressing(heartbeats: dict[int, list[dict[str, Any]]]) -> set[int]:
    """Ranks whose heartbeats show more than one distinct step."""
    return {r for r, recs in heartbeats.items() if len({x.get("step") for x in recs if "step" in x}) > 1}


def _idle_ranks(run: RunData, last: int | None) -> float | None:
    """Ranks of the world that made no step progress, or report ~0% GPU utilisation while
    another rank is busy (the seeds' FSDP run: GPU 0 at 99%, GPU 1 at 0%)."""
    if not run.heartbeats:
        return None
    idle = set(range(run.world_size)) - ranks_progressing(run.heartbeats)
    util = {r: _last_util(recs) for r, recs in run.heartbeats.items()}
    known = {r: u for r, u in util.items() if u is not None}
    if known and max(known.values()) >= 20:
        idle |= {r for r, u in known.items() if u < 5}
    return float(len(idle))


def _last_util(recs: list[dict[str, Any]]) -> float | None:
    for r in reversed(recs):
        u = r.get("gpu_util")
        if isinstance(u, (int, float)):
            return float(u)
    return None


def fallback_counters(run: RunData) -> dict[str, float]:
    """Fallback counters: the last heartbeat's ``fallbacks``/``fb_*`` counters summed over ranks."""
    totals: dict[str, float] = {}
    for recs in run.heartbeats.values():
        last: dict[str, float] = {}
        for r in recs:
            for k, v in _counter_items(r):
                last[k] = v
        for k, v in last.items():
            totals[k] = totals.get(k, 0.0) + v
    return totals


def _counter_items(rec: dict[str, Any]):
    fb = rec.get("fallbacks")
    if isinstance(fb, dict):
        for k, v in fb.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                yield str(k), float(v)
    for k, v in rec.items():
        if k.startswith("fb_") and isinstance(v, (int, float)) and not isinstance(v, bool):
            yield k, float(v)


def _fallbacks(run: RunData, last: int | None) -> float | None:
    if not run.heartbeats:
        return None
    return float(sum(fallback_counters(run).values()))


def _backends_recorded(run: RunData, last: int | None) -> float | None:
    if run.env is None:
        return None
    return float(bool(run.env.get("attention_backends")))


def _tokens_per_step(run: RunData, last: int | None) -> float | None:
    value = (run.env or {}).get("tokens_per_step")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(name: str) -> Callable[[RunData, int | None], float | None]:
    return lambda run, last: run.counts.get(name)


METRICS: dict[str, tuple[Callable[[RunData, int | None], float | None], str]] = {
    "toks_per_s_mean": (_mean("toks_per_s"), "mean global tokens/s over the window"),
    "toks_per_s_stdev": (_stdev, "population stdev of tokens/s over the window"),
    "toks_per_s_cv": (_cv, "stdev / mean of tokens/s over the window (steadiness)"),
    "toks_per_s_per_gpu": (_per_gpu, "mean tokens/s over the window divided by world size"),
    "step_time_s_mean": (_mean("step_time_s"), "mean step time over the window"),
    "loss_mean": (_mean("loss"), "mean loss over the window"),
    "loss_finite": (_loss_finite, "1 when every logged loss is finite"),
    "mem_reserved_gb_max": (_max("mem_reserved_gb"), "peak reserved memory over the window"),
    "mem_alloc_gb_max": (_max("mem_alloc_gb"), "peak allocated memory over the window"),
    "mem_growth_gb": (_mem_growth, "reserved memory growth across the window (plateau ~ 0)"),
    "steps_completed": (_steps, "last step logged in training.csv"),
    "exit_code": (lambda run, last: None if run.exit_code is None else float(run.exit_code), "trainer exit status"),
    "timed_out": (lambda run, last: float(run.timed_out), "1 when the harness killed the run at its timeout"),
    "halt": (lambda run, last: float(run.halted), "1 when a .HALT file exists"),
    "rank_step_time_ratio": (_rank_ratio, "slowest / fastest rank's median step time (heartbeats)"),
    "idle_ranks": (_idle_ranks, "ranks with no step progress or ~0% GPU use while another is busy"),
    "fallbacks_total": (_fallbacks, "sum of fallback counters in the last heartbeat of each rank"),
    "backends_recorded": (_backends_recorded, "1 when env.json records the attention backend per branch"),
    "tests_failed": (_count("tests_failed"), "pytest failures + errors in a pytest phase"),
    "tests_passed": (_count("tests_passed"), "pytest passes in a pytest phase"),
    "preflight_missing": (_count("preflight_missing"), "preflight artifacts that could not be recorded"),
    "profiled_steps": (_count("profiled_steps"), "steps measured under torch.profiler"),
    "nsa_ranges_found": (_count("nsa_ranges_found"), "NSA ranges (eager), kernel ops (nsa::*, compiled) and Triton kernels (graph replays) seen by the profiler"),
    "python_overhead_frac": (_count("python_overhead_frac"), "share of profiled CPU time outside aten ops"),
    "gpu_busy_frac": (_count("gpu_busy_frac"), "share of the profiled wall time the GPU ran work (validation/pace.py)"),
    "cuda_graphs": (_count("cuda_graphs"), "1 when the profiled steps were CUDA-graph replays"),
    "tokens_per_step": (_tokens_per_step, "global tokens per optimizer step (env.json)"),
}


#: the contract fields (training.csv columns, env.json keys, heartbeat 'fallbacks') a metric
#: reads beyond step, loss, tokens/s and heartbeats; a trainer whose files lack one cannot
#: provide the metric, and a gate on it is UNMEASURED rather than a made-up number
METRIC_INPUTS: dict[str, frozenset[str]] = {
    "step_time_s_mean": frozenset({"step_time_s"}),
    "mem_reserved_gb_max": frozenset({"mem_reserved_gb"}),
    "mem_alloc_gb_max": frozenset({"mem_alloc_gb"}),
    "mem_growth_gb": frozenset({"mem_reserved_gb"}),
    "fallbacks_total": frozenset({"fallbacks"}),
    "backends_recorded": frozenset({"attention_backends"}),
    "tokens_per_step": frozenset({"tokens_per_step"}),
}


#: the metrics a profile phase reads from the trainer's profile.json
PROFILE_METRICS = ("profiled_steps", "nsa_ranges_found", "python_overhead_frac", "gpu_busy_frac", "cuda_graphs")


def unprovided(lacking: frozenset[str]) -> dict[str, frozenset[str]]:
    """The metrics that read any of ``lacking``, each with the fields it misses."""
    return {m: needs & lacking for m, needs in METRIC_INPUTS.items() if needs & lacking}


def compute(name: str, run: RunData, last: int | None) -> float | None:
    value = METRICS[name][0](run, last)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
