"""Memory that keeps growing: which rank, how fast, and when it would run out at that rate.

A rank's series is its memory at each logged step: rank 0's reserved memory from training.csv
(``mem_reserved_gb``, else ``mem_alloc_gb``), every other rank's (and rank 0's, where the CSV has
neither) from its heartbeats' ``mem_alloc_gb`` (the largest reading of each step: the records of
one step are its stages). Memory belongs to a process: of a trainer that resumed in place, only
the steps of its last process count (those since the file's last rerun, and in the heartbeats
those of the last ``pid``). A series grows when, over its logged steps after the first quarter
(the allocator's warm-up, when memory legitimately climbs to its working set):

* the medians of GROWTH_BLOCKS consecutive blocks of those steps each lie above the one before
  (medians: one spike moves none of them; a one-off step up that then holds flat is a plateau
  again, not growth that goes on), and
* the rise from the first block's median to the last's exceeds MIN_RISE_GB (below it, one more
  segment of the allocator looks the same) and RISE_NOISE times the scatter of the steps around the
  fitted line (median absolute deviation: noise on a plateau is no growth).

The rate is the Theil-Sen slope over those steps (the median of the slopes between pairs of
steps, which one spike does not move), in GiB per 1000 steps. Where env.json says how much memory
a device has (``device_mem_gb``), the step at which the fitted line would reach it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from nsa.contract import TRAINING_CSV, heartbeat_name
from validation.contract.reruns import Rerun

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd

#: the share of the logged steps at a run's start left out (the allocator's warm-up)
WARMUP_SHARE = 0.25
#: consecutive blocks of the remaining steps whose medians must each rise
GROWTH_BLOCKS = 4
#: logged steps each block needs at least
BLOCK_MIN_STEPS = 3
#: GiB the memory must rise at least over the steps judged (the CUDA caching allocator reserves
#: in segments of 2 and 20 MiB; a CPU process's resident set wanders by a few MiB over the CPU
#: smoke runbook's 40-step long_run: `nsa-validate run --phase long_run` shows it)
MIN_RISE_GB = 0.01
#: the rise must exceed this many times the robust scatter around the fitted line
RISE_NOISE = 3.0
#: the normal distribution's MAD-to-stdev factor
MAD_SCALE = 1.4826
#: at most this many steps enter the pairwise slopes (evenly spaced): a long run stays quick
FIT_POINTS = 200


@dataclass(frozen=True)
class MemoryGrowth:
    """One rank's memory that kept growing over its logged steps."""

    rank: int
    source: str
    """Where its series comes from: 'training.csv mem_reserved_gb', 'heartbeat mem_alloc_gb'."""
    first_step: int
    last_step: int
    """The steps judged (after the warm-up)."""
    start_gb: float
    end_gb: float
    """The fitted line at the first and the last step judged."""
    gb_per_1k_steps: float
    """The fitted rate."""
    device_gb: float | None = None
    """One device's memory (env.json device_mem_gb), where the trainer said."""
    runs_out_at: int | None = None
    """The step at which the fitted line reaches ``device_gb``."""

    def text(self) -> str:
        out = (f"rank {self.rank}: {self.gb_per_1k_steps:.3g} GiB per 1000 steps ({self.source}, fitted: "
               f"{self.start_gb:.4g} -> {self.end_gb:.4g} GiB over steps {self.first_step}-{self.last_step})")
        if self.runs_out_at is not None:
            out += f"; at this rate it reaches the device's {self.device_gb:g} GiB at about step {self.runs_out_at:,}"
        return out


@dataclass(frozen=True)
class Fit:
    """A growing series: the steps judged and the line fitted over them."""

    first_step: int
    last_step: int
    start_gb: float
    end_gb: float
    slope: float
    """GiB per step."""
    intercept: float


