"""Triton band attention: softmax attention where query position p sees the keys of one
interval [lo(p), hi(p)]. It is the kernel behind two NSA branches:

* compressed attention: keys are compressed tokens, i visible iff i*D + L - 1 <= p, i.e.
  hi(p) = floor((p + 1 - L) / D), lo = 0 (L = l, D = d);
* sliding window: hi(p) = p, lo(p) = p - W + 1 (L = D = 1, WINDOW = True).

GQA: one program owns a run of rows of one KV group, rows being (token, head) pairs flattened
as row = t * G + g, so every group size G works with no padding and each key tile is loaded
once for the G heads that share it. Forward and backward are FlashAttention-2 style with
fp32 accumulation (bf16/fp16/fp32 in); the backward recomputes probabilities from the saved
log-sum-exp: one kernel for dq (it also writes delta = rowsum(do * o)), one for dk/dv.

Shapes: q, o [B, Tq, HQ, K]; k, v [B, Tk, H, K]; lse [B, Tq, HQ] (float32, natural log,
-inf where a row sees no key; its output is zero). Query rows are at absolute positions
q_start .. q_start + Tq - 1.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ._autograd import kernel_op
from .tuning import BAND, BandTiles
from ._launch import dot_precision, fp32_small_tiles, launch, wide_offsets
from ._softmax import LOG2E, dq_rows, finish, lse_log2, online_step, score_grad


@triton.jit
def _hi_lo(pos, Tk, L: tl.constexpr, D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr):
    """Visible key interval [lo, hi] of query position pos (hi < lo when none)."""
    hi = tl.where(pos + 1 >= L, (pos + 1 - L) // D, -1)
    hi = tl.minimum(hi, Tk - 1)
    if WINDOW:
        lo = tl.maximum(pos - W + 1, 0)
    else:
        lo = pos * 0
    return lo, hi


@triton.jit
def _row_block_segments(pid_m, Tq, Tk, q_start, G: tl.constexpr, L: tl.constexpr, D: tl.constexpr,
                        W: tl.constexpr, WINDOW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The key range [start, end) a block of BM query rows loops over, in BN-key tiles, and
    [whole_lo, whole_hi) inside it: the tiles every row of the block sees whole (no visibility
    mask needed). lo and hi do not decrease along the rows, so the first and last rows bound
    them."""
    t_first = (pid_m * BM) // G
    t_last = tl.minimum((pid_m * BM + BM - 1) // G, Tq - 1)
    lo_first, hi_first = _hi_lo(q_start + t_first, Tk, L, D, W, WINDOW)
    lo_last, hi_last = _hi_lo(q_start + t_last, Tk, L, D, W, WINDOW)
    start = (lo_first // BN) * BN
    end = hi_last + 1
    whole_lo = tl.minimum(tl.maximum(tl.cdiv(lo_last, BN) * BN, start), end)
    whole_hi = tl.maximum(tl.minimum(((hi_first + 1) // BN) * BN, end), whole_lo)
    return start, whole_lo, whole_hi, end


@triton.jit
def _row_block(k, v, Tq, Tk, q_start, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
               D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr):
    """What the forward and the dq kernel share: the program's BM query rows (grid: row blocks,
    B * H). Returns where its rows are in q/o/do/dq: the offset of the block's first row
    (qb) and each row's offset from it (row_off, [BM]; add the head-dim lanes for the tile),
    and the tile's mask; the offsets of its rows in lse/delta and their mask; k and v at its
    KV head; the head-dim lanes; each row's visible key interval [lo, hi]; and the key
    segments of _row_block_segments. (The forward addresses its tile as q + qb + row_off + lanes,
    pointer first: forming qb + row_off first doubled its register spills on sm_90.)"""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < Tq * G
    t = rows // G
    g = rows % G
    offk = tl.arange(0, BK)
    kmask = offk < K
    qb = (b.to(tl.int64) * Tq * HQ + h * G) * K
    row_off = (t * HQ + g).to(tl.int64) * K
    l_off = b.to(tl.int64) * Tq * HQ + h * G + t * HQ + g
    kv_base = (b.to(tl.int64) * Tk * H + h) * K
    lo, hi = _hi_lo(q_start + t, Tk, L, D, W, WINDOW)
    start, whole_lo, whole_hi, end = _row_block_segments(pid_m, Tq, Tk, q_start, G, L, D, W, WINDOW, BM, BN)
    return (qb, row_off, rmask[:, None] & kmask[None, :], l_off, rmask, k + kv_base, v + kv_base, offk, kmask, lo, hi,
            start, whole_lo, whole_hi, end)


@triton.jit
def _key_tile(k_base, v_base, n0, end, lo, hi, offk, kmask, H: tl.constexpr, K: tl.constexpr, BN: tl.constexpr,
              MASK: tl.constexpr, WIDE: tl.constexpr):
    """The BN keys and values from n0 (k_base, v_base: k and v at the KV head and batch) and,
    MASK, the rows' visibility of them [BM, BN] (unmasked: every row sees every key of the tile,
    returned as True). WIDE: a sequence's keys span 2^31 elements or more (int64 offsets;
    nsa.kernels._launch.wide_offsets)."""
    cols = n0 + tl.arange(0, BN)
    if WIDE:
        kv_off = cols.to(tl.int64)[:, None] * (H * K) + offk[None, :]
    else:
        kv_off = cols[:, None] * (H * K) + offk[None, :]
    if MASK:
        lm = (cols < end)[:, None] & kmask[None, :]
        vis = (cols[None, :] <= hi[:, None]) & (cols[None, :] >= lo[:, None])
    else:
        lm = kmask[None, :]
        vis = True
    kt = tl.load(k_base + kv_off, mask=lm, other=0.0)
    vt = tl.load(v_base + kv_off, mask=lm, other=0.0)
    return kt, vt, vis


@triton.jit
def _fwd_tile(acc, m_i, l_i, qt, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
              H: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr, DOT: tl.constexpr,
              WIDE: tl.constexpr):
    """One key tile of the forward's online softmax; MASK: apply the rows' visibility."""
    kt, vt, vis = _key_tile(k_base, v_base, n0, end, lo, hi, offk, kmask, H, K, BN, MASK, WIDE)
    s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale
    if MASK:
        s = tl.where(vis, s, float("-inf"))
    return online_step(acc, m_i, l_i, s, vt, MASK, DOT)


@triton.jit
def _band_fwd_kernel(
    q, k, v, o, lse, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr, WIDE: tl.constexpr,
):
    qb, row_off, m2, l_off, rmask, k_base, v_base, offk, kmask, lo, hi, start, whole_lo, whole_hi, end = \
        _row_block(k, v, Tq, Tk, q_start, H, G, K, L, D, W, WINDOW, BM, BN, BK)
    qt = tl.load(q + qb + row_off[:, None] + offk[None, :], mask=m2, other=0.0)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BK], tl.float32)
    # unmasked tiles first: every row then has a finite maximum before the masked edges
    for n0 in range(whole_lo, whole_hi, BN):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, qt, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                                  H, K, BN, False, DOT, WIDE)
    for n0 in range(start, whole_lo, BN):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, qt, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                                  H, K, BN, True, DOT, WIDE)
    for n0 in range(whole_hi, end, BN):
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, qt, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                                  H, K, BN, True, DOT, WIDE)
    out, lse_row = finish(acc, m_i, l_i)
    tl.store(o + qb + row_off[:, None] + offk[None, :], out.to(o.dtype.element_ty), mask=m2)
    tl.store(lse + l_off, lse_row, mask=rmask)


