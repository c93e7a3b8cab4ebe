"""Probe: the whole NSA core (bench/bench_nsa.py's 'auto' routes, random inputs), fwd+bwd, with
one switch off and on, alternated A B A B in one run, so that the shapes bound by the host (2k,
m7c_125m) show what the switch costs in host time and the long ones what it buys the whole core:

  tma    the selected branch's TMA loads (selection.TUNE['tma']);
  fused  the selected and window branches and the gated sum as one op
         (nsa.attention.backends.FUSE_GATED_BRANCHES, nsa.kernels.gated_branches).

    python3 bench/gpu/core_ab.py [--switch tma] [--shapes 2k m7c_125m 16k 64k] [--rounds 2]

Prints per shape and round: GPU ms (median, triton.testing.do_bench) and host ms (enqueueing
one step, bench_nsa._host_ms) for each setting, then the ratio of the medians on / off. Named
tma_ab.py until the fused switch came (its runs at a43e337 and cf1c17b, docs/measurements/
2026-11-23-f/tma_ab_*.log, switched TMA; the first also the window's band kernels' TMA loads,
removed after it). A switch dkv-dp-first (c01f1db, order_c01f1db.log) timed the gated dk/dv
kernel's product order before the gate moved into the log-sum-exp."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import bench_nsa as BN  # noqa: E402
from nsa.attention import backends  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.kernels import selection as S  # noqa: E402


SWITCHES = {  # name -> (read the setting, set it)
    "tma": (lambda: S.TUNE["tma"], lambda on: S.TUNE.__setitem__("tma", on)),
    "fused": (lambda: backends.FUSE_GATED_BRANCHES, lambda on: setattr(backends, "FUSE_GATED_BRANCHES", on)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2k", "m7c_125m", "16k", "64k"], choices=list(BN.SHAPES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--switch", default="tma", choices=sorted(SWITCHES))
    args = ap.parse_args()
    cfg = NSAConfig()
    read, switch = SWITCHES[args.switch]
    saved = read()
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
                    switch(on)
                    gpu, host = BN._bench(step), BN._host_ms(step)
                    res[on].append(gpu)
                    setting = f"{args.switch}={'on ' if on else 'off'}"
                    print(f"  {name:9} round {r} {setting}  {gpu:8.3f} ms  host {host:6.3f} ms", flush=True)
            off, on = statistics.median(res[False]), statistics.median(res[True])
            print(f"{name}: {meth} fwd+bwd, median off {off:.3f} ms, on {on:.3f} ms, on/off {on / off:.3f}x", flush=True)
            x = None
            torch.cuda.empty_cache()
    finally:
        switch(saved)


if __name__ == "__main__":
    main()