def growth(steps: Sequence[int], gb: Sequence[float]) -> Fit | None:
    """The fit of a series that kept growing by the module's rule, else None."""
    rows = sorted((int(s), float(v)) for s, v in zip(steps, gb) if v is not None and math.isfinite(v))
    rows = rows[math.ceil(len(rows) * WARMUP_SHARE):]
    if len(rows) < GROWTH_BLOCKS * BLOCK_MIN_STEPS:
        return None
    size = len(rows) / GROWTH_BLOCKS
    medians = [statistics.median(v for _, v in rows[round(i * size):round((i + 1) * size)])
               for i in range(GROWTH_BLOCKS)]
    if not all(b > a for a, b in zip(medians, medians[1:])):
        return None
    slope, intercept = _theil_sen(rows)
    scatter = MAD_SCALE * statistics.median(abs(v - (intercept + slope * s)) for s, v in rows)
    rise = medians[-1] - medians[0]
    if slope <= 0 or rise < MIN_RISE_GB or rise <= RISE_NOISE * scatter:
        return None
    first, last = rows[0][0], rows[-1][0]
    return Fit(first, last, intercept + slope * first, intercept + slope * last, slope, intercept)


def _theil_sen(rows: list[tuple[int, float]]) -> tuple[float, float]:
    pts = rows if len(rows) <= FIT_POINTS else [rows[round(i * (len(rows) - 1) / (FIT_POINTS - 1))]
                                                for i in range(FIT_POINTS)]
    slope = statistics.median((v2 - v1) / (s2 - s1) for i, (s1, v1) in enumerate(pts) for s2, v2 in pts[i + 1:]
                              if s2 != s1)
    return slope, statistics.median(v - slope * s for s, v in pts)


def rank_series(csv: pd.DataFrame | None, heartbeats: dict[int, list[dict[str, Any]]],
                reruns: dict[str, list[Rerun]] | None = None) -> dict[int, tuple[str, list[int], list[float]]]:
    """Per rank, (source, steps, GiB): rank 0's from training.csv, the others' (and rank 0's where
    the CSV holds no memory) from the heartbeats, each of the last process only (the module's
    docstring; ``reruns``: per file, as the readers found them)."""
    reruns = reruns or {}
    out: dict[int, tuple[str, list[int], list[float]]] = {}
    for col in ("mem_reserved_gb", "mem_alloc_gb"):
        if csv is not None and col in csv and csv[col].notna().any():
            rows = csv[csv["step"] >= _since(reruns.get(TRAINING_CSV))]
            out[0] = (f"training.csv {col}", rows["step"].astype(int).tolist(), rows[col].astype(float).tolist())
            break
    for rank, recs in heartbeats.items():
        if rank in out:
            continue
        since = _since(reruns.get(heartbeat_name(rank)))
        pids = [r["pid"] for r in recs if _number(r.get("pid"))]
        peak: dict[int, float] = {}
        for r in recs:
            if pids and r.get("pid") != pids[-1]:
                continue
            step, mem = r.get("step"), r.get("mem_alloc_gb")
            if _number(step) and _number(mem) and step >= since:
                peak[int(step)] = max(peak.get(int(step), -math.inf), float(mem))
        if peak:
            out[rank] = ("heartbeat mem_alloc_gb", sorted(peak), [peak[s] for s in sorted(peak)])
    return out


def _since(reruns: list[Rerun] | None) -> int:
    """The first step of a file's last process: where its last rerun began (1 without one)."""
    return reruns[-1].first if reruns else 1


def growing_ranks(csv: pd.DataFrame | None, heartbeats: dict[int, list[dict[str, Any]]],
                  env: dict[str, Any] | None, reruns: dict[str, list[Rerun]] | None = None) -> list[MemoryGrowth]:
    """Every rank whose memory kept growing, with when it would run out where env.json says how
    much memory a device has."""
    device = (env or {}).get("device_mem_gb")
    device = float(device) if _number(device) and device > 0 else None
    out = []
    for rank, (source, steps, gb) in sorted(rank_series(csv, heartbeats, reruns).items()):
        fit = growth(steps, gb)
        if fit is None:
            continue
        runs_out = None if device is None else max(fit.last_step, math.ceil((device - fit.intercept) / fit.slope))
        out.append(MemoryGrowth(rank, source, fit.first_step, fit.last_step, round(fit.start_gb, 6),
                                round(fit.end_gb, 6), round(fit.slope * 1000, 6), device, runs_out))
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
