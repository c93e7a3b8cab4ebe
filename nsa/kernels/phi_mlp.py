"""Triton kernels of the compressors' MLP phi (nsa.attention.phi_mlp) for G <= 2 streams at once
(a layer's key and value compressors): one launch forward, three backward, nothing else on the
device (no copy of the streams' chunks, no cast of the parameters, no stack of the gradients).

Block i of a stream (n blocks from token first*d) is r = l/d chunks of d tokens, chunks i..i+r-1:

    pre = sum_q W1_q chunk_{i+q} + (W1 flatten(pos) + b1)     W1_q: the q-th d*K columns of W1
    hidden = silu(pre);  out = W2 hidden + b2

The products read their operands in the compute dtype (the streams'), the parameters cast in
the kernel as ``.to()`` rounds them, and accumulate in float32; pre, hidden and out are rounded
to the compute dtype where the traced MLP rounds them. The forward also writes fc1's input (the
chunks, nsa.attention.compress.fc1_input's layout) and pre, which the backward reads. The
backward's parameter gradients are sums over every row: each of S segments of the rows sums its
share into float32 partial sums, which the last launch adds in segment order (a fixed order, no
atomics: a run's gradients are the same on every run), writing the parameters' dtype.

Shapes: streams x [B, T, H, K] (one dtype, the compute dtype; K stride 1); per stream W1
[KO, l*K], pos [l, K], b1 [KO], W2 [K, KO], b2 [K] (KO = K for NSA's compressors); fc1's input
flat [G, B, m, H, d*K] (m = n + r - 1 chunks); pre [G, B, n, H, KO]; out [G, B, n, H, K]. Rows
are (b, i, h), n_rows = B*n*H a stream; the streams are the grid's second axis.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from ._launch import dot_precision, launch, wide_offsets

#: the launches' preferred tiles (rows BM, columns BC of fc1's input or W1, BK of K) and their
#: fallbacks where the GPU cannot fit them (nsa.kernels._launch.launch). Every program reads all of
#: W1 or W2 for its rows, so the rows are as many as fit sm_90's registers without spilling at head
#: dim 128 in 16-bit dtypes
_TILES = dict(BM=64, BC=32, BK=32, num_warps=8, num_stages=2)
_HALVE = ("BM", "BC", "BK")
#: rows a segment of the parameter gradients' sums takes at least (its program's work), and the
#: float32 bytes the partial sums may take (the segments are fewer where the parameters are large)
_SEGMENT_ROWS = 256
_PARTIAL_BYTES = 32 << 20
#: the elements of dW2 and db2 a program of the last launch adds
_BE = 1024


@triton.jit
def _pick(a, b, g):
    """a for stream g = 0, b for stream 1 (g a runtime value)."""
    p = a
    if g == 1:
        p = b
    return p


@triton.jit
def _index(x, WIDE: tl.constexpr):
    """x as offsets: int64 where a tensor spans 2^31 elements or more (WIDE), else int32 (half the
    registers a lane: nsa.kernels._launch.wide_offsets)."""
    if WIDE:
        y = x.to(tl.int64)
    else:
        y = x
    return y


@triton.jit
def _block_rows(rows, n, H):
    """(b, i, h) of rows (b, i, h) of n blocks and H heads."""
    return rows // (H * n), (rows // H) % n, rows % H


@triton.jit
def _phi_fwd_kernel(x0, x1, w1_0, w1_1, pos_0, pos_1, b1_0, b1_1, w2_0, w2_1, b2_0, b2_1, out, flat, pre,
                    n_rows, n, m, H, first, sxb, sxt, sxh,
                    K: tl.constexpr, KO: tl.constexpr, D: tl.constexpr, R: tl.constexpr, KEEP: tl.constexpr,
                    BO: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr,
                    BK: tl.constexpr):
    """out of BM rows of stream g; KEEP: also pre and fc1's input (chunk i of each row, and the
    r - 1 after the last block's first), for the backward."""
    DK: tl.constexpr = D * K
    LK: tl.constexpr = R * DK
    g = tl.program_id(1)
    x = _pick(x0, x1, g)
    w1 = _pick(w1_0, w1_1, g)
    pos = _pick(pos_0, pos_1, g)
    b1 = _pick(b1_0, b1_1, g)
    w2 = _pick(w2_0, w2_1, g)
    b2 = _pick(b2_0, b2_1, g)
    dt = x.dtype.element_ty
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rmask = rows < n_rows
    b, i, h = _block_rows(rows, n, H)
    o = tl.arange(0, BO)
    omask = o < KO
    xrow = _index(b, WIDE) * sxb + _index((first + i) * D, WIDE) * sxt + h * sxh
    # chunk i + q of the row in fc1's input starts at (frow + q * H) * DK
    frow = (_index(g * (n_rows // (n * H)) + b, WIDE) * m + i) * H + h
    last = i == n - 1
    acc = tl.zeros([BM, BO], dtype=tl.float32)
    # W1 flatten(pos) as the first row of a product of tl.dot's least 16 rows (the others zero)
    pos_row = tl.arange(0, 16)[:, None] == 0
    w_pos = tl.zeros([16, BO], dtype=tl.float32)
    for c0 in range(0, LK, BC):
        col = c0 + tl.arange(0, BC)
        cmask = col < LK
        q = col // DK
        rem = col % DK
        mask = rmask[:, None] & cmask[None, :]
        a = tl.load(x + xrow[:, None] + ((q * D + rem // K) * sxt + rem % K)[None, :], mask=mask, other=0.0)
        if KEEP:
            tl.store(flat + (frow[:, None] + (q * H)[None, :]) * DK + rem[None, :], a,
                     mask=mask & ((q == 0)[None, :] | last[:, None]))
        w = tl.load(w1 + o[None, :] * LK + col[:, None], mask=cmask[:, None] & omask[None, :], other=0.0).to(dt)
        acc += tl.dot(a, w, input_precision=DOT)
        p = tl.load(pos + col, mask=cmask, other=0.0).to(dt)
        w_pos += tl.dot(tl.where(pos_row, p[None, :], 0.0).to(dt), w, input_precision=DOT)
    # W1 flatten(pos) + b1: one product in the compute dtype, as the traced MLP's baddbmm
    bias = (tl.sum(w_pos, 0) + tl.load(b1 + o, mask=omask, other=0.0).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    pre_v = (acc + bias[None, :]).to(dt)
    at = _index(g * n_rows + rows, WIDE)
    if KEEP:
        tl.store(pre + at[:, None] * KO + o[None, :], pre_v, mask=rmask[:, None] & omask[None, :])
    pf = pre_v.to(tl.float32)
    hidden = (pf * tl.sigmoid(pf)).to(dt)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        kmask = k < K
        w = tl.load(w2 + k[None, :] * KO + o[:, None], mask=omask[:, None] & kmask[None, :], other=0.0).to(dt)
        y = tl.dot(hidden, w, input_precision=DOT)
        y += tl.load(b2 + k, mask=kmask, other=0.0).to(dt).to(tl.float32)[None, :]
        tl.store(out + at[:, None] * K + k[None, :], y.to(dt), mask=rmask[:, None] & kmask[None, :])


@triton.jit
def _dpre_rows(do, sdb, sdn, sdh, w2, pre, dpre, g, tile, n_rows, n, H, K: tl.constexpr, KO: tl.constexpr,
               BO: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """dpre = (dout W2) * silu'(pre) of BM rows of stream g."""
    dt = pre.dtype.element_ty
    o = tl.arange(0, BO)
    omask = o < KO
    rows = tile * BM + tl.arange(0, BM)
    rmask = rows < n_rows
    b, i, h = _block_rows(rows, n, H)
    drow = _index(b, WIDE) * sdb + _index(i, WIDE) * sdn + h * sdh
    dh = tl.zeros([BM, BO], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        kmask = k < K
        dy = tl.load(do + drow[:, None] + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0).to(dt)
        w = tl.load(w2 + k[:, None] * KO + o[None, :], mask=kmask[:, None] & omask[None, :], other=0.0).to(dt)
        dh += tl.dot(dy, w, input_precision=DOT)
    dh = dh.to(dt).to(tl.float32)
    at = _index(g * n_rows + rows, WIDE)[:, None] * KO + o[None, :]
    pmask = rmask[:, None] & omask[None, :]
    p = tl.load(pre + at, mask=pmask, other=0.0).to(tl.float32)
    s = tl.sigmoid(p)
    tl.store(dpre + at, (dh * s * (1.0 + p * (1.0 - s))).to(dt), mask=pmask)


@triton.jit
def _dw2_segment(do, sdb, sdn, sdh, pre, part, g, tile, n_rows, n, H, seg, S, K: tl.constexpr,
                 KO: tl.constexpr, LK: tl.constexpr, BO: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr,
                 BM: tl.constexpr, BK: tl.constexpr):
    """Segment tile // cdiv(K, BK)'s partial sums of BK rows of dW2 = dout^T hidden and of
    db2 = sum dout (hidden = silu(pre) again, as the forward rounded it)."""
    P: tl.constexpr = KO * LK + KO + K * KO + K
    n_kt: tl.constexpr = (K + BK - 1) // BK
    dt = pre.dtype.element_ty
    o = tl.arange(0, BO)
    omask = o < KO
    s_ = tile // n_kt
    k = (tile % n_kt) * BK + tl.arange(0, BK)
    kmask = k < K
    acc = tl.zeros([BK, BO], dtype=tl.float32)
    db = tl.zeros([BK], dtype=tl.float32)
    end = tl.minimum(s_ * seg + seg, n_rows)
    for r0 in range(s_ * seg, end, BM):
        rows = r0 + tl.arange(0, BM)
        rmask = rows < end
        b, i, h = _block_rows(rows, n, H)
        drow = _index(b, WIDE) * sdb + _index(i, WIDE) * sdn + h * sdh
        dy = tl.load(do + drow[:, None] + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0).to(dt)
        p = tl.load(pre + _index(g * n_rows + rows, WIDE)[:, None] * KO + o[None, :],
                    mask=rmask[:, None] & omask[None, :], other=0.0).to(tl.float32)
        hidden = (p * tl.sigmoid(p)).to(dt)
        acc += tl.dot(tl.trans(dy), hidden, input_precision=DOT)
        db += tl.sum(dy.to(tl.float32), 0)
    base = part + (g * S + s_).to(tl.int64) * P + KO * LK + KO
    tl.store(base + k[:, None] * KO + o[None, :], acc, mask=kmask[:, None] & omask[None, :])
    tl.store(base + K * KO + k, db, mask=kmask)


@triton.jit
def _phi_bwd_pre_kernel(do0, do1, sdb, sdn, sdh, w2_0, w2_1, pre, dpre, part, n_rows, n, H, seg, S,
                        K: tl.constexpr, KO: tl.constexpr, LK: tl.constexpr, BO: tl.constexpr, DOT: tl.constexpr,
                        WIDE: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """The first cdiv(n_rows, BM) programs: dpre of BM rows (_dpre_rows); the others, one per
    segment and BK rows of W2: that segment's partial sums of dW2 and db2 (_dw2_segment)."""
    g = tl.program_id(1)
    pid = tl.program_id(0)
    do = _pick(do0, do1, g)
    n_pre = tl.cdiv(n_rows, BM)
    if pid < n_pre:
        _dpre_rows(do, sdb, sdn, sdh, _pick(w2_0, w2_1, g), pre, dpre, g, pid, n_rows, n, H, K, KO, BO, DOT, WIDE,
                   BM, BK)
    else:
        _dw2_segment(do, sdb, sdn, sdh, pre, part, g, pid - n_pre, n_rows, n, H, seg, S, K, KO, LK, BO, DOT,
                     WIDE, BM, BK)


@triton.jit
def _dx_rows(dpre, w1, dx, g, tile, B, n, H, T, first, n_chunks, K: tl.constexpr, KO: tl.constexpr,
             D: tl.constexpr, R: tl.constexpr, BO: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr,
             BM: tl.constexpr, BC: tl.constexpr):
    """dx of BM rows (b, a, h) of stream g's n_chunks chunks of d tokens (all T tokens): chunk a
    (c = a - first among the blocks' chunks) gets sum_q dpre[block c - q] W1_q, zero where no
    block reads it."""
    DK: tl.constexpr = D * K
    LK: tl.constexpr = R * DK
    dt = dpre.dtype.element_ty
    o = tl.arange(0, BO)
    omask = o < KO
    rows = tile * BM + tl.arange(0, BM)
    rmask = rows < B * n_chunks * H
    b, a, h = _block_rows(rows, n_chunks, H)
    xrow = (_index(g * B + b, WIDE) * T + a * D) * H * K + h * K
    for c0 in range(0, DK, BC):
        col = c0 + tl.arange(0, BC)
        cmask = col < DK
        acc = tl.zeros([BM, BC], dtype=tl.float32)
        for q in range(R):
            i = a - first - q
            ok = rmask & (i >= 0) & (i < n)
            dp = tl.load(dpre + (((_index(g * B + b, WIDE) * n + i) * H + h) * KO)[:, None] + o[None, :],
                         mask=ok[:, None] & omask[None, :], other=0.0)
            w = tl.load(w1 + o[:, None] * LK + q * DK + col[None, :], mask=omask[:, None] & cmask[None, :],
                        other=0.0).to(dt)
            acc += tl.dot(dp, w, input_precision=DOT)
        j = col // K
        tl.store(dx + xrow[:, None] + (j * H * K + col % K)[None, :], acc.to(dx.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :] & (a[:, None] * D + j[None, :] < T))


@triton.jit
def _dw1_segment(dpre, flat, part, g, tile, n_rows, n, m, H, seg, S, K: tl.constexpr, KO: tl.constexpr,
                 D: tl.constexpr, R: tl.constexpr, BO: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr,
                 BM: tl.constexpr, BC: tl.constexpr):
    """Segment tile // cdiv(l*K, BC)'s partial sums of BC columns of dW1 = dpre^T blocks (the
    blocks read from fc1's input) and, for the first columns, of db1 = sum dpre."""
    DK: tl.constexpr = D * K
    LK: tl.constexpr = R * DK
    P: tl.constexpr = KO * LK + KO + K * KO + K
    n_ct: tl.constexpr = (LK + BC - 1) // BC
    o = tl.arange(0, BO)
    omask = o < KO
    s_ = tile // n_ct
    ct = tile % n_ct
    col = ct * BC + tl.arange(0, BC)
    cmask = col < LK
    q = col // DK
    rem = col % DK
    B = n_rows // (n * H)
    acc = tl.zeros([BO, BC], dtype=tl.float32)
    db = tl.zeros([BO], dtype=tl.float32)
    end = tl.minimum(s_ * seg + seg, n_rows)
    for r0 in range(s_ * seg, end, BM):
        rows = r0 + tl.arange(0, BM)
        rmask = rows < end
        b, i, h = _block_rows(rows, n, H)
        dp = tl.load(dpre + _index(g * n_rows + rows, WIDE)[:, None] * KO + o[None, :],
                     mask=rmask[:, None] & omask[None, :], other=0.0)
        frow = (_index(g * B + b, WIDE) * m + i) * H + h
        blk = tl.load(flat + (frow[:, None] + (q * H)[None, :]) * DK + rem[None, :],
                      mask=rmask[:, None] & cmask[None, :], other=0.0)
        acc += tl.dot(tl.trans(dp), blk, input_precision=DOT)
        db += tl.sum(dp.to(tl.float32), 0)
    base = part + (g * S + s_).to(tl.int64) * P
    tl.store(base + o[:, None] * LK + col[None, :], acc, mask=omask[:, None] & cmask[None, :])
    if ct == 0:
        tl.store(base + KO * LK + o, db, mask=omask)


@triton.jit
def _phi_bwd_main_kernel(dpre, flat, w1_0, w1_1, dx, part, n_rows, n, m, H, T, first, n_chunks, seg, S,
                         K: tl.constexpr, KO: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BO: tl.constexpr,
                         DOT: tl.constexpr, WIDE: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """The first programs: dx of BM rows of chunks (_dx_rows); the others, one per segment and BC
    columns of W1: that segment's partial sums of dW1 and db1 (_dw1_segment)."""
    g = tl.program_id(1)
    pid = tl.program_id(0)
    B = n_rows // (n * H)
    n_dx = tl.cdiv(B * n_chunks * H, BM)
    if pid < n_dx:
        _dx_rows(dpre, _pick(w1_0, w1_1, g), dx, g, pid, B, n, H, T, first, n_chunks, K, KO, D, R, BO, DOT,
                 WIDE, BM, BC)
    else:
        _dw1_segment(dpre, flat, part, g, pid - n_dx, n_rows, n, m, H, seg, S, K, KO, D, R, BO, DOT, WIDE, BM,
                     BC)


@triton.jit
def _sum_w1(part, w1, pos, grads, g, tile, S, G, K: tl.constexpr, KO: tl.constexpr, LK: tl.constexpr,
            BO: tl.constexpr, BC: tl.constexpr, dt: tl.constexpr):
    """BC columns of dW1 (with the outer product of db1 and flatten(pos)) and of dpos = db1 W1,
    and, for the first columns, db1."""
    P: tl.constexpr = KO * LK + KO + K * KO + K
    gt = grads.dtype.element_ty
    o = tl.arange(0, BO)
    omask = o < KO
    col = tile * BC + tl.arange(0, BC)
    cmask = col < LK
    mask = omask[:, None] & cmask[None, :]
    db = tl.zeros([BO], dtype=tl.float32)
    acc = tl.zeros([BO, BC], dtype=tl.float32)
    for s_ in range(0, S):
        at = part + (g * S + s_).to(tl.int64) * P
        db += tl.load(at + KO * LK + o, mask=omask, other=0.0)
        acc += tl.load(at + o[:, None] * LK + col[None, :], mask=mask, other=0.0)
    p = tl.load(pos + col, mask=cmask, other=0.0).to(dt).to(tl.float32)
    acc += db[:, None] * p[None, :]
    tl.store(grads + g * KO * LK + o[:, None] * LK + col[None, :], acc.to(gt), mask=mask)
    w = tl.load(w1 + o[:, None] * LK + col[None, :], mask=mask, other=0.0).to(dt).to(tl.float32)
    tl.store(grads + G * KO * LK + g * LK + col, tl.sum(db[:, None] * w, 0).to(gt), mask=cmask)
    if tile == 0:
        tl.store(grads + G * (KO * LK + LK) + g * KO + o, db.to(gt), mask=omask)


@triton.jit
def _sum_w2(part, grads, g, tile, S, G, K: tl.constexpr, KO: tl.constexpr, LK: tl.constexpr, BE: tl.constexpr):
    """BE elements of dW2 and db2 (their partial sums' elements: dW2's K*KO, then db2's K)."""
    P: tl.constexpr = KO * LK + KO + K * KO + K
    e = tile * BE + tl.arange(0, BE)
    emask = e < K * KO + K
    acc = tl.zeros([BE], dtype=tl.float32)
    for s_ in range(0, S):
        acc += tl.load(part + (g * S + s_).to(tl.int64) * P + KO * LK + KO + e, mask=emask, other=0.0)
    w2_at = G * (KO * LK + LK + KO)
    to = tl.where(e < K * KO, w2_at + g * K * KO + e, w2_at + G * K * KO + g * K + (e - K * KO))
    tl.store(grads + to, acc.to(grads.dtype.element_ty), mask=emask)


@triton.jit
def _phi_bwd_sum_kernel(part, dpre, w1_0, w1_1, pos_0, pos_1, grads, S, G,
                        K: tl.constexpr, KO: tl.constexpr, LK: tl.constexpr, BO: tl.constexpr, BC: tl.constexpr,
                        BE: tl.constexpr):
    """The parameters' gradients from the segments' partial sums, added in segment order, into
    grads (the parameters' dtype; nsa.attention.phi_mlp.NAMES's order, the streams' one after the
    other for each name): the first programs BC columns of W1 (_sum_w1), the others BE elements
    of W2 and b2 (_sum_w2). dpre: any tensor of the compute dtype (W1 and pos are read cast to it,
    as the forward read them)."""
    g = tl.program_id(1)
    pid = tl.program_id(0)
    n_ct: tl.constexpr = (LK + BC - 1) // BC
    if pid < n_ct:
        _sum_w1(part, _pick(w1_0, w1_1, g), _pick(pos_0, pos_1, g), grads, g, pid, S, G, K, KO, LK, BO, BC,
                dpre.dtype.element_ty)
    else:
        _sum_w2(part, grads, g, pid - n_ct, S, G, K, KO, LK, BE)


def _pairs(tensors: Sequence[torch.Tensor], G: int) -> list[list[torch.Tensor]]:
    """Parameters name by name (G of each) as [stream 0's, stream 1's] pairs, one a name (a lone
    stream's twice: the kernels' second pointers, which they then do not read)."""
    groups = [list(tensors[i:i + G]) for i in range(0, len(tensors), G)]
    return [[t.contiguous() for t in grp] * (2 // G) for grp in groups]


def _same_strides(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """ts as the kernels read them: one set of strides for all, K's 1 (else contiguous copies)."""
    if ts[0].stride(-1) == 1 and all(t.stride() == ts[0].stride() for t in ts):
        return list(ts)
    return [t.contiguous() for t in ts]


def phi_mlp_forward(xs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], first: int, n: int, d: int,
                    keep: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """out [G, B, n, H, K] of the G streams xs ([B, T, H, K], the compute dtype) through their
    compressors' parameters ``params`` (nsa.attention.phi_mlp.NAMES's order, G of each), blocks
    from ``first`` (n of them) every d tokens; ``keep``: with fc1's input [G, B, m, H, d*K] and
    pre [G, B, n, H, KO] for the backward (else None, None)."""
    G = len(xs)
    xs = _same_strides(xs)
    x = xs[0]
    B, T, H, K = x.shape
    w1, pos, b1, w2, b2 = _pairs(params, G)
    KO = w1[0].shape[0]
    r = pos[0].shape[0] // d
    m = n + r - 1
    out = torch.empty(G, B, n, H, K, device=x.device, dtype=x.dtype)
    flat = torch.empty(G, B, m, H, d * K, device=x.device, dtype=x.dtype) if keep else None
    pre = torch.empty(G, B, n, H, KO, device=x.device, dtype=x.dtype) if keep else None
    n_rows = B * n * H
    span = max(_span(x), G * B * m * H * d * K)
    launch(_phi_fwd_kernel, lambda c: (triton.cdiv(n_rows, c["BM"]), G),
           (*xs * (2 // G), *w1, *pos, *b1, *w2, *b2, out, flat if keep else out, pre if keep else out,
            n_rows, n, m, H, first, x.stride(0), x.stride(1), x.stride(2)),
           dict(K=K, KO=KO, D=d, R=r, KEEP=keep, BO=_lanes(KO), DOT=dot_precision(x.dtype),
                WIDE=wide_offsets(span)), _TILES, _HALVE)
    return out, flat, pre


def phi_mlp_backward(douts: Sequence[torch.Tensor], flat: torch.Tensor, pre: torch.Tensor,
                     params: Sequence[torch.Tensor], first: int, T: int, grads_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``phi_mlp_forward``'s inputs from those of its G outputs (douts, [B, n, H,
    K] each) and what it kept (flat, pre): the parameters' (one tensor in grads_dtype, NAMES's
    sizes in its order) and the streams' dx [G, B, T, H, K] (fc1's input's dtype; zero for
    tokens no block reads). params: W1, pos and W2 of each stream (G each, in that order)."""
    G, B, m, H, DK = flat.shape
    n, KO = pre.shape[2], pre.shape[-1]
    douts = _same_strides(douts)
    w1, pos, w2 = _pairs(params, G)
    LK = w1[0].shape[1]
    K = w2[0].shape[0]
    d = DK // K
    r = LK // DK
    n_rows = B * n * H
    dev, dt = flat.device, flat.dtype
    P = KO * LK + KO + K * KO + K
    S = max(1, min(triton.cdiv(n_rows, _SEGMENT_ROWS), _PARTIAL_BYTES // (4 * P * G)))
    seg = triton.cdiv(n_rows, S)
    dpre = torch.empty(G, B, n, H, KO, device=dev, dtype=dt)
    part = torch.empty(G, S, P, device=dev, dtype=torch.float32)
    dx = torch.empty(G, B, T, H, K, device=dev, dtype=dt)
    grads = torch.empty(G * (KO * LK + LK + KO + K * KO + K), device=dev, dtype=grads_dtype)
    dy = douts[0]
    wide = wide_offsets(max(_span(dy), dx.numel(), flat.numel()))
    meta = dict(K=K, KO=KO, BO=_lanes(KO), DOT=dot_precision(dt), WIDE=wide)
    launch(_phi_bwd_pre_kernel, lambda c: (triton.cdiv(n_rows, c["BM"]) + S * triton.cdiv(K, c["BK"]), G),
           (*douts * (2 // G), dy.stride(0), dy.stride(1), dy.stride(2), *w2, pre, dpre, part, n_rows, n, H, seg, S),
           dict(meta, LK=LK), *_tiles("BM", "BK"))
    n_chunks = triton.cdiv(T, d)
    launch(_phi_bwd_main_kernel,
           lambda c: (triton.cdiv(B * n_chunks * H, c["BM"]) + S * triton.cdiv(LK, c["BC"]), G),
           (dpre, flat, *w1, dx, part, n_rows, n, m, H, T, first, n_chunks, seg, S),
           dict(meta, D=d, R=r), *_tiles("BM", "BC"))
    sums = dict(BC=_TILES["BC"], num_warps=_TILES["num_warps"], num_stages=1)
    launch(_phi_bwd_sum_kernel, lambda c: (triton.cdiv(LK, c["BC"]) + triton.cdiv(K * KO + K, _BE), G),
           (part, dpre, *w1, *pos, grads, S, G), dict(K=K, KO=KO, LK=LK, BO=_lanes(KO), BE=_BE), sums, ("BC",))
    return grads, dx


def _tiles(*names: str) -> tuple[dict, tuple[str, ...]]:
    """The launch base (``_TILES``'s tiles of ``names``, its warps and stages) and the tiles the
    ladder halves, for a kernel that takes only those tiles: Triton refuses a keyword its kernel
    does not declare."""
    base = {k: v for k, v in _TILES.items() if k in names or k.startswith("num_")}
    return base, tuple(k for k in _HALVE if k in names)


def _span(t: torch.Tensor) -> int:
    """The elements from t's first to one past its last: what an offset into it may reach."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def _lanes(n: int) -> int:
    """A tile's lanes for n values: a power of two, at least tl.dot's 16."""
    return max(16, triton.next_power_of_2(n))
