"""Where the GPU time of one NSA core forward+backward goes, kernel by kernel, beside the
per-stage table of bench/bench_nsa.py --breakdown (which times each stage alone and so cannot
show the gated sum, gradient sums, copies and layout changes between the stages).

The op nsa_core of bench/ops.py on random inputs; a few warm-up steps, then torch.profiler over
N steps; prints the CUDA kernels by total time (ms per step, share of the step) and the sum of
the kernels per step.

    python3 bench/core_profile.py [--shapes 16k 64k m7c@64k] [--steps 5] [--top 30]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_nsa import shape_of  # noqa: E402
from bench.inputs import random_inputs  # noqa: E402
from bench.ops import OPS  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402
from bench.train_throughput import kernel_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["16k", "64k"], help="bench/bench_nsa.py's shape names")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("core_profile.py needs a CUDA GPU")
    cfg = NSAConfig()
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    for name in args.shapes:
        x = random_inputs(*shape_of(name), cfg)
        fwd, leaves = OPS["nsa_core"].build(x, cfg)

        def step():
            torch.autograd.grad(fwd(), leaves, x.do)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        table = kernel_table(prof.events(), args.steps)
        total = sum(ms for _, _, ms, _ in table)
        print(f"## {name}: {total:.3f} ms of kernels per step ({args.steps} steps profiled)", flush=True)
        print(f"| {'ms/step':>8} | {'share':>6} | {'calls/step':>10} | kernel |")
        print("|---:|---:|---:|---|")
        for _, kernel, ms, calls in table[:args.top]:
            print(f"| {ms:8.3f} | {ms / total:6.1%} | {calls:10.1f} | {kernel[:110]} |", flush=True)
        del x, fwd, leaves
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
