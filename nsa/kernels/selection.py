"""Triton selected-block attention, group-centric: one program owns a tile of TT consecutive
query tokens and all G query heads of one KV group (rows = TT * next_pow2(G), at least 16 for
the tensor cores), and streams the union of the tokens' selected blocks of l' keys (listed per
tile by a small kernel before the launch, see _tile_union), each block loaded once. A row
counts a block only if its own token selected it, causally inside the block holding the
token. TT = 1 (one token per program) unless the context is short, where neighbouring tokens
select nearly the same blocks (see _tokens_per_tile). Any G works. At one token a program
the K/V blocks come in through TMA descriptors where the GPU has them (see _tma), by pointer
gathers otherwise.

Backward:
* dk/dv: key-block-centric, from the inverse of the selection (for each (b, h, block), the
  tokens that chose it, built with one stable sort, no host sync). Each work item takes up to
  QC of those tokens, loads the block's keys once, streams the tokens' G query rows and adds
  its partial dk/dv into float32 buffers atomically (a popular block, such as block 0, is
  split over several items so no program serialises the whole sequence);
* dq, at one token a program (long contexts): the forward and a recomputing dq kernel, which
  gather K and V (32 KB a block at K=128), are bound by the bytes they pull from L2. Instead the dk/dv pass keeps, per (token, block), either
  its dq partial dS @ K (G x K values; the block's keys are in its registers already) and a
  second kernel sums a token's partials in slot order, gathering nothing; or its dS tile
  (G x l' values) and a second kernel sums dS @ K over the token's blocks, gathering K alone
  (see _dq_source for which). What is kept past SelectionTuning.kept_budget bytes or kept_tokens
  tokens is kept a chunk of query tokens at a time. Otherwise (short contexts,
  several tokens a program) a dq kernel on the forward's grid and tiles recomputes the
  probabilities from the saved log-sum-exp (and writes delta = rowsum(do * o) for the dk/dv
  pass, which then runs second).

Shapes: q, o [B, Tq, HQ, K]; k, v [B, Tk, H, K]; idx [B, Tq, H, n] (ascending, -1 padded);
lse [B, Tq, HQ] (float32, natural log, saved for the backward); G = HQ // H. Query rows are at
absolute positions q_start .. q_start + Tq - 1.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import SEL_FORMS
from ._autograd import kernel_op
from ._inverse import (Inverse, as_outputs, fake_outputs, from_outputs, inverse_selection, item_block,
                       item_rows)
from ._launch import dot_precision, fp32_small_tiles, launch, wide_offsets
from .selection_blocks import blocks_forward, one_pass
from ._tma import kv_desc, kv_tma_ok
from ._softmax import LOG2E, dq_rows, finish, lse_log2, online_step, score_grad
from .tuning import SELECTION, SelectionTuning


@triton.jit
def _tile_union_kernel(idx, blocks, Tq, H: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
                       TT: tl.constexpr, NU: tl.constexpr):
    """One tile's block list: the TT * n candidates, each block kept at its first occurrence
    (pairwise test), sorted descending so the -1s go last; the first NU are stored."""
    tile = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    c = tl.arange(0, TT * NP)
    tok = tile * TT + c // NP
    slot = c % NP
    cand = tl.load(idx + ((b.to(tl.int64) * Tq + tok) * H + h) * N + slot, mask=(tok < Tq) & (slot < N), other=-1)
    seen = tl.sum(((cand[:, None] == cand[None, :]) & (c[None, :] < c[:, None])).to(tl.int32), 1) > 0
    u = tl.sort(tl.where(seen, -1, cand), descending=True)
    tl.store(blocks + ((b.to(tl.int64) * tl.cdiv(Tq, TT) + tile) * H + h) * NU + c, u, mask=c < NU)


@triton.jit
def _tile_rows(tile, b, h, Tq, q_start, H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
               TT: tl.constexpr, ROWS: tl.constexpr):
    """The query rows of one program: row r is head slot r % GP (G of them real) of token
    tile * TT + r // GP; rows past TT tokens (when TT * GP < 16) or past Tq are masked."""
    r = tl.arange(0, ROWS)
    tt = r // GP
    g = r % GP
    tok = tile * TT + tt
    rmask = (g < G) & (tt < TT) & (tok < Tq)
    row = (b.to(tl.int64) * Tq + tok) * (H * G) + h * G + g
    return tok, q_start + tok, row, rmask


@triton.jit
def _tile_blocks(idx, blocks, tile, b, h, tok, rmask, Tq, H: tl.constexpr, N: tl.constexpr,
                 NP: tl.constexpr, TT: tl.constexpr, NU: tl.constexpr, NUP: tl.constexpr):
    """The tile's block list (its row of `blocks`), its length, and, for TT > 1, each row's
    own selection [ROWS, NP] (-1 padded) for the membership test."""
    ubase = blocks + ((b.to(tl.int64) * tl.cdiv(Tq, TT) + tile) * H + h) * NU
    ulist = tl.load(ubase + tl.arange(0, NUP), mask=tl.arange(0, NUP) < NU, other=-1)
    n_valid = tl.sum((ulist >= 0).to(tl.int32), 0)
    if TT > 1:
        offn = tl.arange(0, NP)
        mine = tl.load(idx + ((b.to(tl.int64) * Tq + tok) * H + h)[:, None] * N + offn[None, :],
                       mask=rmask[:, None] & (offn[None, :] < N), other=-1)
    else:  # the tile's list is the token's own selection
        mine = n_valid
    return ubase, n_valid, mine


