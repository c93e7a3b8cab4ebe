"""Profiling on request through the artifact contract (nsa/contract.py, PROFILE_*): with
``train.profile_steps=N`` (env ``CONTRACT_PROFILE_STEPS``, the harness's switch) the trainer, once
steady (``Trainer.steady_step``: after its warm-up and, with CUDA graphs, the capture step), runs N
optimizer steps back to back under ``torch.profiler`` (never nsys), writes ``profile.json``,
``profile_top_ops.txt`` and, on a GPU, ``gpu_timeline.json.gz``, and goes on to its requested steps.

This is the computation of the harness's former in-process worker (validation/profile_phase.py
and validation/pace.py), moved here unchanged so that its numbers stay comparable:

* the window: a ``record_function`` range around the profiled steps only, with a device
  synchronize at its end inside the range; the loop logs, prints and checkpoints those steps
  after the window has closed (nsa/train/loop.py), so nothing but the steps runs in it;
* ``gpu_busy_frac`` (GPU only): the union of the device activity intervals (kernels, copies,
  fills: every profiler event of device type CUDA) clipped to the window, over the window's
  length; work overlapping on several streams counts once. Near 1 the GPU sets the pace, low
  the host launching work;
* ``nsa_ranges``: the profiler keys that attribute time to NSA: the model's ``nsa.*`` ranges
  (eager), the kernels' ``nsa::*`` custom ops (a compiled graph keeps them and drops
  record_function ranges) and, on CUDA, the NSA Triton kernels by name (all a CUDA-graph replay
  leaves);
* ``python_overhead_frac`` (information): the share of the profiled steps' CPU time outside aten
  ops. It counts every Triton and inductor launch as Python, so it is no measure of pace alone;
* ``top_ops``: the five ops with the most device time of their own (CPU time on CPU) per step,
  the trainer's own ``train.*`` stage ranges and this module's ranges left out.

Only rank 0 profiles and writes the files; the other ranks run the same steps back to back.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch

from .. import contract
from ..atomic import write_atomic
from . import strict_json

#: record_function names of the profiled window and of each step in it (not "nsa.": those
#: would count as NSA ranges)
WINDOW_RANGE = "profile.window"
STEP_RANGE = "profile.step"
#: ranges that are bookkeeping, not ops: left out of top_ops
NOT_OPS = ("profile.", "train.")
TOP_OPS = 5
TABLE_ROWS = 25
#: heads the second table of profile_top_ops.txt on CUDA (the first is by device time)
HOST_TABLE_HEADING = "By CPU time, ranges included (the host's side of the steps):"


# --- the measurements, as plain functions over numbers and profiler events ----------------------


def busy_fraction(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Length of the union of ``intervals`` clipped to ``window``, over the window's length."""
    lo, hi = window
    if hi <= lo:
        raise ValueError(f"empty window {window}")
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi and e > s)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (hi - lo)


def device_events(events) -> list:
    """The device-side events (kernels, copies, fills) of a ``torch.profiler`` run's
    ``events()``. Not the GPU-side copies of record_function ranges (``is_user_annotation``):
    Kineto stretches one over its range's first to last kernel, so counting it would cover every
    gap between the kernels of a step and report a launch-bound step as busy."""
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in events if e.device_type == cuda and not getattr(e, "is_user_annotation", False)]


def device_intervals(events) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every device event (``device_events``), on the clock of
    the profile's CPU events."""
    return [(e.time_range.start, e.time_range.end) for e in device_events(events)]


def nsa_attribution(keys: Iterable[str], kernel_names: Iterable[str] = frozenset()) -> list[str]:
    """The profiler keys that attribute time to NSA, sorted, each once: ``nsa.*`` ranges,
    ``nsa::*`` custom ops and the given kernel names."""
    kernels = set(kernel_names)
    return sorted({k for k in keys if k.startswith(("nsa.", "nsa::")) or k in kernels})


# --- the window ---------------------------------------------------------------------------------


@dataclass
class Window:
    """An open profiled window; ``step()`` marks one step in it. After the window closes,
    ``prof`` holds the profiler (None when this rank did not profile) and ``wall_s`` its length."""

    device: torch.device
    profiling: bool
    prof: object | None = None
    wall_s: float = 0.0

    def step(self):
        return torch.profiler.record_function(STEP_RANGE) if self.profiling else contextlib.nullcontext()


