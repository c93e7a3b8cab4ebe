"""How often the kernels' float32 selection differs from the exact (float64) top-n by more than a
near-tie, per group size: the lse from the compressed-branch kernel or the exact one, TF32 off or on.

A row (query token, KV head) violates when an unchosen visible block's exact score exceeds a chosen
block's by more than ``tie`` times the row's top score (forced blocks aside). Random normal q and
compressed keys, the default NSAConfig, batch 1.

    python bench/selection_exactness.py                          # S 2100, G 1 2 3 4 6 8 12 16
    python bench/selection_exactness.py --S 4096 --groups 6 --tf32 off
    python bench/selection_exactness.py --groups 2 --tf32 off --explain   # where the scores err
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks  # noqa: E402
from nsa.attention.torch_branches import (  # noqa: E402
    _block_scores, _forced_and_visible, selection_regret, torch_cmp_attention, visible_compressed)
from nsa.kernels import topk, tuning  # noqa: E402
from nsa.kernels._softmax import LOG2E, lse_log2  # noqa: E402


TIE = 1e-5


def one(S: int, G: int, H: int, K: int, seed: int, device: str) -> dict[str, int]:
    cfg = NSAConfig()
    gen = torch.Generator().manual_seed(seed)
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    q = torch.randn(1, S, H * G, K, generator=gen, dtype=torch.float64)
    kc = torch.randn(1, Nc, H, K, generator=gen, dtype=torch.float64)
    _, lse64 = torch_cmp_attention(q, kc, kc, cfg)
    qd, kd = q.float().to(device), kc.float().to(device)
    _, lse_kernel = triton_cmp_attention(qd, kd, kd, cfg)
    out = {"rows": S * H}
    for name, lse in (("kernel lse", lse_kernel), ("exact lse", lse64.float().to(device))):
        idx = triton_select_blocks(qd, kd, lse, cfg).cpu()
        regret = selection_regret(q, kc, lse64, idx, cfg)
        out[name] = int((regret > TIE).sum())
        out[f"{name} worst"] = float(regret.max())
    return out


@triton.jit
def _dot_exp2_kernel(a, b, s_out, p_out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, DOT: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    at = tl.load(a + m[:, None] * K + k[None, :])
    bt = tl.load(b + n[:, None] * K + k[None, :])
    s = tl.dot(at, tl.trans(bt), input_precision=DOT)
    tl.store(s_out + m[:, None] * N + n[None, :], s)
    tl.store(p_out + m[:, None] * N + n[None, :], tl.exp2(s * 8.0 - 16.0))  # 2^(-32..0), as p_cmp


@triton.jit
def _probability_kernel(q, kc, lse, p_out, sm_scale, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                        DOT: tl.constexpr):
    """p = exp(q . kc * sm_scale - lse) for M rows and N keys, in the score kernel's arithmetic."""
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    qt = tl.load(q + m[:, None] * K + k[None, :])
    kt = tl.load(kc + n[:, None] * K + k[None, :])
    lse2 = lse_log2(tl.load(lse + m))
    p = tl.exp2(tl.dot(qt, tl.trans(kt), input_precision=DOT) * (sm_scale * LOG2E) - lse2[:, None])
    tl.store(p_out + m[:, None] * N + n[None, :], p)


def probability_errors(q, kc, lse, device: str) -> None:
    """The score kernel's probabilities for 128 (token, head) rows of these inputs (the last 64 tokens' first two query heads, KV head 0's first 64 compressed
    tokens, or 16 where there are fewer), in its arithmetic alone, against float64: max relative error where p > 1e-3."""
    N = 64 if kc.shape[1] >= 64 else 16
    rows, keys = q[0, -64:, :2].reshape(128, -1), kc[0, :N, 0]
    want = torch.exp(rows @ keys.T / rows.shape[-1] ** 0.5 - lse[0, -64:, :2].reshape(128, 1))
    got = torch.empty(128, N, device=device)
    _probability_kernel[(1,)](rows.float().to(device), keys.float().to(device), lse[0, -64:, :2].reshape(128).float()
                              .to(device).contiguous(), got, 1.0 / rows.shape[-1] ** 0.5, M=128, N=N,
                              K=rows.shape[-1], DOT="ieee")
    big = want > 1e-3
    err = ((got.double().cpu() - want) / want)[big]
    print(f"  p in the score kernel's arithmetic, {int(big.sum())} values > 1e-3: max relative error "
          f"{float(err.abs().max()):.2e}, mean {float(err.mean()):.2e}")


def primitive_errors(device: str) -> None:
    """How exact a [128, 64] x [64, 64] float32 tl.dot and tl.exp2 of its result are here, per
    input_precision (the score kernel's products and probabilities), against float64."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, 64, generator=gen, dtype=torch.float64) / 4 for n in (128, 64))
    want_s = a @ b.T
    for precision in ("ieee", "tf32x3", "tf32"):
        for warps in (4, 8):
            s, p = (torch.empty(128, 64, device=device) for _ in range(2))
            _dot_exp2_kernel[(1,)](a.float().to(device), b.float().to(device), s, p, M=128, N=64, K=64,
                                   DOT=precision, num_warps=warps)
            ds = (s.double().cpu() - want_s).abs().max()
            exact_p = torch.exp2(s.double().cpu() * 8.0 - 16.0)
            dp = ((p.double().cpu() - exact_p) / exact_p).abs().max()
            print(f"tl.dot input_precision={precision}, {warps} warps: max |error| {float(ds):.2e} (|s| up to "
                  f"{float(want_s.abs().max()):.2f}); tl.exp2 of 8 times it less 16: max relative error {float(dp):.2e}")


def _kernel_scores(qd, kd, lse, cfg: NSAConfig) -> torch.Tensor:
    """The top-n kernel's block scores [B, S, H, NB] as its score kernel writes them (before the
    select kernel, which overwrites them): +inf forced, -1 after a query's own block."""
    kept = []
    select_top = topk.select_top

    def keeping(scores, idx, *args):
        kept.append(scores.clone())
        return select_top(scores, idx, *args)

    topk.select_top = keeping
    try:
        triton_select_blocks(qd, kd, lse, cfg)
    finally:
        topk.select_top = select_top
    B, S, H = qd.shape[0], qd.shape[1], kd.shape[2]
    return torch.cat(kept).view(B, S, H, -1).double().cpu()


