"""Seconds from an NSA attention layer's first forward + backward at a new shape to its end, with an
empty Triton cache (every kernel compiled, nothing autotuned), per dtype and head shape; each case
in its own process, so no case profits from another's compilations. The second call's time is
printed beside it (the work itself).

    python bench/first_call.py                                   # m7c and bench heads, fp32 and bf16, S 4096
    python bench/first_call.py --heads bench --dtypes fp32 --S 8192
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (query heads, KV heads, head dim)
HEADS = {"m7c": (12, 2, 64), "bench": (64, 4, 128)}


def one_case(heads: str, dtype: str, S: int) -> dict:
    """In this process: the first and second forward + backward of one layer (seconds)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from nsa.attention import NSAAttention
    from nsa.attention.config import NSAConfig

    HQ, H, K = HEADS[heads]
    # no layer graphs: the second call is the work itself, not their capture
    layer = NSAAttention(1024, HQ, H, K, NSAConfig(), 10000.0, graph_tokens=0).cuda()
    x = torch.randn(1, S, 1024, device="cuda", requires_grad=True)
    torch.cuda.synchronize()

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            o = layer(x)
        o.float().square().mean().backward()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    return {"heads": heads, "dtype": dtype, "S": S, "first_s": step(), "second_s": step()}


def run_case(heads: str, dtype: str, S: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        try:
            done = subprocess.run([sys.executable, __file__, "--one", heads, dtype, str(S)], env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"heads": heads, "dtype": dtype, "S": S, "error": f"still compiling after {timeout:.0f} s"}
    if done.returncode:
        return {"heads": heads, "dtype": dtype, "S": S, "error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--S", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=4, help="cases compiled at once (each its own process)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a case may take")
    ap.add_argument("--one", nargs=3, metavar=("HEADS", "DTYPE", "S"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one[0], args.one[1], int(args.one[2]))))
        return
    cases = [(h, d) for h in args.heads for d in args.dtypes]
    print(f"{len(cases)} cases, {args.jobs} at a time, S {args.S}")
    print("| heads (HQ, H, K) | dtype | first call, s | second call, s |")
    print("|---|---|---:|---:|")
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda c: run_case(c[0], c[1], args.S, args.timeout), cases):
            head = f"{r['heads']} {HEADS[r['heads']]}"
            if "error" in r:
                print(f"| {head} | {r['dtype']} | {r['error']} | |", flush=True)
            else:
                print(f"| {head} | {r['dtype']} | {r['first_s']:.1f} | {r['second_s']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
