"""Idle gaps of a profiled training run's GPU timeline (the trainer's gpu_timeline.json.gz and
profile.json, nsa/train/profile.py): gpu_busy_frac, idle ms per profiled step by gap length,
the step time from training.csv, and the largest gaps with their offset in the window.

    python bench/gpu/timeline_gaps.py RUN_DIR [--top 12]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

BINS = ((5, "<5 us"), (20, "5-20 us"), (100, "20-100 us"), (1000, "0.1-1 ms"), (float("inf"), ">= 1 ms"))


def merged(intervals, window):
    """The union of the device intervals clipped to the window, as sorted [start, end] lists."""
    lo, hi = window
    out = []
    for a, b in sorted(intervals):
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    timeline = json.loads(gzip.open(args.run / "gpu_timeline.json.gz").read())
    profile = json.loads((args.run / "profile.json").read_text())
    steps = profile["profiled_steps"]
    lo, hi = timeline["window_us"]
    busy = merged(timeline["device_intervals_us"], (lo, hi))
    edges = [lo] + [x for a, b in busy for x in (a, b)] + [hi]
    gaps = [(edges[i + 1] - edges[i], edges[i]) for i in range(0, len(edges), 2)]
    rows = list(csv.DictReader(open(args.run / "training.csv")))
    step_s = sorted(float(r["step_time_s"]) for r in rows[-steps:])[steps // 2]
    print(f"{args.run.name}: gpu_busy_frac {timeline['gpu_busy_frac']:.4f}, window {(hi - lo) / 1e3 / steps:.2f} ms "
          f"a profiled step, median step {step_s * 1e3:.2f} ms unprofiled (training.csv)")
    idle = {label: 0.0 for _, label in BINS}
    for g, _ in gaps:
        idle[next(label for bound, label in BINS if g < bound)] += g
    print("  idle ms a step by gap length: " + ", ".join(f"{k} {v / 1e3 / steps:.2f}" for k, v in idle.items()))
    print("  top ops:", "; ".join(f"{o['name'][:40]} {o['ms_per_step']:.2f}" for o in profile["top_ops"]))
    for g, at in sorted(gaps, reverse=True)[:args.top]:
        print(f"  gap {g / 1e3:6.2f} ms at {(at - lo) / 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
