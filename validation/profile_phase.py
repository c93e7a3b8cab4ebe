"""The NVTX/profiler attribution phase's worker: a few training steps of the NSA model under
``torch.profiler`` (never nsys), writing ``profile.json`` and ``profile_top_ops.txt``.

Run by the harness as ``python -m validation.profile_phase --config tiny --steps 3 --out-dir D``
inside the phase's hard timeout, so it cannot hang the caller. It reads only model.* and
train.seq_len/train.batch_size from the overrides; the rest of the trainer config does not change
what is measured here. Ranges whose names start with ``nsa.`` (the model's own record_function /
NVTX ranges) are counted; the share of CPU time spent outside aten ops is reported as Python
overhead.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m validation.profile_phase")
    p.add_argument("--config", required=True)
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--override", default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from nsa.model import NSATransformer
    from nsa.model.config import load_model_config

    items = args.override.split()
    model_items = [i for i in items if i.startswith("model.")]
    train = dict(i.split("=", 1) for i in items if i.startswith("train.") and "=" in i)
    seq_len, batch = int(train.get("train.seq_len", 64)), int(train.get("train.batch_size", 1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = load_model_config(args.config, model_items)
    model = NSATransformer(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen).to(device)

    def step() -> None:
        with record_function("validation.forward"):
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        with record_function("validation.backward"):
            loss.backward()
        with record_function("validation.optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    step()  # warm-up outside the profile (allocator, lazy init)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            with record_function("validation.step"):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    step_total = sum(e.cpu_time_total for e in events if e.key == "validation.step")
    aten_self = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
    nsa_ranges = sorted({e.key for e in events if e.key.startswith("nsa.")})
    counts = {
        "profiled_steps": args.steps,
        "nsa_ranges_found": len(nsa_ranges),
        "python_overhead_frac": max(0.0, 1.0 - aten_self / step_total) if step_total else None,
        "wall_s": wall,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    sort_key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    (args.out_dir / "profile_top_ops.txt").write_text(events.table(sort_by=sort_key, row_limit=25))
    (args.out_dir / "profile.json").write_text(json.dumps(
        {"counts": {k: v for k, v in counts.items() if v is not None}, "nsa_ranges": nsa_ranges,
         "device": device, "seq_len": seq_len, "batch_size": batch}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
