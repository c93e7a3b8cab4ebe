"""Seconds Triton takes to compile the band kernels (nsa.kernels.band_attention: forward and dq)
for sm_90, on this machine, without a GPU: the tiles tuned for bf16 against the small float32
tiles (FP32_SMALL_TILES), float32 inputs, the compressed branch of the m7c shape (2 KV heads of 6
query heads, l=32, d=16). Each compile gets an empty Triton cache.

    python bench/compile_offline.py                       # head dim 64, strict products (tf32x3)
    python bench/compile_offline.py --K 128 --precision tf32    # or ieee: FMAs, no tensor cores
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARGS = {
    "fwd": ("q", "k", "v", "o", "lse"),
    "dq": ("q", "k", "v", "o", "do", "lse", "delta", "dq"),
}


def compile_seconds(kind: str, tiles: tuple[int, int, int, int], K: int, precision: str) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nsa.kernels import band_attention as band

    kernel = {"fwd": band._band_fwd_kernel, "dq": band._band_bwd_dq_kernel}[kind]
    bm, bn, warps, stages = tiles
    sig = {name: "*fp32" for name in ARGS[kind]} | {"Tq": "i32", "Tk": "i32", "q_start": "i32", "sm_scale": "fp32"}
    constexprs = dict(H=2, G=6, K=K, L=32, D=16, W=0, WINDOW=False, BM=bm, BN=bn,
                      BK=max(16, triton.next_power_of_2(K)), DOT=precision, WIDE=False)
    if kind == "dq":
        constexprs["DELTA_GIVEN"] = False
    sig |= {name: "constexpr" for name in constexprs}
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--K", type=int, default=64, help="head dim")
    ap.add_argument("--precision", default="tf32x3", choices=["ieee", "tf32x3", "tf32"])
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from nsa.kernels import band_attention as band

    print(f"K {args.K}, {args.precision} products, sm_90 | kernel | tiles (BM, BN, warps, stages) | compile, s |")
    for kind, tuned in (("fwd", band.TILES["cmp"]["fwd"]), ("dq", band.TILES["cmp"]["dq"])):
        for tiles in (tuned[0 if args.K <= 64 else 1], band.FP32_SMALL_TILES):
            print(f"| {kind} | {tiles} | {compile_seconds(kind, tiles, args.K, args.precision):.1f} |", flush=True)


if __name__ == "__main__":
    main()
