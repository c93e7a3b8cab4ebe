"""The selected branch's forward, key-block-major: for each (batch, KV head, key block), the
query rows of the tokens that selected it are gathered into full tiles against the block's
keys, which are loaded once (FSA, arXiv 2508.18224; FlashMoBA, arXiv 2511.11571).

The token-major forward (nsa.kernels.selection) gives one program a token's G query heads as
the rows of its tiles and gathers the token's n blocks of K and V: at G = 6 ten of its sixteen
rows idle, and every (token, KV head) pulls n * l' * K * 2 values out of L2 (128 KiB at n = 16,
l' = 64, K = 64, bf16), which bounds it. Here a program takes a
work item of the inverse selection (nsa.kernels._inverse: up to qc tokens that chose one block),
loads the block's keys and values once and runs the items' (token, head) rows through them BM at
a time, G rows a token, no padding. Each (token, head, slot) gets a partial output, normalised,
with its float32 log-sum-exp; a second kernel combines a row's n partials in slot order, in
float32. No atomics: the result does not depend on the order programs run in.

Cost: the partials, B * Tq * HQ * n * K values written and read once, instead of the gather.
They are stored in q's dtype when it has 16 bits (float32 otherwise): a normalised partial is a
convex combination of value rows, so rounding it adds at most one rounding of the output's own
dtype, while float32 partials would double the combine kernel's traffic. The
partials of at most ``budget`` bytes (nsa.kernels.tuning.SelectionTuning.partials_budget) are held
at once: longer inputs are taken a chunk of query tokens at a time.

Shapes: q, o [B, Tq, HQ, K] at positions q_start..; k, v [B, Tk, H, K]; idx [B, Tq, H, n]
(ascending, -1 padded); lse [B, Tq, HQ] float32, natural log; G = HQ // H.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._inverse import Inverse, inverse_selection, item_block, item_rows
from ._launch import dot_precision, launch
from ._softmax import LN2, LOG2E

@triton.jit
def _blocks_fwd_kernel(
    q, k, v, tokens, perm, item_seg, item_start, item_end, o_part, lse_part,
    Tc, Tq, a, Tk, NB, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, BM: tl.constexpr, DOT: tl.constexpr,
):
    """One work item: block j of KV head h of batch b against the (token, head) rows of the
    entries in [item_start, item_end) of the inverse selection of segment seg = (b * H + h) * NB
    + j (tokens: each sorted entry's token). The tokens are those of a chunk of Tc tokens from
    token a of q [B, Tq, HQ, K] (positions q_start + a ..); o_part and lse_part are indexed by
    the chunk's idx entry (token, h, slot) each entry came from (perm), and the head."""
    w = tl.program_id(0)
    s0 = tl.load(item_start + w)
    s1 = tl.load(item_end + w)
    if s0 < s1:
        b, h, offs, kpos, kval, offk, kmask, kv_base, kt, vt = item_block(
            k, v, tl.load(item_seg + w), Tk, NB, H, K, BK, LS, BS)
        HQ: tl.constexpr = H * G
        qk_scale = sm_scale * LOG2E
        for r0 in range(s0 * G, s1 * G, BM):
            rmask, u, g, t = item_rows(tokens, r0, s1, G, BM)
            row = (b.to(tl.int64) * Tq + a + t) * HQ + h * G + g
            qt = tl.load(q + row[:, None] * K + offk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale
            vis = rmask[:, None] & kval[None, :] & (kpos[None, :] <= (q_start + a + t)[:, None])
            s = tl.where(vis, s, float("-inf"))
            m = tl.max(s, 1)
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            p = tl.exp2(s - m_safe[:, None])
            l_sum = tl.sum(p, 1)
            acc = tl.dot(p.to(vt.dtype), vt, input_precision=DOT)
            has = l_sum > 0
            l_safe = tl.where(has, l_sum, 1.0)
            part = tl.load(perm + u, mask=rmask, other=0) * G + g  # (idx entry, head)
            tl.store(o_part + part[:, None] * K + offk[None, :], (acc / l_safe[:, None]).to(o_part.dtype.element_ty),
                     mask=rmask[:, None] & kmask[None, :])
            tl.store(lse_part + part, tl.where(has, m_safe + tl.log2(l_safe), float("-inf")), mask=rmask)


@triton.jit
def _blocks_combine_kernel(
    idx, o_part, lse_part, o, lse, n_rows, Tc, Tq, a,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, N: tl.constexpr, BR: tl.constexpr,
):
    """BR rows (b, token, head) of the chunk: o = sum over the row's valid slots of
    exp2(lse_s - LSE) * o_s with LSE = log2 sum exp2(lse_s) (base-2 partial lse), in slot
    order, in float32; o and the natural-log lse go to the rows of the chunk's tokens in o, lse
    [B, Tq, HQ(, K)]. The slot loop is unrolled and no load waits on another, so that a row's
    n loads are in flight together: as a loop they wait on each other, stalled on memory
    latency."""
    HQ: tl.constexpr = H * G
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = r < n_rows
    bt = r // HQ  # b * Tc + token of the chunk
    hq = r % HQ
    g = hq % G
    e0 = (bt.to(tl.int64) * H + hq // G) * N  # the row's first idx entry in the chunk
    offk = tl.arange(0, BK)
    m2 = rm[:, None] & (offk < K)[None, :]
    m_i = tl.full([BR], float("-inf"), tl.float32)
    l_i = tl.zeros([BR], tl.float32)
    acc = tl.zeros([BR, BK], tl.float32)
    for i in tl.static_range(N):
        # every slot of a row in range is loaded (its partial buffer exists; a -1 slot's is
        # unwritten) and a -1 slot dropped after: no load waits on the idx load
        valid = tl.load(idx + e0 + i, mask=rm, other=-1) >= 0
        part = (e0 + i) * G + g
        lse_s = tl.where(valid, tl.load(lse_part + part, mask=rm, other=float("-inf")), float("-inf"))
        o_s = tl.where(valid[:, None], tl.load(o_part + part[:, None] * K + offk[None, :], mask=m2, other=0.0), 0.0)
        o_s = o_s.to(tl.float32)
        m_new = tl.maximum(m_i, lse_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        beta = tl.exp2(lse_s - m_safe)
        l_i = l_i * alpha + beta
        acc = acc * alpha[:, None] + beta[:, None] * o_s
        m_i = m_new
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    row = ((bt // Tc).to(tl.int64) * Tq + a + bt % Tc) * HQ + hq
    tl.store(o + row[:, None] * K + offk[None, :], (acc / l_safe[:, None]).to(o.dtype.element_ty), mask=m2)
    tl.store(lse + row, tl.where(has, (m_i + tl.log2(l_safe)) * LN2, float("-inf")), mask=rm)


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """The partial outputs' dtype for inputs of ``dtype`` (see the module docstring)."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def _chunk(B: int, Tq: int, HQ: int, n: int, K: int, itemsize: int, budget: int) -> int:
    """Query tokens per pass: as many as keep their partials (``itemsize`` bytes a value) within
    ``budget`` bytes."""
    return max(1, min(Tq, budget // (B * HQ * n * K * itemsize)))


def one_pass(q: torch.Tensor, n: int, budget: int) -> bool:
    """Whether blocks_forward takes all of q's tokens in one pass (one inverse selection)."""
    B, Tq, HQ, K = q.shape
    return _chunk(B, Tq, HQ, n, K, partial_dtype(q.dtype).itemsize, budget) >= Tq


def blocks_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, sel_block: int,
                   q_start: int, tiles: dict, qc: int, budget: int, combine: tuple[int, int],
                   ) -> tuple[torch.Tensor, torch.Tensor, Inverse | None]:
    """o [B, Tq, HQ, K] (q's dtype) and lse [B, Tq, HQ] (float32, natural log) of the selected
    branch, key-block-major (see the module docstring), from work items of at most ``qc`` tokens;
    and idx's inverse selection where one pass took all tokens (else None), which the dk/dv pass
    of the backward can use again. ``tiles``: the forward kernel's preferred launch, BM rows a
    step, num_warps, num_stages; ``budget``: bytes of partials held at once; ``combine``: the
    combining kernel's partial values in flight a program and its warps."""
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    G, n = HQ // H, idx.shape[-1]
    o = torch.empty_like(q)
    lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    BK = max(16, triton.next_power_of_2(K))
    meta = dict(H=H, G=G, K=K, BK=BK)
    part_dtype = partial_dtype(q.dtype)
    chunk = _chunk(B, Tq, HQ, n, K, part_dtype.itemsize, budget)
    inverse = None
    for a in range(0, Tq, chunk):
        Tc = min(chunk, Tq - a)
        idx_c = idx[:, a:a + Tc].contiguous()
        inverse = inverse_selection(idx_c, Tk, sel_block, qc)
        tokens, perm, (seg, start, end), NB = inverse
        o_part = torch.empty(idx_c.numel() * G * K, device=q.device, dtype=part_dtype)
        lse_part = torch.empty(idx_c.numel() * G, device=q.device, dtype=torch.float32)
        launch(_blocks_fwd_kernel, lambda c: (seg.numel(),),
               (q, k, v, tokens, perm, seg, start, end, o_part, lse_part, Tc, Tq, a, Tk, NB, q_start,
                1.0 / math.sqrt(K)),
               dict(meta, LS=sel_block, BS=max(16, triton.next_power_of_2(sel_block)), DOT=dot_precision(q.dtype)),
               tiles, halve=("BM",))
        rows = B * Tc * HQ
        values, warps = combine  # SelectionTuning's defaults: 64 partial values a thread on 4 warps
        BR = max(1, values // (triton.next_power_of_2(n) * BK))
        _blocks_combine_kernel[(triton.cdiv(rows, BR),)](idx_c, o_part, lse_part, o, lse, rows, Tc, Tq, a, N=n,
                                                         BR=BR, num_warps=warps, **meta)
    return o, lse, inverse if chunk >= Tq else None
