"""The NVTX/profiler attribution phase's worker: steps of the real trainer under
``torch.profiler`` (never nsys), writing ``profile.json``, ``profile_top_ops.txt`` and, on a GPU,
``gpu_timeline.json.gz`` (the profiled window and every device activity interval).

Run by the harness as ``python -m validation.profile_phase --config tiny --steps 3 --out-dir D``
inside the phase's hard timeout, so it cannot hang the caller. It builds the trainer from the
config and the phase's overrides and environment (the same toggles, shape, dtype, micro-batches,
optimizer, compile and CUDA-graph settings as a train phase; its files go to D/trainer), runs the
steps until the trainer is steady (warm-up and, with CUDA graphs, the capture step) outside the
profile, then profiles ``Trainer.train_step``.

Measured:
* ``gpu_busy_frac`` (GPU only): the share of the profiled wall time during which the GPU ran
  anything (validation.pace.busy_fraction). This says who sets the pace: near 1 the GPU, low the
  host launching work.
* ``nsa_ranges_found``: what attributes time to NSA: the model's ``nsa.*`` ranges (eager), the
  kernels' custom ops ``nsa::*`` (a compiled graph keeps them, dropping record_function ranges)
  and the NSA Triton kernels by name (a CUDA-graph replay runs kernels with no host-side ops).
* ``python_overhead_frac`` (information): the share of the profiled steps' CPU time spent
  outside aten ops. It counts every Triton and inductor launch as Python, so it is no measure
  of pace on its own.
"""
from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

from validation.judge.pace import busy_fraction, device_intervals


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m validation.profile_phase")
    p.add_argument("--config", required=True, help="trainer preset name or YAML path")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up step)")
    p.add_argument("--override", default="", help="space-separated dotted overrides, as for a train phase")
    return p.parse_args(argv)


def nsa_attribution(keys, kernel_names: set[str] = frozenset()) -> list[str]:
    """The profiler keys that attribute time to NSA: the model's ``nsa.*`` ranges in eager mode,
    the kernels' ``nsa::*`` custom ops in a compiled graph (which drops record_function ranges),
    and the NSA Triton kernels by name (all a CUDA-graph replay leaves)."""
    return sorted({k for k in keys if k.startswith(("nsa.", "nsa::")) or k in kernel_names})


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from nsa.kernels import triton_kernel_names
    from nsa.train.config import load_run_config
    from nsa.train.loop import Trainer

    trainer_dir = args.out_dir / "trainer"
    overrides = args.override.split() + [f"train.out_dir={trainer_dir}"]
    cfg, resolved = load_run_config(args.config, overrides)
    trainer = Trainer(cfg, resolved)
    try:
        cuda = trainer.device.type == "cuda"
        first = trainer.steady_step
        for step in range(1, first):  # warm-up (and graph capture) outside the profile
            trainer.train_step(step)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            with record_function("validation.steps"):
                for step in range(first, first + args.steps):
                    with record_function("validation.step"):
                        trainer.train_step(step)
                if cuda:
                    torch.cuda.synchronize(trainer.device)
        wall = time.perf_counter() - t0
        graphed = trainer.graphed
    finally:
        trainer.close()
    events = prof.key_averages()
    step_total = sum(e.cpu_time_total for e in events if e.key == "validation.step")
    aten_self = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    nsa_ranges = nsa_attribution((e.key for e in events), triton_kernel_names() if cuda else set())
    counts = {
        "profiled_steps": args.steps,
        "nsa_ranges_found": len(nsa_ranges),
        "python_overhead_frac": max(0.0, 1.0 - aten_self / step_total) if step_total else None,
        "cuda_graphs": float(graphed),
        "wall_s": wall,
    }
    if cuda:
        raw = prof.events()
        window = next(e for e in raw if e.name == "validation.steps").time_range
        intervals = device_intervals(raw)
        counts["gpu_busy_frac"] = busy_fraction(intervals, (window.start, window.end))
        with gzip.open(args.out_dir / "gpu_timeline.json.gz", "wt") as fh:
            json.dump({"window_us": [window.start, window.end], "device_intervals_us": intervals,
                       "gpu_busy_frac": counts["gpu_busy_frac"]}, fh)
    tc = cfg.train
    # the ops with the most time of their own, for the report (the full table is in profile_top_ops.txt)
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    top = sorted((e for e in events if own(e) > 0 and not e.key.startswith(("validation.", "train."))), key=own, reverse=True)
    top_ops = [f"{e.key[:60]} {own(e) / 1e3 / args.steps:.2f} ms/step" for e in top[:5]]
    (args.out_dir / "profile_top_ops.txt").write_text(
        events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=25))
    (args.out_dir / "profile.json").write_text(json.dumps(
        {"counts": {k: v for k, v in counts.items() if v is not None}, "nsa_ranges": nsa_ranges, "top_ops": top_ops,
         "device": trainer.device.type, "seq_len": tc.seq_len, "batch_size": tc.batch_size,
         "grad_accum": tc.grad_accum, "dtype": tc.dtype, "compile": tc.compile,
         "cuda_graphs": trainer.graph_plan.reason, "first_profiled_step": first}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
