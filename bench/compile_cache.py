"""Seconds to the end of a compiled model's first training step, in a process with an empty
compile cache and then in a second process on the cache the first one left (torch's FX graph and
AOTAutograd caches and Triton's, all in one fresh directory), with torch's AOTAutograd cache
counters of each process: what a user pays again at every restart of a compiled run.

    python bench/compile_cache.py                         # m7c_125m, NSA, 4096 tokens, recomputing
    python bench/compile_cache.py --kinds nsa dense --S 32768 --recompute-tokens 32768

``--recompute-tokens`` (default: S) sets nsa.attention.compress.RECOMPUTE_TOKENS, from which the
compiled NSA layer runs under a selective-checkpointing policy (nsa.attention.checkpointed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_process(kind: str, S: int, model_name: str, recompute_tokens: int) -> dict:
    """In this process: the first compiled step's seconds and the AOTAutograd cache counters."""
    sys.path.insert(0, str(ROOT))
    import torch
    from torch._dynamo.utils import counters

    from bench.nsa_vs_dense import model_step
    from nsa.attention import compress

    compress.RECOMPUTE_TOKENS = recompute_tokens
    _, run = model_step(kind, S, model_name, torch.device("cuda"), compiled=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return {"first_step_s": round(time.perf_counter() - start, 1),
            "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=["nsa"], choices=["nsa", "dense"])
    ap.add_argument("--S", type=int, default=4096, help="tokens of the step (batch 1)")
    ap.add_argument("--model", default="m7c_125m")
    ap.add_argument("--recompute-tokens", type=int, default=None, help="RECOMPUTE_TOKENS (default: S)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds a process may take")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one process's case, print JSON
    args = ap.parse_args()
    recompute = args.recompute_tokens or args.S
    if args.one:
        print(json.dumps(one_process(args.one, args.S, args.model, recompute)))
        return
    for kind in args.kinds:
        with tempfile.TemporaryDirectory(prefix="nsa_compile_cache_") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
            for label in ("cold cache", "warm cache"):
                cmd = [sys.executable, __file__, "--one", kind, "--S", str(args.S), "--model", args.model,
                       "--recompute-tokens", str(recompute)]
                try:
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"{kind} S={args.S} {label}: over {args.timeout:.0f} s", flush=True)
                    break
                lines = done.stdout.strip().splitlines()
                if done.returncode or not lines:
                    print(f"{kind} S={args.S} {label}: exit {done.returncode}\n{done.stderr[-2000:]}", flush=True)
                    break
                result = json.loads(lines[-1])
                print(f"{kind} S={args.S} {label}: first compiled step {result['first_step_s']} s, "
                      f"AOTAutograd cache {result['aot_autograd']}", flush=True)


if __name__ == "__main__":
    main()
