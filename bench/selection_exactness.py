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
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks  # noqa: E402
from nsa.attention.torch_branches import (  # noqa: E402
    _block_scores, _forced_and_visible, selection_regret, torch_cmp_attention, visible_compressed)
from nsa.kernels import topk  # noqa: E402


TIE = 1e-5


def _inputs(S: int, G: int, H: int, K: int, seed: int, device: str):
    """The default NSAConfig, random normal q and compressed keys in float64 with their exact lse,
    and q and the keys in float32 on ``device``."""
    cfg = NSAConfig()
    gen = torch.Generator().manual_seed(seed)
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    q = torch.randn(1, S, H * G, K, generator=gen, dtype=torch.float64)
    kc = torch.randn(1, Nc, H, K, generator=gen, dtype=torch.float64)
    _, lse64 = torch_cmp_attention(q, kc, kc, cfg)
    return cfg, q, kc, lse64, q.float().to(device), kc.float().to(device)


def one(S: int, G: int, H: int, K: int, seed: int, device: str) -> dict[str, int]:
    cfg, q, kc, lse64, qd, kd = _inputs(S, G, H, K, seed, device)
    _, lse_kernel = triton_cmp_attention(qd, kd, kd, cfg)
    out = {"rows": S * H}
    for name, lse in (("kernel lse", lse_kernel), ("exact lse", lse64.float().to(device))):
        idx = triton_select_blocks(qd, kd, lse, cfg).cpu()
        regret = selection_regret(q, kc, lse64, idx, cfg)
        out[name] = int((regret > TIE).sum())
        out[f"{name} worst"] = float(regret.max())
    return out


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
    cfg, q, kc, lse64, qd, kd = _inputs(S, G, H, K, seed, device)
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
    ap.add_argument("--dot", choices=["ieee", "tf32x3", "tf32"],
                    help="the top-n kernel's float32 tl.dot precision (default: as TF32 is allowed or not)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dot:
        topk.dot_precision = lambda dtype: args.dot
    if args.explain:
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
