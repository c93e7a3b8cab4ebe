"""Triton importance scores and top-n block selection, fused: the [S, S/d] probability matrix
and the [S, S/l'] block scores never reach device memory.

One program owns BT consecutive query tokens of one KV group, with all G query heads of the
group as rows (padded to GP, a power of two). It streams the compressed keys in chunks of BJ
selection blocks (BJ * R compressed tokens, R = l'/d), recomputes
p_cmp = exp(q . kc / sqrt(K) - lse) over the visible compressed tokens, sums it over the
group's heads, maps it onto selection blocks by overlap weight (the compressed tokens that
straddle the chunk boundary are carried to the next chunk) and merges the chunk's block scores
into a running top-n held in registers (the chunk's candidates that beat the running minimum
replace it, largest first; no sort, so it is cheap both compiled and under the interpreter).

Each candidate is one int64 key: (float bits of the score + 1) << 32 | (2^31 - 1 - block).
Scores are >= 0, so the bits order like the floats; a tie goes to the lower block index;
forced blocks (0, the block holding t and the one before) get the bits of +inf; blocks after
the query's own get 0 and are never chosen over a visible block.

Shapes: q [B, Tq, HQ, K]; kc [B, Nc, H, K]; lse [B, Tq, HQ]; output idx [B, Tq, H, n] int64,
ascending, -1 padded (the contract of nsa.attention.torch_branches.torch_select_blocks).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._autograd import run_op
from ._softmax import LOG2E, lse_log2

# A candidate block is one int64 key: (score bits + 1) << 32 | (BLOCK_MASK - block); see the
# module docstring
BLOCK_MASK: tl.constexpr = tl.constexpr(2**31 - 1)
"""The low 32 bits hold BLOCK_MASK - block, so a tie in score goes to the lower block."""
FORCED_BITS: tl.constexpr = tl.constexpr(0x7F800000 + 1)
"""The bits of +inf, plus the 1 every score's bits get: a forced block beats every score."""
NOT_CANDIDATE: tl.constexpr = tl.constexpr(-(2**62))
"""Below every key and every placeholder: a chunk's candidate already inserted or too small."""
INT64_MAX: tl.constexpr = tl.constexpr(2**63 - 1)
"""The padding slots past n hold INT64_MAX - slot, above every key, so never the minimum."""


@triton.jit
def _flip(x):
    """BLOCK_MASK - x: the low half of a block's key, and back (written tensor first: Triton's
    interpreter keeps a constexpr minus a tensor a constexpr)."""
    return -(x - BLOCK_MASK)


@triton.jit
def _overlap_weight(o, L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr):
    """Overlap / d of compressed token (j*R + o) with selection block j."""
    ov = tl.minimum(o * D + L, LS) - tl.maximum(o * D, 0)
    return tl.maximum(ov, 0) // D


