"""Probe: where the top-n time goes.

First run (docs/measurements/2026-11-23-b/topk_probe.log): the probe of commit 6d246c6 against
nsa/kernels/topk.py of ff61ba4, the fused kernel of the time (scores + a running top-n in
registers), beside a score kernel (block scores written to memory) + torch.topk on int64 keys,
or + a Triton select kernel; the score + Triton select pair became nsa/kernels/topk.py. Second
run (docs/measurements/2026-11-23-c/topk_probe.log, commit 30d79d7): that implementation, its
select kernel against torch.topk, and ablations of the score kernel (ABL: 0 whole, 1 without
the overlap map, 2 also without the head sum and the per-chunk stores, 3 also without exp2)
with tuning variants, so the distance of each piece to the matrix-product floor is visible
(--ablations). Every run also times the select kernel alone under several launches (rows per
program, warps), the production one (topk._select_launch) marked. Shapes: 64k/16k/2k (B=1,
HQ=64, H=4, K=128) and m7c_125m (B=8, HQ=12, H=2, K=64, S=2048).

    python3 bench/gpu/topk_probe.py [--shapes 64k 2k] [--ablations] [--stages 2 3 4]

--stages also times the whole top-n at those pipeline stages of its score kernel (indices checked
against the first); its first run (commit e7a4ac0, sent to the device as a script of the same
loop, docs/measurements/2026-11-23-e/topk_stages_e7a4ac0.log) kept 2 stages.

A third run (commit bc38e4f, `--forms` then, docs/measurements/2026-11-23-e/forms_bc38e4f.log)
timed the score kernel in a key-major form (S^T = kc q^T, so that a token's head rows are
columns and the head sum stays in a thread and its quad instead of crossing a warp's lanes):
the whole top-n took 9.77 ms against 9.44 at 64k and 0.738 against 0.688 at 16k at the same
launch (9.16 at 3 stages), so the form was removed.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.kernels import topk as T  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention  # noqa: E402
from nsa.kernels._softmax import LOG2E  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run under TRITON_INTERPRET=1
SHAPES = {"tiny": (1, 512, 8, 2, 32), "2k": (1, 2048, 64, 4, 128), "16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128),
          "64k": (1, 65536, 64, 4, 128), "m7c_125m": (8, 2048, 12, 2, 64)}


@triton.jit
def _ablated_scores(
    q, kc, lse, scores, Tq, Nc, NB, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr, BJ: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, ABL: tl.constexpr,
):
    """nsa.kernels.topk._score_kernel (q_start 0) with pieces removed (ABL); outputs are only
    meaningful for ABL 0."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    R: tl.constexpr = LS // D
    BCR: tl.constexpr = BJ * R
    ROWS: tl.constexpr = BT * GP
    rows = tl.arange(0, ROWS)
    tt = pid_t * BT + rows // GP
    g = rows % GP
    rmask = (tt < Tq) & (g < G)
    offk = tl.arange(0, BK)
    kmask = offk < K
    q_base = q + (b.to(tl.int64) * Tq * HQ + h * G) * K
    qt = tl.load(q_base + (tt * HQ + g).to(tl.int64)[:, None] * K + offk[None, :],
                 mask=rmask[:, None] & kmask[None, :], other=0.0)
    lse2 = tl.load(lse + b.to(tl.int64) * Tq * HQ + h * G + tt * HQ + g, mask=rmask, other=0.0) * LOG2E
    hi_r = tl.where(tt + 1 >= L, (tt + 1 - L) // D, -1)
    hi_r = tl.where(rmask, hi_r, -1)
    kc_base = kc + (b.to(tl.int64) * Nc * H + h) * K
    tok = pid_t * BT + tl.arange(0, BT)
    jt = tok // LS
    t_last = tl.minimum(pid_t * BT + BT - 1, Tq - 1)
    n_chunks = tl.cdiv(t_last // LS + 1, BJ)
    cc = tl.arange(0, BC)
    jj = tl.arange(0, BJ)
    ccv = cc < BCR
    wmap = T._overlap_weight(cc[:, None] - jj[None, :] * R, L, D, LS).to(tl.float32)
    wmap = tl.where(ccv[:, None], wmap, 0.0)
    wtail = tl.where(ccv, T._overlap_weight(cc - BCR, L, D, LS), 0).to(tl.float32)
    qk_scale = sm_scale * LOG2E
    out_rows = scores + ((b.to(tl.int64) * Tq + tok) * H + h) * NB
    carry = tl.zeros([BT], tl.float32)
    acc = tl.zeros([ROWS, BC], tl.float32)
    for c in range(0, n_chunks):
        ci = c * BCR + cc
        kt = tl.load(kc_base + ci.to(tl.int64)[:, None] * (H * K) + offk[None, :],
                     mask=((ci < Nc) & ccv)[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        vis = (ci[None, :] <= hi_r[:, None]) & ccv[None, :]
        if ABL >= 3:
            p = tl.where(vis, s, 0.0)
        else:
            p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
        if ABL >= 2:
            acc += p
        else:
            ps = tl.sum(tl.reshape(p, [BT, GP, BC]), 1)
            j = c * BJ + jj
            if ABL >= 1:
                sc = tl.sum(tl.reshape(ps, [BT, BJ, BC // BJ]), 2)
            else:
                sc = tl.sum(ps[:, :, None] * wmap[None, :, :], 1)
                sc = sc + tl.where(jj[None, :] == 0, carry[:, None], 0.0)
                carry = tl.sum(ps * wtail[None, :], 1)
            forced = (j[None, :] == 0) | (j[None, :] == jt[:, None]) | (j[None, :] == jt[:, None] - 1)
            sc = tl.where(forced, float("inf"), sc)
            sc = tl.where(j[None, :] <= jt[:, None], sc, -1.0)
            tl.store(out_rows[:, None] + j[None, :], sc, mask=(tok[:, None] < Tq) & (j[None, :] < NB))
    if ABL >= 2:
        tot = tl.sum(tl.reshape(tl.sum(acc, 1), [BT, GP]), 1)
        tl.store(out_rows, tot, mask=tok < Tq)


def ablated(q, kc, lse, sc, L, D, LS, abl, rows, warps, stages, BJ=16):
    B, Tq, HQ, K = q.shape
    Nc, H = kc.shape[1], kc.shape[2]
    G = HQ // H
    GP = triton.next_power_of_2(G)
    BT = max(1, rows // GP)
    _ablated_scores[(triton.cdiv(Tq, BT), B * H)](
        q, kc, lse, sc, Tq, Nc, sc.shape[-1], 1.0 / math.sqrt(K), H=H, G=G, GP=GP, K=K,
        BK=max(16, triton.next_power_of_2(K)), L=L, D=D, LS=LS, BJ=BJ, BT=BT,
        BC=triton.next_power_of_2(BJ * (LS // D)), ABL=abl, num_warps=warps, num_stages=stages)


def select_torch(sc, n):
    """torch.topk on int64 keys (score bits, then the lower block first), sorted."""
    NB = sc.shape[-1]
    bits = sc.view(torch.int32).to(torch.int64) + 1  # -1.0 -> negative
    j = torch.arange(NB, device=sc.device)
    key = (bits.clamp_min(0) << 32) | (2147483647 - j)
    top = torch.topk(key, min(n, NB), dim=-1).values
    blk = torch.where((top >> 32) > 0, 2147483647 - (top & 2147483647), torch.full_like(top, 1 << 40))
    return blk.sort(dim=-1).values


def bench(fn):
    if DEV == "cpu":  # the dry run checks that every piece runs, not how fast
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["64k", "16k", "2k", "m7c_125m"])
    ap.add_argument("--ablations", action="store_true", help="also time the score kernel's ablations")
    ap.add_argument("--stages", nargs="+", type=int, default=[],
                    help="also time the whole top-n at these pipeline stages of the score kernel")
    args = ap.parse_args()
    cfg = NSAConfig()
    L, D, LS, n = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected
    print(f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu (dry run)'}, torch {torch.__version__}, triton {triton.__version__}")
    for name in args.shapes:
        B, S, HQ, H, K = SHAPES[name]
        g = torch.Generator(device=DEV).manual_seed(0)
        Nc = (S - L) // D + 1
        q = torch.randn(B, S, HQ, K, generator=g, device=DEV).bfloat16()
        kc = torch.randn(B, Nc, H, K, generator=g, device=DEV).bfloat16()
        vc = torch.randn(B, Nc, H, K, generator=g, device=DEV).bfloat16()
        with torch.no_grad():
            _, lse = triton_cmp_attention(q, kc, vc, cfg)
        NB = triton.cdiv(S, LS)
        flop = 2 * B * HQ * K * sum(min(Nc, max(0, (t + 1 - L) // D + 1)) for t in range(0, S, 64)) * 64
        rows = {"topk.py (scores + select)": bench(lambda: T._select_blocks(q, kc, lse, 0, L, D, LS, n))}
        saved, first = dict(T.TUNE), None
        try:
            for st in args.stages:
                T.TUNE["stages"] = st
                rows[f"top-n, score kernel at {st} stages"] = bench(lambda: T._select_blocks(q, kc, lse, 0, L, D, LS, n))
                idx = T._select_blocks(q, kc, lse, 0, L, D, LS, n)
                first = idx if first is None else first
                if not torch.equal(idx, first):
                    print(f"  {st} stages: indices differ from the first stage count's")
        finally:
            T.TUNE.update(saved)
        sc = torch.empty(B, S, H, NB, device=DEV)
        for abl in (0, 1, 2, 3) if args.ablations else (0,):
            for r, w, st in ((128, 4, 2), (128, 8, 3), (256, 8, 2)) if args.ablations else ((128, 4, 2),):
                try:
                    rows[f"scores ABL={abl} rows={r} w={w} st={st}"] = bench(
                        lambda: ablated(q, kc, lse, sc, L, D, LS, abl, r, w, st))
                except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                    print(f"  ABL={abl} rows={r} w={w} st={st} failed: {type(e).__name__} {str(e)[:100]}")
        sc.fill_(-1.0)  # the ablated kernel writes no blocks after a tile's last query's own
        ablated(q, kc, lse, sc, L, D, LS, 0, 128, 4, 2)
        same = (torch.where(select_torch(sc, n) >= 1 << 40, -1, select_torch(sc, n))
                == T._select_blocks(q, kc, lse, 0, L, D, LS, n)[..., :min(n, NB)]).all(-1).float().mean().item()
        print(f"  rows where torch.topk of the ablated kernel's ABL=0 scores equal topk.py: {same:.6f}")
        rows["select: torch.topk on int64 keys + sort"] = bench(lambda: select_torch(sc, n))
        NBP = triton.next_power_of_2(NB)
        chosen = T._select_launch(NBP)
        for br, w in sorted({chosen, (1, 4), (max(1, 1024 // NBP), 1), (max(1, 2048 // NBP), 1),
                             (max(1, 512 // NBP), 1), (4, 4), (2, 2)}):
            nrows = B * S * H
            out = torch.empty(B, S, H, n, device=DEV, dtype=torch.int64)
            rows[f"select kernel BR={br} warps={w}{' (topk.py)' if (br, w) == chosen else ''}"] = bench(
                lambda: T._select_kernel[(triton.cdiv(nrows, br),)](
                    sc, out, nrows, NB, N=n, NP=triton.next_power_of_2(n), NBP=NBP, BR=br, num_warps=w))
            if not torch.equal(out[..., :min(n, NB)], T._select_blocks(q, kc, lse, 0, L, D, LS, n)[..., :min(n, NB)]):
                print(f"  select kernel BR={br} warps={w}: indices differ from topk.py's")
        print(f"## {name} (B={B} S={S} HQ={HQ} H={H} K={K}); q.kc^T {flop / 1e12:.3f} TFLOP")
        for k, v in rows.items():
            print(f"  {k:45s} {v:8.3f} ms  {flop / v / 1e9:7.1f} TFLOP/s (q.kc^T)")
        del q, kc, vc, lse, sc
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