def explain(S: int, G: int, H: int, K: int, seed: int, device: str, worst: int = 8) -> None:
    """The kernel's block scores against the exact ones (float64), free blocks only: the largest
    errors as a fraction of the row's top free score, where they are (token t, KV head h, block j,
    j's distance below the token's own block jt) and the rows that violate a near-tie."""
    cfg = NSAConfig()
    gen = torch.Generator().manual_seed(seed)
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    q = torch.randn(1, S, H * G, K, generator=gen, dtype=torch.float64)
    kc = torch.randn(1, Nc, H, K, generator=gen, dtype=torch.float64)
    _, lse64 = torch_cmp_attention(q, kc, kc, cfg)
    qd, kd = q.float().to(device), kc.float().to(device)
    probability_errors(q, kc, lse64, device)
    got = _kernel_scores(qd, kd, lse64.float().to(device), cfg)
    NB = got.shape[-1]
    want = _block_scores(q, kc, lse64, cfg, 0, NB)
    forced, visible = _forced_and_visible(torch.arange(S), NB, cfg)
    free = (visible & ~forced)[None, :, None, :].expand_as(want)
    top = want.masked_fill(~free, float("-inf")).amax(-1, keepdim=True)
    err = ((got - want).abs() / top).masked_fill(~free, 0.0).nan_to_num(0.0)
    rel = ((got - want).abs() / want.abs().clamp_min(1e-300)).masked_fill(~free | (want < 1e-3 * top), 0.0)
    print(f"G {G}, H {H}, seed {seed}: free-block score error, max {float(err.max()):.2e} of the row's top "
          f"(median {float(err[free].median()):.2e}); max {float(rel.max()):.2e} of the block's own score")
    flat = err.flatten()
    for i in flat.topk(worst).indices.tolist():
        b, t, h, j = (int(v) for v in torch.unravel_index(torch.tensor(i), err.shape))
        jt = t // cfg.sel_block
        print(f"  t {t} h {h} j {j} (jt - j = {jt - j}): kernel {float(got[b, t, h, j]):.9g} "
              f"exact {float(want[b, t, h, j]):.9g} top {float(top[b, t, h, 0]):.6g}")
    b, t, h = (int(v) for v in torch.unravel_index(err.flatten().argmax(), err.shape)[:3])
    jt = t // cfg.sel_block
    print(f"  the worst row (t {t}, h {h}): kernel - exact, as a fraction of each block's exact score, blocks 0..{jt}:")
    print("   ", " ".join(f"{float((got[b, t, h, j] - want[b, t, h, j]) / want[b, t, h, j]):+.1e}"
                          for j in range(jt + 1) if bool(free[b, t, h, j])))
    idx = triton_select_blocks(qd, kd, lse64.float().to(device), cfg).cpu()
    bad = (selection_regret(q, kc, lse64, idx, cfg) > TIE).nonzero().tolist()
    print(f"  rows violating a near-tie: {bad[:worst]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--S", type=int, default=2100)
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16])
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--tf32", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--explain", action="store_true",
                    help="instead of the table: where the top-n kernel's block scores differ from the exact ones")
    ap.add_argument("--rows", type=int, help="the score kernel's rows a program (TopkTuning.rows)")
    ap.add_argument("--warps", type=int, help="the score kernel's warps (default: 8 for strict float32)")
    ap.add_argument("--stages", type=int, help="the score kernel's pipeline stages (TopkTuning.stages)")
    ap.add_argument("--dot", choices=["ieee", "tf32x3", "tf32"],
                    help="the top-n kernel's float32 tl.dot precision (default: as TF32 is allowed or not)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dot:
        topk.dot_precision = lambda dtype: args.dot
    launch = {k: v for k, v in (("rows", args.rows), ("warps", args.warps), ("stages", args.stages)) if v}
    if launch:
        tuning.TOPK = dataclasses.replace(tuning.TOPK, **launch)
        topk.fp32_small_tiles = lambda *a: False  # the warps as given
    if args.explain:
        primitive_errors(device)
        for tf32 in args.tf32:
            torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
            for G in args.groups:
                print(f"TF32 {tf32}")
                for seed in range(args.seeds):
                    explain(args.S, G, 2 if G < 12 else 1, args.K, seed, device)
        return
    print(f"S {args.S}, K {args.K}, {args.seeds} seeds; rows violating a near-tie of {TIE:g} of the row's top score "
          "(the worst regret in brackets, as a fraction of the top score)")
    print("| TF32 | G | H | rows | kernel lse | exact lse |")
    print("|---|---:|---:|---:|---:|---:|")
    for tf32 in args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
        for G in args.groups:
            H = 2 if G < 12 else 1
            runs = [one(args.S, G, H, args.K, seed, device) for seed in range(args.seeds)]
            cells = [str(sum(r["rows"] for r in runs))]
            for name in ("kernel lse", "exact lse"):
                cells.append(f"{sum(r[name] for r in runs)} ({max(r[name + ' worst'] for r in runs):.1e})")
            print(f"| {tf32} | {G} | {H} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