@triton.jit
def _topk_kernel(
    q, kc, lse, idx, Tq, Nc, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    R: tl.constexpr = LS // D
    BJ: tl.constexpr = NP
    BCR: tl.constexpr = NP * R  # compressed tokens per chunk; BC is its next power of two
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
    lse2 = lse_log2(tl.load(lse + b.to(tl.int64) * Tq * HQ + h * G + tt * HQ + g, mask=rmask, other=0.0))
    # compressed token i is visible to position p iff i*D + L - 1 <= p
    hi_r = tl.where(pos_r + 1 >= L, (pos_r + 1 - L) // D, -1)
    hi_r = tl.where(rmask, hi_r, -1)
    kc_base = kc + (b.to(tl.int64) * Nc * H + h) * K

    tok = pid_t * BT + tl.arange(0, BT)
    pos_t = q_start + tok
    jt = pos_t // LS
    t_last = tl.minimum(pid_t * BT + BT - 1, Tq - 1)
    n_chunks = tl.cdiv((q_start + t_last) // LS + 1, BJ)

    # overlap maps: in-chunk tokens -> chunk blocks, and the chunk's tail -> the next block 0
    cc = tl.arange(0, BC)
    jj = tl.arange(0, BJ)
    ccv = cc < BCR
    wmap = _overlap_weight(cc[:, None] - jj[None, :] * R, L, D, LS).to(tl.float32)  # [BC, BJ]
    wmap = tl.where(ccv[:, None], wmap, 0.0)
    wtail = tl.where(ccv, _overlap_weight(cc - BCR, L, D, LS), 0).to(tl.float32)  # [BC]

    qk_scale = sm_scale * LOG2E
    col = tl.arange(0, NP)
    # N live slots with distinct negative placeholders (below every real key); the padding
    # slots hold huge values so the running minimum is always one of the N live slots
    c64 = col.to(tl.int64)
    top = tl.full([NP], INT64_MAX, tl.int64)
    best = tl.where(col < N, -(c64 + 1), top - c64)[None, :] + tl.zeros([BT, NP], tl.int64)
    carry = tl.zeros([BT], tl.float32)
    for c in range(0, n_chunks):
        ci = c * BCR + cc
        kt = tl.load(kc_base + ci.to(tl.int64)[:, None] * (H * K) + offk[None, :],
                     mask=((ci < Nc) & ccv)[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        vis = (ci[None, :] <= hi_r[:, None]) & ccv[None, :]
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
        ps = tl.sum(tl.reshape(p, [BT, GP, BC]), 1)  # [BT, BC], summed over the group's heads
        sc = tl.sum(ps[:, :, None] * wmap[None, :, :], 1)  # [BT, BJ]
        sc = sc + tl.where(jj[None, :] == 0, carry[:, None], 0.0)
        carry = tl.sum(ps * wtail[None, :], 1)
        j = c * BJ + jj
        forced = (j[None, :] == 0) | (j[None, :] == jt[:, None]) | (j[None, :] == jt[:, None] - 1)
        bits = sc.to(tl.int32, bitcast=True).to(tl.int64) + 1
        bits = tl.where(forced, FORCED_BITS, bits)
        bits = tl.where(j[None, :] <= jt[:, None], bits, 0)
        key = (bits << 32) | _flip(j[None, :]).to(tl.int64)
        # insert the chunk's candidates that beat the running minimum, largest first, each in
        # place of the current minimum (keys are distinct, so exactly one slot holds it); only
        # as many steps as the row with the most such candidates needs
        mn0 = tl.min(best, 1)
        cand = tl.where(key > mn0[:, None], key, NOT_CANDIDATE)
        n_ins = tl.max(tl.sum((key > mn0[:, None]).to(tl.int32), 1), 0)
        for _ in range(0, n_ins):
            x = tl.max(cand, 1)
            mn = tl.min(best, 1)
            best = tl.where((best == mn[:, None]) & (x > mn)[:, None], x[:, None], best)
            cand = tl.where(cand == x[:, None], NOT_CANDIDATE, cand)

    valid = ((best >> 32) > 0) & (col[None, :] < N)
    blk = _flip(best & BLOCK_MASK).to(tl.int32)
    # ascending order by rank (valid blocks first, ascending; then the -1 padding)
    v = tl.where(valid, blk, _flip(col[None, :]))
    rank = tl.sum((v[:, None, :] < v[:, :, None]).to(tl.int32), 2)
    out = idx + ((b.to(tl.int64) * Tq + tok[:, None]) * H + h) * N + rank
    tl.store(out, tl.where(valid, blk, -1).to(tl.int64), mask=(tok[:, None] < Tq) & (rank < N))


#: query rows (tokens x padded group) per program and warps on CUDA (bench_nsa.py --sweep)
TUNE = dict(rows=64, warps=4)


def _select_blocks(q, kc, lse, q_start: int, L: int, D: int, LS: int, n: int):
    B, Tq, HQ, K = q.shape
    Nc, H = kc.shape[1], kc.shape[2]
    G = HQ // H
    idx = torch.empty(B, Tq, H, n, device=q.device, dtype=torch.int64)
    if Tq == 0:
        return idx
    if Nc == 0:  # nothing to score; a valid pointer for the (fully masked) loads
        kc = q.new_zeros(B, 1, H, K)
    GP = triton.next_power_of_2(G)
    NP = max(16, triton.next_power_of_2(n))
    interpret = q.device.type == "cpu"
    rows = 128 if interpret else TUNE["rows"]
    BT = max(1, rows // GP)
    BK = max(16, triton.next_power_of_2(K))
    grid = (triton.cdiv(Tq, BT), B * H)
    _topk_kernel[grid](
        q, kc, lse, idx, Tq, Nc, q_start, 1.0 / math.sqrt(K),
        H=H, G=G, GP=GP, K=K, BK=BK, L=L, D=D, LS=LS,
        N=n, NP=NP, BT=BT, BC=triton.next_power_of_2(NP * (LS // D)),
        num_warps=4 if interpret else TUNE["warps"], num_stages=1 if interpret else 2,
    )
    return idx


@torch.library.custom_op("nsa::select_blocks", mutates_args=())
def select_blocks_op(q: torch.Tensor, kc: torch.Tensor, lse: torch.Tensor, q_start: int, L: int, D: int,
                  LS: int, n: int) -> torch.Tensor:
    return _select_blocks(q, kc, lse, q_start, L, D, LS, n)


@select_blocks_op.register_fake
def _(q, kc, lse, q_start, L, D, LS, n):
    return q.new_empty((q.shape[0], q.shape[1], kc.shape[2], n), dtype=torch.int64)


def select_blocks(q, kc, lse, q_start: int, L: int, D: int, LS: int, n: int):
    """Selected block indices [B, Tq, H, n] (int64, ascending, -1 padded) of q [B, Tq, HQ, K]
    at positions q_start.., from the compressed keys kc [B, Nc, H, K] (compressed token i
    covers [i*D, i*D + L)) and the compressed branch's lse [B, Tq, HQ] (natural log): blocks of
    LS tokens, the n best of each KV group (see the module docstring). Under torch.compile it
    runs as the custom op nsa::select_blocks (opaque, no gradient)."""
    q, kc, lse = (t.detach().contiguous() for t in (q, kc, lse))
    return run_op(select_blocks_op, _select_blocks, q, kc, lse, int(q_start), int(L), int(D), int(LS), int(n))