@triton.jit
def _block_vis(j, offs, pos, pos_last, mine, Tk, LS: tl.constexpr, TT: tl.constexpr):
    """Block j's key positions, which of them to load (up to the tile's last query), and the
    [ROWS, BS] visibility: causal for the row and, for TT > 1, selected by the row's token."""
    kpos = j * LS + offs
    kload = (offs < LS) & (kpos < Tk) & (kpos <= pos_last)
    vis = kload[None, :] & (kpos[None, :] <= pos[:, None])
    if TT > 1:
        vis = vis & (tl.sum((mine == j).to(tl.int32), 1) > 0)[:, None]
    return kpos, kload, vis


@triton.jit
def _sel_tile(idx, blocks, Tq, Tk, q_start, H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
              K: tl.constexpr, BK: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, TT: tl.constexpr,
              ROWS: tl.constexpr, NU: tl.constexpr, NUP: tl.constexpr):
    """What the forward and the dq kernel share: the program's rows (grid: token tiles, B * H)
    with their positions and mask, the offsets of their [ROWS, BK] tile of q/o/do/dq and its
    mask, the last position of the tile, the head-dim lanes, the batch and KV head, and the
    tile's block list (see _tile_blocks)."""
    tile = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    tok, pos, row, rmask = _tile_rows(tile, b, h, Tq, q_start, H, G, GP, TT, ROWS)
    pos_last = q_start + tl.minimum(tile * TT + TT, Tq) - 1
    offk = tl.arange(0, BK)
    kmask = offk < K
    ubase, n_valid, mine = _tile_blocks(idx, blocks, tile, b, h, tok, rmask, Tq, H, N, NP, TT, NU, NUP)
    return (pos, row, rmask, row[:, None] * K + offk[None, :], rmask[:, None] & kmask[None, :], pos_last,
            offk, kmask, b, h, ubase, n_valid, mine)


@triton.jit
def _load_block(t, b, h, j, offs, offk, kload, kmask, Tk, H: tl.constexpr, K: tl.constexpr,
                LS: tl.constexpr, TMA: tl.constexpr):
    """Block j of t [B, Tk, H, K] (keys or values) for batch b and KV head h, [BS, BK]. TMA: t
    is a descriptor over t viewed [B * Tk, H * K] with a box of [l', K] (see kv_desc), so keys
    past the tile's last query or past Tk (the next batch's, or zeros) come in unmasked: the
    callers' visibility masks them. Else the keys not in kload and the lanes past K are zeros."""
    if TMA:
        tile = t.load([(b * Tk + j * LS).to(tl.int32), (h * K).to(tl.int32)])
    else:
        ptr = (b.to(tl.int64) * Tk * H + h) * K + (j * LS + offs).to(tl.int64)[:, None] * (H * K) + offk[None, :]
        tile = tl.load(t + ptr, mask=kload[:, None] & kmask[None, :], other=0.0)
    return tile


@triton.jit
def _block_kv(k, v, ubase, i, offs, offk, kmask, b, h, pos, pos_last, mine, Tk,
              H: tl.constexpr, K: tl.constexpr, LS: tl.constexpr, TT: tl.constexpr, TMA: tl.constexpr):
    """The i-th block of the tile's list: its keys and values [BS, BK] and the rows'
    visibility [ROWS, BS] (see _block_vis)."""
    j = tl.load(ubase + i)
    kpos, kload, vis = _block_vis(j, offs, pos, pos_last, mine, Tk, LS, TT)
    kt = _load_block(k, b, h, j, offs, offk, kload, kmask, Tk, H, K, LS, TMA)
    vt = _load_block(v, b, h, j, offs, offk, kload, kmask, Tk, H, K, LS, TMA)
    return kt, vt, vis


@triton.jit
def _sel_fwd_kernel(
    q, k, v, idx, blocks, o, lse, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
    TT: tl.constexpr, ROWS: tl.constexpr, NU: tl.constexpr, NUP: tl.constexpr, TMA: tl.constexpr,
    DOT: tl.constexpr,
):
    pos, row, rmask, q_off, m2, pos_last, offk, kmask, b, h, ubase, n_valid, mine = _sel_tile(
        idx, blocks, Tq, Tk, q_start, H, G, GP, K, BK, N, NP, TT, ROWS, NU, NUP)
    qt = tl.load(q + q_off, mask=m2, other=0.0)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BK], tl.float32)
    offs = tl.arange(0, BS)
    for i in range(0, n_valid):
        kt, vt, vis = _block_kv(k, v, ubase, i, offs, offk, kmask, b, h, pos, pos_last, mine, Tk, H, K, LS, TT, TMA)
        s = tl.where(vis, tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale, float("-inf"))
        acc, m_i, l_i = online_step(acc, m_i, l_i, s, vt, True, DOT)
    out, lse_row = finish(acc, m_i, l_i)
    tl.store(o + q_off, out.to(o.dtype.element_ty), mask=m2)
    tl.store(lse + row, lse_row, mask=rmask)


