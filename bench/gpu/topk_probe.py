"""Probe: where the top-n kernel's time goes, and a two-kernel alternative.

V0  the fused kernel of nsa/kernels/topk.py (scores + running top-n in registers), at TUNE
    settings;
V1  a score kernel (the same q.kc, exp2, head sum and overlap map, block scores written to memory
    instead of merged into a running top-n) + torch.topk on int64 keys + sort;
V2  the same score kernel + a Triton select kernel (binary search on the score bits for the n-th
    largest, ties to the lower block, ascending output by cumsum).
Checks V1 and V2 give V0's indices exactly. Shapes: 64k/16k/2k (B=1, HQ=64, H=4, K=128) and
m7c_125m (B=8, HQ=12, H=2, K=64, S=2048).

    python3 bench/gpu/topk_probe.py [--shapes 64k 2k]
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
from nsa.kernels.compressed import triton_cmp_attention  # noqa: E402

SHAPES = {"2k": (1, 2048, 64, 4, 128), "16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128),
          "64k": (1, 65536, 64, 4, 128), "m7c_125m": (8, 2048, 12, 2, 64)}


@triton.jit
def _score_kernel(
    q, kc, lse, scores, Tq, Nc, NB, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr, BJ: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
):
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
    pos_r = q_start + tt
    offk = tl.arange(0, BK)
    kmask = offk < K
    q_base = q + (b.to(tl.int64) * Tq * HQ + h * G) * K
    qt = tl.load(q_base + (tt * HQ + g).to(tl.int64)[:, None] * K + offk[None, :],
                 mask=rmask[:, None] & kmask[None, :], other=0.0)
    lse2 = tl.load(lse + b.to(tl.int64) * Tq * HQ + h * G + tt * HQ + g, mask=rmask, other=0.0)
    lse2 = lse2 * 1.4426950408889634
    lse2 = tl.where(lse2 == float("-inf"), 0.0, lse2)
    hi_r = tl.where(pos_r + 1 >= L, (pos_r + 1 - L) // D, -1)
    hi_r = tl.where(rmask, hi_r, -1)
    kc_base = kc + (b.to(tl.int64) * Nc * H + h) * K
    tok = pid_t * BT + tl.arange(0, BT)
    pos_t = q_start + tok
    jt = pos_t // LS
    t_last = tl.minimum(pid_t * BT + BT - 1, Tq - 1)
    n_chunks = tl.cdiv((q_start + t_last) // LS + 1, BJ)
    cc = tl.arange(0, BC)
    jj = tl.arange(0, BJ)
    ccv = cc < BCR
    wmap = T._overlap_weight(cc[:, None] - jj[None, :] * R, L, D, LS).to(tl.float32)
    wmap = tl.where(ccv[:, None], wmap, 0.0)
    wtail = tl.where(ccv, T._overlap_weight(cc - BCR, L, D, LS), 0).to(tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    carry = tl.zeros([BT], tl.float32)
    out_base = scores + ((b.to(tl.int64) * Tq + tok) * H + h) * NB
    for c in range(0, n_chunks):
        ci = c * BCR + cc
        kt = tl.load(kc_base + ci.to(tl.int64)[:, None] * (H * K) + offk[None, :],
                     mask=((ci < Nc) & ccv)[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        vis = (ci[None, :] <= hi_r[:, None]) & ccv[None, :]
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
        ps = tl.sum(tl.reshape(p, [BT, GP, BC]), 1)
        sc = tl.sum(ps[:, :, None] * wmap[None, :, :], 1)
        sc = sc + tl.where(jj[None, :] == 0, carry[:, None], 0.0)
        carry = tl.sum(ps * wtail[None, :], 1)
        j = c * BJ + jj
        forced = (j[None, :] == 0) | (j[None, :] == jt[:, None]) | (j[None, :] == jt[:, None] - 1)
        sc = tl.where(forced, float("inf"), sc)
        sc = tl.where(j[None, :] <= jt[:, None], sc, -1.0)
        tl.store(out_base[:, None] + j[None, :], sc, mask=(tok[:, None] < Tq) & (j[None, :] < NB))
    for c in range(n_chunks, tl.cdiv(NB, BJ)):  # blocks after the tile's last query's: invisible
        j = c * BJ + jj
        tl.store(out_base[:, None] + j[None, :], tl.full([BT, BJ], -1.0, tl.float32),
                 mask=(tok[:, None] < Tq) & (j[None, :] < NB))


@triton.jit
def _select_kernel(scores, idx, NROWS, NB, N: tl.constexpr, NP: tl.constexpr, NBP: tl.constexpr,
                   BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = r < NROWS
    j = tl.arange(0, NBP)
    s = tl.load(scores + r.to(tl.int64)[:, None] * NB + j[None, :], mask=rm[:, None] & (j[None, :] < NB),
                other=-1.0)
    bits = s.to(tl.int32, bitcast=True)  # scores >= 0 order like their bits; -1.0 is negative
    lo = tl.zeros([BR], tl.int32)
    hi = tl.full([BR], 0x7F800000, tl.int32)
    for _ in range(0, 31):
        mid = lo + (hi - lo + 1) // 2
        cnt = tl.sum((bits >= mid[:, None]).to(tl.int32), 1)
        ok = cnt >= N
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    gt = bits > lo[:, None]
    eq = bits == lo[:, None]
    need = N - tl.sum(gt.to(tl.int32), 1)
    eq_rank = tl.cumsum(eq.to(tl.int32), 1)
    sel = gt | (eq & (eq_rank <= need[:, None]))
    pos = tl.cumsum(sel.to(tl.int32), 1) - 1
    out = idx + r.to(tl.int64)[:, None] * N
    tl.store(out + pos, j[None, :].to(tl.int64) + tl.zeros([BR, NBP], tl.int64), mask=sel & rm[:, None])
    nsel = tl.sum(sel.to(tl.int32), 1)
    col = tl.arange(0, NP)
    tl.store(out + col[None, :], tl.full([BR, NP], -1, tl.int64),
             mask=rm[:, None] & (col[None, :] >= nsel[:, None]) & (col[None, :] < N))


def scores_of(q, kc, lse, L, D, LS, rows=64, warps=4, stages=2, BJ=16):
    B, Tq, HQ, K = q.shape
    Nc, H = kc.shape[1], kc.shape[2]
    G = HQ // H
    NB = triton.cdiv(Tq, LS)
    sc = torch.empty(B, Tq, H, NB, device=q.device, dtype=torch.float32)
    GP = triton.next_power_of_2(G)
    BT = max(1, rows // GP)
    BK = max(16, triton.next_power_of_2(K))
    grid = (triton.cdiv(Tq, BT), B * H)
    _score_kernel[grid](q, kc, lse, sc, Tq, Nc, NB, 0, 1.0 / math.sqrt(K), H=H, G=G, GP=GP, K=K, BK=BK,
                        L=L, D=D, LS=LS, BJ=BJ, BT=BT, BC=triton.next_power_of_2(BJ * (LS // D)),
                        num_warps=warps, num_stages=stages)
    return sc


def select_torch(sc, n):
    NB = sc.shape[-1]
    bits = sc.view(torch.int32).to(torch.int64) + 1  # -1.0 -> negative
    j = torch.arange(NB, device=sc.device)
    key = (bits.clamp_min(0) << 32) | (2147483647 - j)
    k = min(n, NB)
    top = torch.topk(key, k, dim=-1).values
    blk = torch.where((top >> 32) > 0, 2147483647 - (top & 2147483647), torch.full_like(top, 1 << 40))
    blk = blk.sort(dim=-1).values
    blk = torch.where(blk >= (1 << 40), -1, blk)
    if k < n:
        blk = torch.cat([blk, blk.new_full((*blk.shape[:-1], n - k), -1)], -1)
    return blk


def select_triton(sc, n, br=4, warps=4):
    B, Tq, H, NB = sc.shape
    idx = torch.empty(B, Tq, H, n, device=sc.device, dtype=torch.int64)
    nrows = B * Tq * H
    _select_kernel[(triton.cdiv(nrows, br),)](sc, idx, nrows, NB, N=n, NP=triton.next_power_of_2(n),
                                              NBP=triton.next_power_of_2(NB), BR=br, num_warps=warps)
    return idx


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["64k", "16k", "2k", "m7c_125m"])
    args = ap.parse_args()
    cfg = NSAConfig()
    L, D, LS, n = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name in args.shapes:
        B, S, HQ, H, K = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        Nc = (S - L) // D + 1
        q = torch.randn(B, S, HQ, K, generator=g, device="cuda").bfloat16()
        kc = torch.randn(B, Nc, H, K, generator=g, device="cuda").bfloat16()
        vc = torch.randn(B, Nc, H, K, generator=g, device="cuda").bfloat16()
        with torch.no_grad():
            _, lse = triton_cmp_attention(q, kc, vc, cfg)
        ref = T._select_blocks(q, kc, lse, 0, L, D, LS, n)
        rows = {}
        rows["V0 fused (TUNE)"] = bench(lambda: T._select_blocks(q, kc, lse, 0, L, D, LS, n))
        for r, w in ((128, 4), (128, 8)):
            T.TUNE.update(rows=r, warps=w)
            rows[f"V0 fused rows={r} warps={w}"] = bench(lambda: T._select_blocks(q, kc, lse, 0, L, D, LS, n))
        T.TUNE.update(rows=64, warps=4)
        for r, w, st, bj in ((64, 4, 2, 16), (128, 4, 2, 16), (128, 8, 2, 16), (64, 4, 3, 32), (128, 8, 3, 32)):
            try:
                rows[f"score rows={r} w={w} st={st} BJ={bj}"] = bench(lambda: scores_of(q, kc, lse, L, D, LS, r, w, st, bj))
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                print(f"  score rows={r} w={w} st={st} BJ={bj} failed: {type(e).__name__} {str(e)[:100]}")
        sc = scores_of(q, kc, lse, L, D, LS)
        rows["select torch (topk+sort)"] = bench(lambda: select_torch(sc, n))
        for br, w in ((1, 4), (4, 4), (4, 8), (8, 8)):
            rows[f"select triton BR={br} w={w}"] = bench(lambda: select_triton(sc, n, br, w))
        v1 = select_torch(sc, n)
        v2 = select_triton(sc, n)
        eq1 = (v1 == ref).all(-1).float().mean().item()
        eq2 = (v2 == ref).all(-1).float().mean().item()
        print(f"## {name} (B={B} S={S} HQ={HQ} H={H} K={K}): rows equal to V0: V1 {eq1:.6f}, V2 {eq2:.6f}")
        for k, v in rows.items():
            print(f"  {k:40s} {v:8.3f} ms")
        del q, kc, vc, lse, ref, sc, v1, v2
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