@contextlib.contextmanager
def profiled_window(device: torch.device, profiling: bool = True) -> Iterator[Window]:
    """Profile the body (the steps) with a device synchronize at its end, inside the window's
    range; when ``profiling`` is False (a rank that does not profile), only run it. An exception
    in the body closes the profiler without the synchronize."""
    window = Window(device, profiling)
    if not profiling:
        yield window
        return
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        with record_function(WINDOW_RANGE):
            yield window
            if cuda:
                torch.cuda.synchronize(device)
    window.wall_s = time.perf_counter() - t0
    window.prof = prof


# --- what is written ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TopOp:
    name: str
    ms_per_step: float


@dataclass(frozen=True)
class Profile:
    """profile.json: exactly the contract's PROFILE_FIELDS."""

    contract_version: int
    profiled_steps: int
    first_step: int
    wall_s: float
    gpu_busy_frac: float | None
    top_ops: list[TopOp]
    nsa_ranges: list[str]
    python_overhead_frac: float | None
    cuda_graphs: bool
    device: str


@dataclass(frozen=True)
class Timeline:
    """gpu_timeline.json.gz: what gpu_busy_frac was computed from."""

    window_us: tuple[float, float]
    device_intervals_us: list[tuple[float, float]]
    gpu_busy_frac: float


@dataclass
class ProfileStatus:
    """env.json's ``profile``: what was asked and what came of it."""

    requested_steps: int
    first_step: int
    profiled_steps: int = 0
    files: list[str] = field(default_factory=list)
    note: str = ""


def summarize(window: Window, steps: int, first_step: int, graphed: bool,
              kernel_names: Iterable[str] = ()) -> tuple[Profile, Timeline | None, str]:
    """The profile of a closed window of ``steps`` steps, its device timeline (CUDA only) and
    the profiler's table of ops."""
    cuda = window.device.type == "cuda"
    events = window.prof.key_averages()
    step_total = sum(e.cpu_time_total for e in events if e.key == STEP_RANGE)
    aten_self = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    timeline = None
    if cuda:
        raw = window.prof.events()
        # the host's range (wall time), not its GPU-side annotation (first to last kernel)
        span = next(e for e in raw if e.name == WINDOW_RANGE and e.device_type != torch.autograd.DeviceType.CUDA).time_range
        intervals = device_intervals(raw)
        timeline = Timeline((span.start, span.end), intervals, busy_fraction(intervals, (span.start, span.end)))

    def own(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    ops = sorted((e for e in events if own(e) > 0 and not e.key.startswith(NOT_OPS)), key=own, reverse=True)
    profile = Profile(
        contract_version=contract.VERSION,
        profiled_steps=steps,
        first_step=first_step,
        wall_s=window.wall_s,
        gpu_busy_frac=timeline.gpu_busy_frac if timeline else None,
        top_ops=[TopOp(e.key, own(e) / 1e3 / steps) for e in ops[:TOP_OPS]],
        nsa_ranges=nsa_attribution((e.key for e in events), kernel_names if cuda else ()),
        python_overhead_frac=max(0.0, 1.0 - aten_self / step_total) if step_total else None,
        cuda_graphs=graphed,
        device=window.device.type,
    )
    table = events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=TABLE_ROWS)
    if cuda:  # where a host-bound step's time goes: the host's side, ranges (train.*) included
        table += f"\n\n{HOST_TABLE_HEADING}\n" + events.table(sort_by="cpu_time_total", row_limit=TABLE_ROWS)
    return profile, timeline, table


def write(out_dir: Path, profile: Profile, timeline: Timeline | None, table: str) -> list[str]:
    """Write the files; returns their names. profile.json last, so that its presence means all."""
    out_dir = Path(out_dir)
    names = [contract.PROFILE_TOP_OPS]
    (out_dir / contract.PROFILE_TOP_OPS).write_text(table)
    if timeline is not None:
        with gzip.open(out_dir / contract.GPU_TIMELINE, "wt") as fh:
            fh.write(strict_json.dumps(dataclasses.asdict(timeline)))
        names.append(contract.GPU_TIMELINE)
    write_atomic(out_dir / contract.PROFILE_JSON, strict_json.dumps(dataclasses.asdict(profile), indent=1) + "\n")
    return [contract.PROFILE_JSON] + names


def cuda_kernel_names(device: torch.device) -> set[str]:
    """The NSA Triton kernels' names, on CUDA (importing them needs Triton); empty elsewhere."""
    if device.type != "cuda":
        return set()
    from ..kernels import triton_kernel_names

    return triton_kernel_names()
