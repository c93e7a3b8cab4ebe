"""Probe: the whole NSA core (bench/bench_nsa.py's 'auto' routes, random inputs), fwd+bwd, with
the selected branch's TMA loads (selection.TUNE['tma']) off and on, alternated A B A B in one
run, so that the shapes bound by the host (2k, m7c_125m) show whether the descriptors cost host
time and the long ones what TMA buys the whole core. Its first run (commit a43e337,
docs/measurements/2026-11-23-f/tma_ab_a43e337.log) also switched the window's band kernels,
whose TMA loads were removed after it.

    python3 bench/gpu/tma_ab.py [--shapes 2k m7c_125m 16k 64k] [--rounds 2]

Prints per shape and round: GPU ms (median, triton.testing.do_bench) and host ms (enqueueing
one step, bench_nsa._host_ms) for each setting, then the ratio of the medians on / off."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import bench_nsa as BN  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.kernels import selection as S  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2k", "m7c_125m", "16k", "64k"], choices=list(BN.SHAPES))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cfg = NSAConfig()
    saved = S.TUNE["tma"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    try:
        for name in args.shapes:
            x = BN._inputs(*BN.SHAPES[name], cfg)
            methods = BN._methods(x, cfg, "triton")
            meth = next(m for m in methods if m.startswith("NSA core (auto"))
            fwd, leaves, _ = methods[meth]
            step = BN._fwd_bwd(fwd, leaves, x["do"])
            res = {False: [], True: []}
            for r in range(args.rounds):
                for on in (False, True):
                    S.TUNE["tma"] = on
                    gpu, host = BN._bench(step), BN._host_ms(step)
                    res[on].append(gpu)
                    print(f"  {name:9} round {r} tma={'on ' if on else 'off'}  {gpu:8.3f} ms  host {host:6.3f} ms",
                          flush=True)
            off, on = statistics.median(res[False]), statistics.median(res[True])
            print(f"{name}: {meth} fwd+bwd, median off {off:.3f} ms, on {on:.3f} ms, on/off {on / off:.3f}x", flush=True)
            x = None
            torch.cuda.empty_cache()
    finally:
        S.TUNE["tma"] = saved


if __name__ == "__main__":
    main()