@triton.jit
def _dq_tile(acc, qt, dot_, lse2, dl, rmask, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
             H: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr, DOT: tl.constexpr,
             WIDE: tl.constexpr):
    """One key tile of dq; MASK: apply the rows' visibility. Unmasked, the rows past Tq (zero
    do and delta) add nothing."""
    kt, vt, vis = _key_tile(k_base, v_base, n0, end, lo, hi, offk, kmask, H, K, BN, MASK, WIDE)
    s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale
    if MASK:
        p = tl.where(vis & rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
    else:
        p = tl.exp2(s - lse2[:, None])
    ds = score_grad(p, dot_, vt, dl, DOT)
    return acc + tl.dot(ds.to(kt.dtype), kt, input_precision=DOT)


@triton.jit
def _band_bwd_dq_kernel(
    q, k, v, o, do, lse, delta, dq, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DELTA_GIVEN: tl.constexpr, DOT: tl.constexpr,
    WIDE: tl.constexpr,
):
    qb, row_off, m2, l_off, rmask, k_base, v_base, offk, kmask, lo, hi, start, whole_lo, whole_hi, end = \
        _row_block(k, v, Tq, Tk, q_start, H, G, K, L, D, W, WINDOW, BM, BN, BK)
    q_off = qb + row_off[:, None] + offk[None, :]
    qt = tl.load(q + q_off, mask=m2, other=0.0)
    dot_, dl, lse2 = dq_rows(do, o, lse, delta, q_off, m2, l_off, rmask, DELTA_GIVEN)
    qk_scale = sm_scale * LOG2E
    acc = tl.zeros([BM, BK], tl.float32)
    for n0 in range(whole_lo, whole_hi, BN):
        acc = _dq_tile(acc, qt, dot_, lse2, dl, rmask, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                       H, K, BN, False, DOT, WIDE)
    for n0 in range(start, whole_lo, BN):
        acc = _dq_tile(acc, qt, dot_, lse2, dl, rmask, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                       H, K, BN, True, DOT, WIDE)
    for n0 in range(whole_hi, end, BN):
        acc = _dq_tile(acc, qt, dot_, lse2, dl, rmask, k_base, v_base, n0, end, lo, hi, qk_scale, offk, kmask,
                       H, K, BN, True, DOT, WIDE)
    tl.store(dq + q_off, (acc * sm_scale).to(dq.dtype.element_ty), mask=m2)


@triton.jit
def _dkv_rows(dk_acc, dv_acc, kt, vt, q, do, lse, delta, r0, r_end, cols, qbase, lbase0, q_start, Tk, qk_scale,
              offk, kmask, HQ: tl.constexpr, G: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
              D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr, BM: tl.constexpr, MASK: tl.constexpr,
              DOT: tl.constexpr):
    """One block of BM query rows against the program's key tile; MASK: apply the rows'
    visibility and the end of the rows (unmasked, all BM rows see every key of the tile)."""
    rows = r0 + tl.arange(0, BM)
    t = rows // G
    g = rows % G
    row_off = (t * HQ + g).to(tl.int64) * K
    ptrs = qbase + row_off[:, None] + offk[None, :]
    lidx = lbase0 + t * HQ + g
    if MASK:
        rmask = rows < r_end
        m2 = rmask[:, None] & kmask[None, :]
        qt = tl.load(q + ptrs, mask=m2, other=0.0)
        dot_ = tl.load(do + ptrs, mask=m2, other=0.0)
        lse2 = lse_log2(tl.load(lse + lidx, mask=rmask, other=0.0))
        dl = tl.load(delta + lidx, mask=rmask, other=0.0)
    else:  # every row sees a key of the tile: its lse is finite
        qt = tl.load(q + ptrs, mask=kmask[None, :], other=0.0)
        dot_ = tl.load(do + ptrs, mask=kmask[None, :], other=0.0)
        lse2 = tl.load(lse + lidx) * LOG2E
        dl = tl.load(delta + lidx)
    s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale
    if MASK:
        lo, hi = _hi_lo(q_start + t, Tk, L, D, W, WINDOW)
        vis = (cols[None, :] <= hi[:, None]) & (cols[None, :] >= lo[:, None]) & rmask[:, None]
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
    else:
        p = tl.exp2(s - lse2[:, None])
    dv_acc += tl.dot(tl.trans(p.to(dot_.dtype)), dot_, input_precision=DOT)
    ds = score_grad(p, dot_, vt, dl, DOT)
    dk_acc += tl.dot(tl.trans(ds.to(qt.dtype)), qt, input_precision=DOT)
    return dk_acc, dv_acc


@triton.jit
def _band_bwd_dkv_kernel(
    q, k, v, do, lse, delta, dk, dv, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, W: tl.constexpr, WINDOW: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ATOMIC: tl.constexpr, DOT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    n0 = pid_n * BN
    cols = n0 + tl.arange(0, BN)
    cmask = cols < Tk
    offk = tl.arange(0, BK)
    kmask = offk < K
    # the key tile's offsets: a scalar int64 base and int32 offsets inside the tile, formed
    # again for the stores after the loops, so that no [BN, BK] int64 offsets stay live across
    # the loops (fewer register spills in an sm_90 compile)
    kv_base = (b.to(tl.int64) * Tk * H + h) * K + n0.to(tl.int64) * (H * K)
    kv_off = tl.arange(0, BN)[:, None] * (H * K) + offk[None, :]
    kvm = cmask[:, None] & kmask[None, :]
    kt = tl.load(k + kv_base + kv_off, mask=kvm, other=0.0)
    vt = tl.load(v + kv_base + kv_off, mask=kvm, other=0.0)
    # first query position that sees key n0: n0*D + L - 1; the last that sees the tile's
    # last key in a window: n0 + BN - 1 + W - 1
    p_first = n0 * D + L - 1
    t_lo = tl.maximum(p_first - q_start, 0)
    t_hi = Tq
    if WINDOW:
        t_hi = tl.minimum(n0 + BN - 1 + W - q_start, Tq)
    r_start = ((t_lo * G) // BM) * BM
    r_end = t_hi * G
    # the rows are split over several programs when few key tiles would leave SMs idle
    # (compressed keys are S/d); partial dk/dv are then added atomically in float32
    rows_per_split = tl.cdiv(tl.cdiv(Tq * G, tl.num_programs(1)), BM) * BM
    r_start = tl.maximum(r_start, pid_s * rows_per_split)
    r_end = tl.minimum(r_end, (pid_s + 1) * rows_per_split)
    # [ra, rb): whole row blocks that see every key of the tile (the tile inside Tk, each
    # row's hi >= the tile's last key and, in a window, its lo <= the tile's first key)
    t_full = (n0 + BN - 1) * D + L - 1 - q_start
    ra = r_start + tl.cdiv(tl.maximum(t_full * G - r_start, 0), BM) * BM
    row_hi = r_end
    if WINDOW:
        row_hi = tl.minimum((n0 + W - q_start) * G, r_end)
    ra = tl.where(n0 + BN <= Tk, tl.minimum(ra, r_end), r_end)
    rb = ra + (tl.maximum(row_hi - ra, 0) // BM) * BM
    qbase = (b.to(tl.int64) * Tq * HQ + h * G) * K
    lbase0 = b.to(tl.int64) * Tq * HQ + h * G
    qk_scale = sm_scale * LOG2E
    dk_acc = tl.zeros([BN, BK], tl.float32)
    dv_acc = tl.zeros([BN, BK], tl.float32)
    for r0 in range(ra, rb, BM):
        dk_acc, dv_acc = _dkv_rows(dk_acc, dv_acc, kt, vt, q, do, lse, delta, r0, r_end, cols, qbase, lbase0,
                                   q_start, Tk, qk_scale, offk, kmask, HQ, G, K, L, D, W, WINDOW, BM, False, DOT)
    for r0 in range(r_start, ra, BM):
        dk_acc, dv_acc = _dkv_rows(dk_acc, dv_acc, kt, vt, q, do, lse, delta, r0, r_end, cols, qbase, lbase0,
                                   q_start, Tk, qk_scale, offk, kmask, HQ, G, K, L, D, W, WINDOW, BM, True, DOT)
    for r0 in range(rb, r_end, BM):
        dk_acc, dv_acc = _dkv_rows(dk_acc, dv_acc, kt, vt, q, do, lse, delta, r0, r_end, cols, qbase, lbase0,
                                   q_start, Tk, qk_scale, offk, kmask, HQ, G, K, L, D, W, WINDOW, BM, True, DOT)
    kv_off = tl.arange(0, BN)[:, None] * (H * K) + offk[None, :]
    kvm = cmask[:, None] & kmask[None, :]
    if ATOMIC:
        if r_start < r_end:
            tl.atomic_add(dk + kv_base + kv_off, dk_acc * sm_scale, mask=kvm)
            tl.atomic_add(dv + kv_base + kv_off, dv_acc, mask=kvm)
    else:
        tl.store(dk + kv_base + kv_off, (dk_acc * sm_scale).to(dk.dtype.element_ty), mask=kvm)
        tl.store(dv + kv_base + kv_off, dv_acc.to(dv.dtype.element_ty), mask=kvm)


#: (BM, BN, num_warps, num_stages) of the fwd, dq and dk/dv kernels on CUDA, by use (compressed
#: keys, sliding window) and head dim (<= 64, larger); the fastest of `python bench/bench_nsa.py
#: --sweep` at the benchmark shape (K=128) and the m7c shape (K=64)
TILES = {
    "cmp": {
        "fwd": ((128, 64, 4, 3), (128, 64, 8, 3)),
        "dq": ((64, 64, 4, 2), (64, 64, 4, 2)),
        "dkv": ((128, 64, 8, 2), (128, 64, 8, 2)),
    },
    "win": {
        "fwd": ((128, 64, 4, 3), (128, 32, 8, 4)),
        "dq": ((64, 64, 4, 2), (64, 64, 4, 2)),
        "dkv": ((64, 64, 4, 3), (64, 64, 4, 3)),
    },
}


#: (BM, BN, num_warps, num_stages) of all three kernels for the float32 launches of
#: nsa.kernels._launch.fp32_small_tiles: each compiles in seconds for sm_90 and fits its shared memory at K = 256
FP32_SMALL_TILES = (32, 32, 8, 2)


def _configs(K: int, interpret: bool, window: bool, small: bool = False,
             given: BandTiles = BAND) -> tuple[dict, dict, dict]:
    """The preferred launch of the fwd, dq and dk/dv kernels: dicts of BM, BN, num_warps and
    num_stages (nsa.kernels._launch.launch falls back from them where they do not fit); small:
    the float32 launches of fp32_small_tiles (FP32_SMALL_TILES); given: the tiles a caller asks for, each
    taken as it is (None: the rules here)."""
    if interpret:
        tiles = (32, 16, 4, 1), (32, 16, 4, 1), (16, 32, 4, 1)
    elif small:
        tiles = (FP32_SMALL_TILES,) * 3
    else:
        table = TILES["win" if window else "cmp"]
        i = 0 if K <= 64 else 1
        tiles = table["fwd"][i], table["dq"][i], table["dkv"][i]
    tiles = tuple(t if g is None else g for t, g in zip(tiles, (given.fwd, given.dq, given.dkv)))
    return tuple(dict(BM=bm, BN=bn, num_warps=w, num_stages=st) for bm, bn, w, st in tiles)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: still exercise the row split
    return torch.cuda.get_device_properties(device).multi_processor_count


def _is_interpret(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


def band_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, L: int, D: int, W: int,
                 window: bool, tiles: BandTiles = BAND) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Tq, HQ, K] and lse [B, Tq, HQ] (float32, natural log); tiles: launches a caller asks
    for (nsa.kernels.tuning.BandTiles)."""
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    G = HQ // H
    o = torch.empty_like(q)
    lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse
    if Tk == 0:
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    fwd, _, _ = _configs(K, _is_interpret(q), window, fp32_small_tiles(q.dtype, K), tiles)
    launch(_band_fwd_kernel, lambda c: (triton.cdiv(Tq * G, c["BM"]), B * H),
           (q, k, v, o, lse, Tq, Tk, q_start, 1.0 / math.sqrt(K)),
           dict(H=H, G=G, K=K, L=L, D=D, W=W, WINDOW=window, BK=max(16, triton.next_power_of_2(K)),
                DOT=dot_precision(q.dtype), WIDE=wide_offsets(Tk * H * K)), fwd, halve=("BM", "BN"))
    return o, lse


def _dkv_splits(key_tiles: int, row_blocks: int, device: torch.device, window: bool, deterministic: bool,
                waves: int) -> int:
    """How many programs share the query rows of one key tile in the dk/dv pass. Compressed
    keys are few (S/d), so their key tiles alone would leave SMs idle: the rows are split and
    the partial dk/dv added with float32 atomics, whose order varies from run to run. A window
    has S keys (enough tiles), and a deterministic run takes the fixed order of one program per
    key tile (slower where the split paid: the compressed branch at long S). waves: the
    programs per SM the split aims at (BandTiles.dkv_waves): about half of them hold rows of
    their key tile (the band is a triangle), and many small programs even out the SMs' shares."""
    if window or deterministic:
        return 1
    return min(64, triton.cdiv(waves * _sm_count(device), key_tiles), row_blocks)


def band_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, q_start: int, L: int, D: int, W: int, window: bool, deterministic: bool,
                  delta: torch.Tensor | None = None, tiles: BandTiles = BAND,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv; delta = rowsum(do * o) ([B, Tq, HQ] float32) when the caller has it (o is
    then not read; nsa.kernels.gated_branches passes lse and delta that fold in a gate); tiles:
    launches a caller asks for."""
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    G = HQ // H
    do = do.contiguous()
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if Tq == 0 or Tk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta_given = delta is not None
    if not delta_given:
        delta = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    _, dq_cfg, dkv_cfg = _configs(K, _is_interpret(q), window, fp32_small_tiles(q.dtype, K), tiles)
    meta = dict(H=H, G=G, K=K, L=L, D=D, W=W, WINDOW=window, BK=max(16, triton.next_power_of_2(K)),
                DOT=dot_precision(q.dtype))
    sm = 1.0 / math.sqrt(K)
    launch(_band_bwd_dq_kernel, lambda c: (triton.cdiv(Tq * G, c["BM"]), B * H),
           (q, k, v, o, do, lse, delta, dq, Tq, Tk, q_start, sm),
           dict(meta, DELTA_GIVEN=delta_given, WIDE=wide_offsets(Tk * H * K)), dq_cfg, halve=("BM", "BN"))
    # the split and the key tiles stay those of the preferred launch, whatever the fallback (the
    # kernel spreads the rows over its splits in blocks of its own BM)
    key_tiles = triton.cdiv(Tk, dkv_cfg["BN"]) * B * H
    n_split = _dkv_splits(key_tiles, triton.cdiv(Tq * G, dkv_cfg["BM"]), q.device, window, deterministic,
                          tiles.dkv_waves)
    atomic = n_split > 1
    # float32 partial sums when atomic, one buffer for both (one fill)
    dk_, dv_ = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0) if atomic else (dk, dv)
    bn = dkv_cfg["BN"]
    launch(_band_bwd_dkv_kernel, lambda c: (triton.cdiv(Tk, bn), n_split, B * H),
           (q, k, v, do, lse, delta, dk_, dv_, Tq, Tk, q_start, sm), dict(meta, BN=bn, ATOMIC=atomic),
           {k_: v_ for k_, v_ in dkv_cfg.items() if k_ != "BN"}, halve=("BM",))
    if atomic:  # separate tensors: a custom op's outputs may not share storage
        dk, dv = dk_.to(k.dtype, copy=True), dv_.to(v.dtype, copy=True)
    return dq, dk, dv


def _band_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, L: int, D: int, W: int,
              window: bool, deterministic: bool, tiles: str) -> tuple[torch.Tensor, torch.Tensor]:
    """nsa::band_fwd (see band_forward; tiles: a BandTiles.as_arg())."""
    return band_forward(q, k, v, q_start, L, D, W, window, BandTiles.from_arg(tiles))


def _band_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, q_start: int, L: int, D: int, W: int,
              window: bool, deterministic: bool, tiles: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nsa::band_bwd (see band_backward)."""
    return band_backward(q, k, v, o, lse, do, q_start, L, D, W, window, deterministic,
                         tiles=BandTiles.from_arg(tiles))


def _band_fake(q, k, v, *args):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


#: the custom ops nsa::band_fwd / nsa::band_bwd (see nsa.kernels._autograd)
band_op = kernel_op("band", _band_fwd, _band_bwd, _band_fake, tensors=3, grads=3)


def band_attention(q, k, v, q_start: int, L: int, D: int, W: int, window: bool, deterministic: bool = False,
                   tiles: BandTiles = BAND):
    """Band attention (see the module docstring). q [B, Tq, HQ, K]; k, v [B, Tk, H, K].
    Returns o [B, Tq, HQ, K] (q's dtype) and lse [B, Tq, HQ] (float32, natural log).
    deterministic: the backward adds no partial sums atomically (see _dkv_splits), so it gives
    the same bits on every run. tiles: launches other than the measured ones (sweeps, tests).
    Under torch.compile the kernels run as the custom ops nsa::band_fwd / nsa::band_bwd
    (see nsa.kernels._autograd)."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of KV heads {k.shape[2]}")
    return band_op(q.contiguous(), k.contiguous(), v.contiguous(), int(q_start), int(L), int(D), int(W),
                   bool(window), bool(deterministic), tiles.as_arg())
