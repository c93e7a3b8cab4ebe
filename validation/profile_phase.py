"""The NVTX/profiler attribution phase's worker: steps of the real trainer under
``torch.profiler`` (never nsys), writing ``profile.json`` and ``profile_top_ops.txt``.

Run by the harness as ``python -m validation.profile_phase --config tiny --steps 3 --out-dir D``
inside the phase's hard timeout, so it cannot hang the caller. It builds the trainer from the
config and the phase's overrides and environment (the same toggles, shape, dtype, micro-batches,
optimizer and compile setting as a train phase; its files go to D/trainer), runs one step
outside the profile (allocator, lazy init, compilation), then profiles ``Trainer.train_step``.
Ranges whose names start with ``nsa.`` (the model's own record_function / NVTX ranges, which
torch.compile drops) and the NSA kernels' custom ops (``nsa::*``, which a compiled graph keeps)
are counted; the share of the profiled step's CPU time spent outside aten ops is reported as Python
overhead. A step bound by the GPU spends its CPU time waiting inside the step's one host sync
(an aten copy), so a high share means the host, not the GPU, sets the pace.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m validation.profile_phase")
    p.add_argument("--config", required=True, help="trainer preset name or YAML path")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up step)")
    p.add_argument("--override", default="", help="space-separated dotted overrides, as for a train phase")
    return p.parse_args(argv)


def nsa_attribution(keys) -> list[str]:
    """The profiler keys that attribute time to NSA: the model's ``nsa.*`` ranges in eager mode,
    the kernels' ``nsa::*`` custom ops in a compiled graph (which drops record_function ranges)."""
    return sorted({k for k in keys if k.startswith(("nsa.", "nsa::"))})


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from torch.profiler import ProfilerActivity, profile, record_function

    from nsa.train.config import load_run_config
    from nsa.train.loop import Trainer

    trainer_dir = args.out_dir / "trainer"
    overrides = args.override.split() + [f"train.out_dir={trainer_dir}"]
    cfg, resolved = load_run_config(args.config, overrides)
    trainer = Trainer(cfg, resolved)
    try:
        cuda = trainer.device.type == "cuda"
        trainer.train_step(1)  # warm-up outside the profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            for step in range(2, args.steps + 2):
                with record_function("validation.step"):
                    trainer.train_step(step)
        wall = time.perf_counter() - t0
    finally:
        trainer.close()
    events = prof.key_averages()
    step_total = sum(e.cpu_time_total for e in events if e.key == "validation.step")
    aten_self = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    nsa_ranges = nsa_attribution(e.key for e in events)
    counts = {
        "profiled_steps": args.steps,
        "nsa_ranges_found": len(nsa_ranges),
        "python_overhead_frac": max(0.0, 1.0 - aten_self / step_total) if step_total else None,
        "wall_s": wall,
    }
    tc = cfg.train
    (args.out_dir / "profile_top_ops.txt").write_text(
        events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=25))
    (args.out_dir / "profile.json").write_text(json.dumps(
        {"counts": {k: v for k, v in counts.items() if v is not None}, "nsa_ranges": nsa_ranges,
         "device": trainer.device.type, "seq_len": tc.seq_len, "batch_size": tc.batch_size,
         "grad_accum": tc.grad_accum, "dtype": tc.dtype, "compile": tc.compile}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
