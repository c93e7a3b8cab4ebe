"""Probe: is the selected branch's forward and dq bound by gathering K/V blocks, or by something else?

docs/performance.md (seventh and eighth sets) argues that the selected forward at S=64k streams
16 blocks of K and V per token and KV group (about 137 GB) near the L2 rate, so that only reuse
across queries could speed it up. That is arithmetic, not a measurement. This probe times the
production kernels (nsa.kernels.selection._sel_fwd and _sel_bwd_dq) on the same q, k, v with
three block selections of the same size (n blocks a token once its context has n, ascending),
which differ only in how much the tokens' K/V blocks overlap:

  random  the top-n of random inputs (what bench/bench_nsa.py times): neighbours share the
          forced blocks (0, their own, the one before) and little else;
  recent  each token's own block and the n-1 before it (block 0 not forced): neighbours share
          almost every block, a sliding working set that stays in L2;
  shared  blocks 0..n-1 for every token that sees them (its own and the one before it when
          not): one small working set for the whole sequence.

If recent and shared run much faster than random, the kernels are bound by the gather and a
design that loads each K/V block once for the queries that chose it is the lever; if all three
take about the same time, they are bound by the per-token work (16-row tiles, the online
softmax) and the lever is elsewhere. With --tt the recent pattern is also timed with TT tokens
a program (the union path), the reuse the production heuristic turns off past short contexts.

    python3 bench/gpu/sel_locality_probe.py [--shapes 64k 16k] [--tt 4] [--random-tt 2 4]
First run 2026-11-23 on one H100 (commit 7d47893, docs/measurements/2026-11-23-d/): the three
patterns took the same time with one token a program (64k forward 17.9 / 16.9 / 17.1 ms), so the
kernels are bound by the bytes each program pulls from L2, not by DRAM or by which blocks; the
recent pattern with four tokens a program took 7.3 ms.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention  # noqa: E402
from nsa.kernels import selection as S  # noqa: E402
from nsa.kernels import topk as T  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run under TRITON_INTERPRET=1
SHAPES = {"tiny": (1, 512, 8, 2, 32), "16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128),
          "64k": (1, 65536, 64, 4, 128)}


def bench(fn) -> float:
    if DEV == "cpu":  # the dry run checks that every piece runs, not how fast
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def structured(pattern: str, B: int, S_: int, H: int, n: int, LS: int) -> torch.Tensor:
    """[B, S, H, n]: each token's blocks ascending, each once, -1 padded after (the top-n contract)."""
    own = (torch.arange(S_, device=DEV) // LS)[:, None]  # [S, 1]
    j = torch.arange(n, device=DEV)[None, :]
    if pattern == "recent":  # own-n+1 .. own
        cand = own - (n - 1) + j
    else:  # shared: 0..n-3 for everyone, then the token's own block and the one before
        cand = torch.cat([j[:, :n - 2].expand(S_, n - 2), own - 1, own], dim=1)
    cand = torch.where((cand < 0) | (cand > own), -1, cand).sort(dim=-1).values
    cand[:, 1:][cand[:, 1:] == cand[:, :-1]] = -1  # each block once
    big = torch.iinfo(cand.dtype).max  # -1 after the visible blocks
    cand = torch.where(cand < 0, big, cand).sort(dim=-1).values
    cand = torch.where(cand == big, -1, cand)
    return cand[None, :, None, :].expand(B, S_, H, n).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["64k", "16k"], choices=sorted(SHAPES))
    ap.add_argument("--tt", type=int, default=4, help="tokens a program for the recent pattern's union run")
    ap.add_argument("--random-tt", type=int, nargs="*", default=[], metavar="TT",
                    help="also time the random pattern at these tokens a program (the union path)")
    args = ap.parse_args()
    cfg = NSAConfig()
    L, D, LS, n = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected
    print(f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu (dry run)'}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    for name in args.shapes:
        B, S_, HQ, H, K = SHAPES[name]
        g = torch.Generator(device=DEV).manual_seed(0)
        q = torch.randn(B, S_, HQ, K, generator=g, device=DEV).bfloat16()
        k, v = (torch.randn(B, S_, H, K, generator=g, device=DEV).bfloat16() for _ in range(2))
        do = torch.randn(B, S_, HQ, K, generator=g, device=DEV).bfloat16()
        Nc = (S_ - L) // D + 1
        kc, vc = (torch.randn(B, Nc, H, K, generator=g, device=DEV).bfloat16() for _ in range(2))
        with torch.no_grad():
            _, lse_c = triton_cmp_attention(q, kc, vc, cfg)
        patterns = {"random": T._select_blocks(q, kc, lse_c, 0, L, D, LS, n),
                    "recent": structured("recent", B, S_, H, n, LS), "shared": structured("shared", B, S_, H, n, LS)}
        # bytes gathered per program visit: each selected block's K and V tile, bf16
        sel = {p: int((idx >= 0).sum()) for p, idx in patterns.items()}
        print(f"## {name} (B={B} S={S_} HQ={HQ} H={H} K={K}, n={n}, blocks of {LS})")
        print(f"  {'pattern':16s} {'fwd ms':>8s} {'dq ms':>8s} {'fwd GB/s gathered':>18s}  TT")
        runs = [(p, 0) for p in patterns] + [("recent", args.tt)] + [("random", tt) for tt in args.random_tt]
        for p, tt in runs:
            idx = patterns[p]
            saved = S.TUNE["tt"]
            S.TUNE["tt"] = tt  # 0: the production heuristic
            try:
                TT = S._tokens_per_tile(HQ // H, n, triton.cdiv(S_, LS), S_)
                o, lse = S._sel_fwd(q, k, v, idx, LS, 0, False)
                t_fwd = bench(lambda: S._sel_fwd(q, k, v, idx, LS, 0, False))
                t_dq = bench(lambda: S._sel_bwd_dq(q, k, v, idx, o, lse, do, LS, 0))
            finally:
                S.TUNE["tt"] = saved
            gathered = sel[p] * LS * K * 2 * 2  # K and V tiles of every (token, group, block)
            rate = gathered / t_fwd / 1e6 if t_fwd == t_fwd else math.nan  # GB/s; nan in the dry run
            print(f"  {p:16s} {t_fwd:8.3f} {t_dq:8.3f} {rate:18.0f}  {TT}")
        del q, k, v, do, kc, vc, lse_c, patterns
        if DEV == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