@triton.jit
def _sel_bwd_dq_kernel(
    q, k, v, idx, blocks, o, do, lse, delta, dq, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
    TT: tl.constexpr, ROWS: tl.constexpr, NU: tl.constexpr, NUP: tl.constexpr, TMA: tl.constexpr,
    DELTA_GIVEN: tl.constexpr, DOT: tl.constexpr,
):
    pos, row, rmask, q_off, m2, pos_last, offk, kmask, b, h, ubase, n_valid, mine = _sel_tile(
        idx, blocks, Tq, Tk, q_start, H, G, GP, K, BK, N, NP, TT, ROWS, NU, NUP)
    qt = tl.load(q + q_off, mask=m2, other=0.0)
    dot_, dl, lse2 = dq_rows(do, o, lse, delta, q_off, m2, row, rmask, DELTA_GIVEN)
    qk_scale = sm_scale * LOG2E
    acc = tl.zeros([ROWS, BK], tl.float32)
    offs = tl.arange(0, BS)
    for i in range(0, n_valid):
        kt, vt, vis = _block_kv(k, v, ubase, i, offs, offk, kmask, b, h, pos, pos_last, mine, Tk, H, K, LS, TT, TMA)
        s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale
        p = tl.where(vis & rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
        ds = score_grad(p, dot_, vt, dl, DOT)
        acc += tl.dot(ds.to(kt.dtype), kt, input_precision=DOT)
    tl.store(dq + q_off, (acc * sm_scale).to(dq.dtype.element_ty), mask=m2)


@triton.jit
def _sel_dq_from_ds_kernel(
    k, idx, ds, dq_in, dq, Tq, Tk, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, ROWS: tl.constexpr,
    ACC: tl.constexpr, DOT: tl.constexpr,
):
    """dq of one token's G heads (TT = 1 grid) from the dS tiles the dk/dv pass kept: the sum
    over its selected blocks of dS @ K, so only K is gathered (not K, V, and the recomputation);
    ACC: plus dq_in (another branch's dq, added here instead of by a pass of its own). It
    gathers by pointers: TMA descriptors bought nothing measurable here."""
    pos, row, rmask, q_off, m2, pos_last, offk, kmask, b, h, ubase, n_valid, mine = _sel_tile(
        idx, idx, Tq, Tk, 0, H, G, GP, K, BK, N, NP, 1, ROWS, N, NP)
    g = tl.arange(0, ROWS) % GP
    e0 = (b.to(tl.int64) * Tq + tl.program_id(0)) * (H * N) + h * N  # the token's first idx entry
    offs = tl.arange(0, BS)
    acc = tl.zeros([ROWS, BK], tl.float32)
    for i in range(0, n_valid):
        j = tl.load(ubase + i)
        kt = _load_block(k, b, h, j, offs, offk, (offs < LS) & (j * LS + offs < Tk), kmask, Tk, H, K, LS, False)
        dst = tl.load(ds + ((e0 + i) * G + g)[:, None] * LS + offs[None, :],
                      mask=rmask[:, None] & (offs < LS)[None, :], other=0.0)
        acc += tl.dot(dst, kt, input_precision=DOT)
    acc = acc * sm_scale
    if ACC:
        acc += tl.load(dq_in + q_off, mask=m2, other=0.0).to(tl.float32)
    tl.store(dq + q_off, acc.to(dq.dtype.element_ty), mask=m2)


@triton.jit
def _sel_dq_from_parts_kernel(idx, parts, dq_in, dq, n_rows, sm_scale, H: tl.constexpr, G: tl.constexpr,
                              K: tl.constexpr, BK: tl.constexpr, N: tl.constexpr, BR: tl.constexpr,
                              ACC: tl.constexpr):
    """dq of BR rows (b, token, head) from the dq partials the dk/dv pass kept: sm_scale times
    their sum over the row's valid slots, in slot order, in float32; ACC: plus dq_in's row."""
    HQ: tl.constexpr = H * G
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = r < n_rows
    hq = r % HQ
    e0 = ((r // HQ).to(tl.int64) * H + hq // G) * N  # the row's first idx entry
    offk = tl.arange(0, BK)
    m2 = rm[:, None] & (offk < K)[None, :]
    acc = tl.zeros([BR, BK], tl.float32)
    for i in range(0, N):
        valid = rm & (tl.load(idx + e0 + i, mask=rm, other=-1) >= 0)
        part = (e0 + i) * G + hq % G
        acc += tl.load(parts + part[:, None] * K + offk[None, :], mask=valid[:, None] & m2, other=0.0).to(tl.float32)
    acc = acc * sm_scale
    off = r.to(tl.int64)[:, None] * K + offk[None, :]
    if ACC:
        acc += tl.load(dq_in + off, mask=m2, other=0.0).to(tl.float32)
    tl.store(dq + off, acc.to(dq.dtype.element_ty), mask=m2)


@triton.jit
def _sel_bwd_dkv_kernel(
    q, k, v, do, lse, delta, tokens, perm, item_seg, item_start, item_end, dk, dv, kept,
    Tq, Tk, NB, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, ROWS: tl.constexpr, KEEP: tl.constexpr, DOT: tl.constexpr,
    WIDE: tl.constexpr,
):
    """One work item of the dk/dv pass (see the module docstring), key-major: scores as
    S^T = K Q^T [BS, ROWS], so that P^T and dS^T come out of one tensor-core product in the
    layout the next takes as its register operand (dV += P^T dO, dK += dS^T Q) rather than
    transposed through shared memory (faster than S = Q K^T at its best tiles; the rows a step
    and warps are SelectionTuning's dkv_cells / dkv_warps, bench/bench_nsa.py --sweep). The
    ROWS rows of a step are the items' (token, head) pairs in order, G a token (as in
    selection_blocks' forward): no padding of a group to a power of two, which at G = 6 would
    leave a quarter of every product idle."""
    w = tl.program_id(0)
    s0 = tl.load(item_start + w)
    s1 = tl.load(item_end + w)
    if s0 < s1:
        b, h, offs, kpos, kval, offk, kmask, kv_base, kt, vt = item_block(
            k, v, tl.load(item_seg + w), Tk, NB, H, K, BK, LS, BS)
        HQ: tl.constexpr = H * G
        qk_scale = sm_scale * LOG2E
        # the rows' q and dO: int32 offsets from the batch's base unless WIDE
        # (nsa.kernels._launch.wide_offsets)
        if WIDE:
            q_b = q
            do_b = do
        else:
            q_b = q + b.to(tl.int64) * Tq * HQ * K
            do_b = do + b.to(tl.int64) * Tq * HQ * K
        dk_acc = tl.zeros([BS, BK], tl.float32)
        dv_acc = tl.zeros([BS, BK], tl.float32)
        for r0 in range(s0 * G, s1 * G, ROWS):
            tmask, u, g, t = item_rows(tokens, r0, s1, G, ROWS)
            pos = q_start + t
            row = (b.to(tl.int64) * Tq + t) * HQ + h * G + g
            m2 = tmask[:, None] & kmask[None, :]
            if WIDE:
                ptrs = row[:, None] * K + offk[None, :]
            else:
                ptrs = (t * HQ + h * G + g)[:, None] * K + offk[None, :]
            qt = tl.load(q_b + ptrs, mask=m2, other=0.0)
            dot_ = tl.load(do_b + ptrs, mask=m2, other=0.0)
            lse2 = lse_log2(tl.load(lse + row, mask=tmask, other=0.0))
            dl = tl.load(delta + row, mask=tmask, other=0.0)
            vis = tmask[None, :] & kval[:, None] & (kpos[:, None] <= pos[None, :])
            st = tl.dot(kt, tl.trans(qt), input_precision=DOT) * qk_scale
            pt = tl.where(vis, tl.exp2(st - lse2[None, :]), 0.0)
            dv_acc += tl.dot(pt.to(dot_.dtype), dot_, input_precision=DOT)
            dst = pt * (tl.dot(vt, tl.trans(dot_), input_precision=DOT) - dl[None, :])
            dk_acc += tl.dot(dst.to(qt.dtype), qt, input_precision=DOT)
            # kept for the dq pass (KEEP, see _dq_source), at the idx entry (token, slot) the key came from
            if KEEP == "ds":  # the dS tile [G, l']
                e = tl.load(perm + u, mask=tmask, other=0)
                tl.store(kept + (e * G + g)[None, :] * LS + offs[:, None], dst.to(kept.dtype.element_ty),
                         mask=tmask[None, :] & (offs < LS)[:, None])
            if KEEP == "dq":  # the dq partial dS @ K [G, K], unscaled
                e = tl.load(perm + u, mask=tmask, other=0)
                dqp = tl.dot(tl.trans(dst.to(kt.dtype)), kt, input_precision=DOT)
                tl.store(kept + (e * G + g)[:, None] * K + offk[None, :], dqp.to(kept.dtype.element_ty), mask=m2)
        kv_off = offs[:, None] * (H * K) + offk[None, :]
        kvm = kval[:, None] & kmask[None, :]
        tl.atomic_add(dk + kv_base + kv_off, dk_acc * sm_scale, mask=kvm)
        tl.atomic_add(dv + kv_base + kv_off, dv_acc, mask=kvm)


def _meta(q, k, sel_block: int):
    B, Tq, HQ, K = q.shape
    H = k.shape[2]
    return dict(
        H=H, G=HQ // H, K=K, BK=max(16, triton.next_power_of_2(K)),
        LS=sel_block, BS=max(16, triton.next_power_of_2(sel_block)),
    )


def _tokens_per_tile(G: int, n: int, NB: int, Tq: int, tune: SelectionTuning = SELECTION) -> int:
    """TT, the consecutive query tokens one forward/dq program owns (a power of 2).

    A tile loads each block of the union of its tokens' selections once, so it pays off when
    neighbouring tokens select nearly the same blocks: short contexts, NB = ceil(Tk / l') at
    most tune.tt_nb * n (at S=2048, l'=64, n=16 every token below 1024 selects all its
    causal blocks). There TT = tune.tt_rows // next_pow2(G), at most tune.tt_max (the
    block-list kernel compares the TT * n candidates pairwise), so small groups also fill the
    16-row minimum of tl.dot with real rows. At longer contexts the union of TT random
    selections nears TT * n blocks, each costing TT times the rows: TT = 1, one token per
    program. tune.tt > 0 forces TT (rounded up to a power of 2), for sweeps and tests."""
    tt = tune.tt
    if tt <= 0:
        tt = tune.tt_rows // triton.next_power_of_2(G) if NB <= tune.tt_nb * n else 1
        tt = max(1, min(tt, tune.tt_max))
    return min(triton.next_power_of_2(tt), triton.next_power_of_2(max(Tq, 1)))


def _tile_union(idx, TT: int, NB: int):
    """The blocks of each tile of TT consecutive tokens, [B, ceil(Tq/TT), H, NU] with
    NU = min(TT * n, NB): the union of the tokens' selections, each block once, descending,
    -1 padded; one small kernel (no host sync). TT = 1: idx itself."""
    if TT == 1:
        return idx
    B, Tq, H, n = idx.shape
    NU = max(1, min(TT * n, NB))
    blocks = torch.empty(B, triton.cdiv(Tq, TT), H, NU, device=idx.device, dtype=idx.dtype)
    _tile_union_kernel[(blocks.shape[1], B * H)](idx, blocks, Tq, H=H, N=n, NP=triton.next_power_of_2(n),
                                                 TT=TT, NU=NU, num_warps=4)
    return blocks


def _tma(k: torch.Tensor, v: torch.Tensor, sel_block: int, TT: int, tune: SelectionTuning = SELECTION) -> bool:
    """Whether the forward and dq kernels load K/V blocks through TMA descriptors (see
    nsa.kernels._tma) rather than pointer gathers: tune.tma, at one token a tile (where the
    descriptors shorten the forward; at several tokens a tile they do not at every shape),
    where k and v take boxes of l' keys."""
    return tune.tma and TT == 1 and kv_tma_ok(k, sel_block) and kv_tma_ok(v, sel_block)


def _tile_launch(q, k, v, idx, sel_block: int, tune: SelectionTuning):
    """Grid, block lists, the K/V operands (descriptors or tensors, see _tma), constexprs and the
    preferred launch (warps, stages) shared by the forward and the dq kernel."""
    meta, n = _meta(q, k, sel_block), idx.shape[-1]
    B, Tq = q.shape[:2]
    NB = triton.cdiv(k.shape[1], sel_block)
    TT = _tokens_per_tile(meta["G"], n, NB, Tq, tune)
    blocks = _tile_union(idx, TT, NB)
    GP = triton.next_power_of_2(meta["G"])
    NU = blocks.shape[-1]
    tma = _tma(k, v, sel_block, TT, tune)
    meta.update(GP=GP, TT=TT, ROWS=max(16, TT * GP), N=n, NP=triton.next_power_of_2(n),
                NU=NU, NUP=triton.next_power_of_2(NU), TMA=tma)
    kv = (kv_desc(k, sel_block), kv_desc(v, sel_block)) if tma else (k, v)
    interpret = q.device.type == "cpu"
    meta["DOT"] = dot_precision(q.dtype)
    # float32 tiles of 64 rows or more stay at the tuned warps: Triton 3.6 compiles this module's
    # forward at 8 warps, 64 rows and head dim 48 or 64 in float32 for sm_90 into a kernel that reads
    # past its shared memory (an illegal memory access on an H100; `python bench/layer_variants.py`)
    eight_warps = fp32_small_tiles(q.dtype, meta["K"]) and meta["ROWS"] < 64
    cfg = dict(num_warps=4 if interpret else 8 if eight_warps else tune.fwd_warps,
               num_stages=1 if interpret else tune.tma_stages if tma else tune.fwd_stages)
    return (triton.cdiv(Tq, TT), B * meta["H"]), blocks, kv, meta, cfg


def forward_form(G: int, TT: int) -> str:
    """The selected forward for a query group of G heads and TT tokens a token tile
    (_tokens_per_tile): 'blocks', key-block-major (nsa.kernels.selection_blocks), or 'tiles',
    token-major (this module's forward kernel). Key-block-major at one token a tile (long
    contexts) and groups of up to 8 heads, where it is the faster of the two
    (`python bench/bench_nsa.py --ops sel --sel-forms tiles blocks` compares them). Short
    contexts tile several tokens a program over the union of their blocks instead."""
    return "blocks" if TT == 1 and G <= 8 else "tiles"


def _resolve_form(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor, sel_block: int, form: str,
                  tune: SelectionTuning = SELECTION) -> str:
    """The selected forward ``form`` (one of nsa.kernels.SEL_FORMS) with 'auto' resolved by
    forward_form for the shape."""
    if form not in SEL_FORMS:
        raise ValueError(f"selected forward form {form!r}; forms: {', '.join(SEL_FORMS)}")
    if form != "auto":
        return form
    Tq, G, n = q.shape[1], q.shape[2] // k.shape[2], idx.shape[-1]
    return forward_form(G, _tokens_per_tile(G, n, triton.cdiv(k.shape[1], sel_block), Tq, tune))


def _shared_qc(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor, sel_block: int, deterministic: bool,
               form: str, tune: SelectionTuning) -> int:
    """Tokens per work item of the inverse selection the forward hands to the backward, 0 for
    none: where the forward runs key-block-major over all tokens in one pass (one inverse
    selection, of the work items the dk/dv pass takes; not deterministic, whose dk/dv pass
    takes one item per block). The backward's dk/dv pass then sorts nothing."""
    if deterministic or q.shape[1] == 0 or _resolve_form(q, k, idx, sel_block, form, tune) != "blocks":
        return 0
    return _dkv_qc(q.device, q.shape[1], False, tune) if one_pass(q, idx.shape[-1], tune.partials_budget) else 0


def _sel_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, sel_block: int,
             q_start: int, deterministic: bool, form: str, tune: SelectionTuning = SELECTION,
             ) -> tuple[torch.Tensor, torch.Tensor, Inverse | None]:
    """o and lse of the selected branch by the forward ``form`` (see _resolve_form), and the inverse
    selection it built where the backward can take it again (see _shared_qc), else None."""
    B, Tq, HQ, K = q.shape
    Tk = k.shape[1]
    form = _resolve_form(q, k, idx, sel_block, form, tune)
    if form == "blocks" and Tq > 0:
        interpret = q.device.type == "cpu"
        tiles = dict(BM=32 if interpret else tune.blocks_rows, num_warps=4 if interpret else tune.fwd_warps,
                     num_stages=1 if interpret else tune.fwd_stages)
        o, lse, inverse = blocks_forward(q, k, v, idx, sel_block, q_start, tiles,
                                         _dkv_qc(q.device, Tq, False, tune), tune.partials_budget,
                                         (tune.combine_values, tune.combine_warps))
        return o, lse, None if deterministic else inverse
    o = torch.empty_like(q)
    lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse, None
    grid, blocks, kv, meta, cfg = _tile_launch(q, k, v, idx, sel_block, tune)
    launch(_sel_fwd_kernel, lambda c: grid, (q, *kv, idx, blocks, o, lse, Tq, Tk, q_start, 1.0 / math.sqrt(K)),
           meta, cfg)
    return o, lse, None


def _sel_bwd_dq(q, k, v, idx, o, lse, do, sel_block: int, q_start: int, tune: SelectionTuning, delta=None):
    """dq, and delta = rowsum(do * o) [B, Tq, HQ] float32 for the dk/dv pass (computed on the
    way unless given)."""
    B, Tq, HQ, K = q.shape
    dq = torch.empty_like(q)
    delta_given = delta is not None
    if not delta_given:
        delta = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    grid, blocks, kv, meta, cfg = _tile_launch(q, k, v, idx, sel_block, tune)
    launch(_sel_bwd_dq_kernel, lambda c: grid,
           (q, *kv, idx, blocks, o, do, lse, delta, dq, Tq, k.shape[1], q_start, 1.0 / math.sqrt(K)),
           dict(meta, DELTA_GIVEN=delta_given), cfg)
    return dq, delta


def _dkv_qc(device: torch.device, Tq: int, deterministic: bool, tune: SelectionTuning) -> int:
    """Most tokens per work item of the dk/dv pass. Deterministic: Tq, so each (b, h, block) is
    one work item and each dk/dv row has one writer; its atomic adds into the zeroed buffer then
    run in the fixed order of the sorted tokens (slower: the program of a block every token
    selects, such as block 0, walks the whole sequence)."""
    if deterministic:
        return max(Tq, 1)
    return tune.qc_interpret if device.type == "cpu" else tune.qc


def _dkv_pass(q, k, v, do, lse, delta, work, sel_block: int, q_start: int, dk, dv, tune: SelectionTuning,
              keep: str = "", kept=None):
    """Adds the dk, dv of the work items of inverse_selection(idx, Tk, sel_block, _dkv_qc(...))
    into the float32 buffers dk, dv; keep 'ds' / 'dq' (see _dq_source): it also keeps each
    (token, slot)'s dS tile / dq partial in kept (flat, B*Tq*H*n * G * _kept_width of q's dtype)."""
    tokens, perm, (seg, start, end), NB = work
    meta = _meta(q, k, sel_block)
    interpret = q.device.type == "cpu"
    # K <= 32 gets the 128 rows of K=64: more rows a step were never measured
    rows = 64 if interpret else min(tune.dkv_cells // meta["BK"], 128)
    warps = 8 if fp32_small_tiles(q.dtype, meta["K"]) else tune.dkv_warps
    cfg = dict(ROWS=rows, num_warps=4 if interpret else warps, num_stages=1 if interpret else tune.dkv_stages)
    launch(_sel_bwd_dkv_kernel, lambda c: (seg.numel(),),
           (q, k, v, do, lse, delta, tokens, perm, seg, start, end, dk, dv, q if kept is None else kept,
            q.shape[1], k.shape[1], NB, q_start, 1.0 / math.sqrt(q.shape[3])),
           dict(meta, KEEP=keep, DOT=dot_precision(q.dtype), WIDE=wide_offsets(q[0].numel())), cfg,
           halve=("ROWS",))


def _sel_bwd_dkv(q, k, v, do, lse, delta, work, sel_block: int, q_start: int, tune: SelectionTuning):
    """dk, dv (k's dtype) from the work items of _inverse_selection (see _dkv_pass)."""
    dk, dv = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0)  # one fill
    _dkv_pass(q, k, v, do, lse, delta, work, sel_block, q_start, dk, dv, tune)
    # separate tensors: a custom op's outputs may not share storage
    return dk.to(k.dtype, copy=True), dv.to(v.dtype, copy=True)


@triton.jit
def _row_delta_kernel(o, do, delta, n_rows, K: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    offk = tl.arange(0, BK)
    m = (r < n_rows)[:, None] & (offk < K)[None, :]
    off = r.to(tl.int64)[:, None] * K + offk[None, :]
    prod = tl.load(do + off, mask=m, other=0.0).to(tl.float32) * tl.load(o + off, mask=m, other=0.0).to(tl.float32)
    tl.store(delta + r, tl.sum(prod, 1), mask=r < n_rows)


def _row_delta(o, do):
    """delta = rowsum(do * o) [B, Tq, HQ] in float32 (what the dq kernel writes on its way)."""
    K = o.shape[-1]
    delta = torch.empty(o.shape[:-1], device=o.device, dtype=torch.float32)
    BR = 64
    _row_delta_kernel[(triton.cdiv(delta.numel(), BR),)](o, do, delta, delta.numel(), K=K,
                                                         BK=triton.next_power_of_2(K), BR=BR)
    return delta


def _sel_dq_from_ds(q, k, idx, ds, sel_block: int, tune: SelectionTuning, dq_add=None):
    """dq from the dS tiles _dkv_pass kept (one program per token and KV group), plus dq_add
    when given."""
    B, Tq, HQ, K = q.shape
    meta = _meta(q, k, sel_block)
    GP, n = triton.next_power_of_2(meta["G"]), idx.shape[-1]
    dq = torch.empty_like(q)
    interpret = q.device.type == "cpu"
    launch(_sel_dq_from_ds_kernel, lambda c: (Tq, B * meta["H"]),
           (k, idx, ds, dq if dq_add is None else dq_add, dq, Tq, k.shape[1], 1.0 / math.sqrt(K)),
           dict(meta, GP=GP, N=n, NP=triton.next_power_of_2(n), ROWS=max(16, GP), ACC=dq_add is not None,
                DOT=dot_precision(q.dtype)),
           dict(num_warps=4 if interpret else tune.fwd_warps, num_stages=1 if interpret else tune.fwd_stages))
    return dq


def _sel_dq_from_parts(q, idx, parts, dq_add=None):
    """dq from the dq partials _dkv_pass kept (rows of (token, head), no gather), plus dq_add
    when given."""
    B, Tq, HQ, K = q.shape
    H, n = idx.shape[2], idx.shape[3]
    dq = torch.empty_like(q)
    BK = max(16, triton.next_power_of_2(K))
    BR = max(1, 4096 // BK)
    _sel_dq_from_parts_kernel[(triton.cdiv(B * Tq * HQ, BR),)](
        idx, parts, dq if dq_add is None else dq_add, dq, B * Tq * HQ, 1.0 / math.sqrt(K),
        H=H, G=HQ // H, K=K, BK=BK, N=n, BR=BR, ACC=dq_add is not None)
    return dq


def _dq_from_pass(q, k, n: int, sel_block: int, tune: SelectionTuning = SELECTION) -> bool:
    """Whether dq comes from what the dk/dv pass keeps (see _sel_bwd_kept), n blocks selected:
    at one token a forward program (TT = 1, long contexts)."""
    HQ, H = q.shape[2], k.shape[2]
    NB = triton.cdiv(k.shape[1], sel_block)
    return tune.dq_from_pass and _tokens_per_tile(HQ // H, n, NB, q.shape[1], tune) == 1


def _dq_source(K: int, sel_block: int, tune: SelectionTuning = SELECTION) -> str:
    """What the dk/dv pass keeps for dq (tune.dq_keep, 'auto': this rule): 'dq', each (token,
    block)'s dq partial (G x K values; the dq kernel sums them, gathering nothing), where the head
    dim is at most the block (then no more bytes than the dS tiles); else 'ds', the dS tiles
    (G x l'; the dq kernel gathers each selected block's keys)."""
    if tune.dq_keep == "auto":
        return "dq" if K <= sel_block else "ds"
    return tune.dq_keep


def _kept_width(K: int, sel_block: int, keep: str) -> int:
    """Values the dk/dv pass keeps per (token, slot, head) for ``keep`` (_dq_source): K for dq
    partials, l' for dS tiles."""
    return K if keep == "dq" else sel_block


def _kept_chunk(q, n: int, sel_block: int, tune: SelectionTuning = SELECTION) -> int:
    """Query positions per pass of _sel_bwd_kept: as many as keep their dq partials or dS tiles
    (B * HQ * n * _kept_width values of q's dtype a position) within tune.kept_budget bytes, and
    at most tune.kept_tokens tokens of the batch (B a position), at least one."""
    B, _, HQ, K = q.shape
    width = _kept_width(K, sel_block, _dq_source(K, sel_block, tune))
    return max(1, min(tune.kept_tokens // B, tune.kept_budget // (B * HQ * n * width * q.element_size())))


def _sel_bwd_kept(q, k, v, idx, o, lse, do, sel_block: int, q_start: int, deterministic: bool,
                  tune: SelectionTuning, delta=None, dq_add=None, inverse: Inverse | None = None):
    """dq, dk, dv with dq from what the dk/dv pass keeps (_dq_source): per chunk of query tokens
    (_kept_chunk; one chunk unless they pass the budget), the dk/dv pass over the chunk's
    selections adds into float32 dk/dv (chunk after chunk, so a fixed order stays fixed) and
    keeps the chunk's dq partials or dS tiles, then the dq kernel takes them for its tokens (see
    selection_backward for delta, dq_add and inverse)."""
    Tq, Tk, K = q.shape[1], k.shape[1], q.shape[3]
    G, n = q.shape[2] // k.shape[2], idx.shape[-1]
    keep = _dq_source(K, sel_block, tune)
    if delta is None:
        delta = _row_delta(o, do)
    dk, dv = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0)  # one fill
    chunk = _kept_chunk(q, n, sel_block, tune)
    dqs = []
    for a in range(0, Tq, chunk):
        part = slice(a, min(Tq, a + chunk))  # .contiguous(): a copy only for B > 1 and several chunks
        qc, doc, lsec, dlc, idxc = (t[:, part].contiguous() for t in (q, do, lse, delta, idx))
        dq_addc = None if dq_add is None else dq_add[:, part].contiguous()
        work = inverse if inverse is not None and chunk >= Tq else \
            inverse_selection(idxc, Tk, sel_block, _dkv_qc(q.device, qc.shape[1], deterministic, tune))
        kept = torch.empty(idxc.numel() * G * _kept_width(K, sel_block, keep), device=q.device, dtype=q.dtype)
        _dkv_pass(qc, k, v, doc, lsec, dlc, work, sel_block, q_start + a, dk, dv, tune, keep, kept)
        dqs.append(_sel_dq_from_parts(qc, idxc, kept, dq_addc) if keep == "dq"
                   else _sel_dq_from_ds(qc, k, idxc, kept, sel_block, tune, dq_addc))
        del kept, work  # before the next chunk's, so that one chunk's are held at a time
    dq = dqs[0] if len(dqs) == 1 else torch.cat(dqs, 1)
    return dq, dk.to(k.dtype, copy=True), dv.to(v.dtype, copy=True)


def selection_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor, sel_block: int, q_start: int, deterministic: bool,
                       delta: torch.Tensor | None = None, dq_add: torch.Tensor | None = None,
                       inverse: Inverse | None = None, tune: SelectionTuning = SELECTION,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv. Long contexts: dq from the dq partials or dS tiles the dk/dv pass keeps
    (_sel_bwd_kept; gathers nothing or K alone, where the forward and a recomputing dq kernel
    gather K and V, 32 KB a selected block at K=128, and are bound by that gather). Otherwise the dq kernel (which also
    writes delta), then the dk/dv pass. Both are deterministic where the dk/dv pass is.

    delta = rowsum(do * o) ([B, Tq, HQ] float32) when the caller has it (o is then not read;
    nsa.kernels.gated_branches passes lse and delta that fold in a gate); dq_add given, the
    returned dq includes it (another branch's dq, added by the last dq kernel); inverse: idx's
    inverse selection from the forward (_shared_qc), which the dk/dv pass then takes instead of
    sorting again where it takes all tokens at once (any work item size gives the same sums; a
    deterministic backward is never handed one); tune: launch parameters and variants."""
    Tq, Tk = q.shape[1], k.shape[1]
    if Tq == 0 or Tk == 0:
        dq = torch.zeros_like(q) if dq_add is None else dq_add.clone()
        return dq, torch.zeros_like(k), torch.zeros_like(v)
    do = do.contiguous()
    if _dq_from_pass(q, k, idx.shape[-1], sel_block, tune):
        return _sel_bwd_kept(q, k, v, idx, o, lse, do, sel_block, q_start, deterministic, tune, delta, dq_add,
                             inverse)
    dq, delta = _sel_bwd_dq(q, k, v, idx, o, lse, do, sel_block, q_start, tune, delta)
    work = inverse if inverse is not None else \
        inverse_selection(idx, Tk, sel_block, _dkv_qc(q.device, Tq, deterministic, tune))
    dk, dv = _sel_bwd_dkv(q, k, v, do, lse, delta, work, sel_block, q_start, tune)
    if dq_add is not None:  # short contexts: the dq kernel tiles several tokens; one add
        dq += dq_add
    return dq, dk, dv


def _sel_op_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, sel_block: int,
                q_start: int, deterministic: bool, form: str, tuning: str,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """nsa::sel_fwd: o, lse and the inverse selection as tensors (see _inverse.as_outputs);
    tuning: a SelectionTuning.as_arg()."""
    o, lse, inverse = _sel_fwd(q, k, v, idx, sel_block, q_start, deterministic, form,
                               SelectionTuning.from_arg(tuning))
    return (o, lse, *as_outputs(inverse, q.device))


def _sel_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, o: torch.Tensor,
             lse: torch.Tensor, tokens: torch.Tensor, perm: torch.Tensor, items: torch.Tensor, do: torch.Tensor,
             sel_block: int, q_start: int, deterministic: bool, form: str,
             tuning: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nsa::sel_bwd (see selection_backward; one backward whatever the forward's form)."""
    return selection_backward(q, k, v, idx, o, lse, do, sel_block, q_start, deterministic,
                              inverse=from_outputs(tokens, perm, items, k.shape[1], sel_block),
                              tune=SelectionTuning.from_arg(tuning))


def fake_inverse(q, k, idx, sel_block: int, deterministic: bool, form: str, tune: SelectionTuning = SELECTION):
    """The inverse selection outputs of the forward, in shape and dtype only (for fake tensors)."""
    return fake_outputs(idx, k.shape[1], sel_block, _shared_qc(q, k, idx, sel_block, deterministic, form, tune))


def _sel_fake(q, k, v, idx, sel_block, q_start, deterministic, form, tuning):
    return (torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32),
            *fake_inverse(q, k, idx, sel_block, deterministic, form, SelectionTuning.from_arg(tuning)))


#: the custom ops nsa::sel_fwd / nsa::sel_bwd (see nsa.kernels._autograd); idx gets no gradient
sel_op = kernel_op("sel", _sel_op_fwd, _sel_bwd, _sel_fake, tensors=4, grads=3)


def selected_attention(q, k, v, idx, q_start: int, LS: int, deterministic: bool = False, form: str = "auto",
                       tuning: SelectionTuning = SELECTION):
    """Selected branch: q [B, Tq, HQ, K] at positions q_start.. attends, per KV group, to the
    tokens of the blocks of LS keys listed in idx [B, Tq, H, n] (ascending, -1 padded), causally
    inside the block holding the query; k, v [B, Tk, H, K]. Returns o [B, Tq, HQ, K].
    deterministic: the dk/dv pass sums in a fixed order (see _dkv_qc). form: the forward, one of
    nsa.kernels.SEL_FORMS ('auto': forward_form's choice for the shape). tuning: launch
    parameters and variants (nsa.kernels.tuning; the measured defaults unless a sweep or a test
    asks for others). Under torch.compile the kernels run as the custom ops nsa::sel_fwd /
    nsa::sel_bwd (see nsa.kernels._autograd)."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of KV heads {k.shape[2]}")
    q, k, v, idx = (t.contiguous() for t in (q, k, v, idx))
    return sel_op(q, k, v, idx, int(LS), int(q_start), bool(deterministic), str(form), tuning.as_arg())[0]
