"""Idle gaps of a profiled training run's GPU timeline (the trainer's gpu_timeline.json.gz and
profile.json): the busy share as the harness computes it (validation/judge/pace.py), idle ms per
profiled step by gap length, the step time from training.csv, and the largest gaps with their
offset in the window.

    python bench/gpu/timeline_gaps.py RUN_DIR [--top 12]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation.contract.files import read_gpu_timeline, read_profile  # noqa: E402
from validation.judge.pace import device_idle, idle_gaps  # noqa: E402

BINS = ((5, "<5 us"), (20, "5-20 us"), (100, "20-100 us"), (1000, "0.1-1 ms"), (float("inf"), ">= 1 ms"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    profile, timeline = read_profile(args.run), read_gpu_timeline(args.run)
    if profile is None or timeline is None:
        sys.exit(f"{args.run}: no profile.json and gpu_timeline.json.gz (a GPU run asked for a profile leaves both)")
    steps = profile.profiled_steps
    (lo, hi), gaps = timeline.window_us, idle_gaps(timeline.intervals_us, timeline.window_us)
    idle = device_idle(timeline.intervals_us, timeline.window_us, steps)
    with open(args.run / "training.csv") as fh:
        rows = list(csv.DictReader(fh))
    step_s = sorted(float(r["step_time_s"]) for r in rows[-steps:])[steps // 2]
    print(f"{args.run.name}: gpu_busy_frac {idle.busy_frac:.4f} (profile.json: {profile.gpu_busy_frac}), window "
          f"{(hi - lo) / 1e3 / steps:.2f} ms a profiled step, median step {step_s * 1e3:.2f} ms unprofiled (training.csv)")
    by_length = {label: 0.0 for _, label in BINS}
    for _, g in gaps:
        by_length[next(label for bound, label in BINS if g < bound)] += g
    print("  idle ms a step by gap length: " + ", ".join(f"{k} {v / 1e3 / steps:.2f}" for k, v in by_length.items()))
    print("  top ops:", "; ".join(profile.top_ops))
    for at, g in sorted(gaps, key=lambda gap: -gap[1])[:args.top]:
        print(f"  gap {g / 1e3:6.2f} ms at {(at - lo) / 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
