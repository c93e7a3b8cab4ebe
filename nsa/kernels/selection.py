"""Triton selected-block attention, group-centric: one program owns one query token and all G
query heads of one KV group (rows padded to GP >= 16 for the tensor cores), and streams the
group's selected blocks of l' keys, causal inside the block holding the token. Any G works.

Backward:
* dq: the same grid; recomputes probabilities from the saved log-sum-exp and also writes
  delta = rowsum(do * o) for the dk/dv pass;
* dk/dv: key-block-centric, from the inverse of the selection (for each (b, h, block), the
  tokens that chose it, built with one stable sort, no host sync). Each work item takes up to
  QC of those tokens, loads the block's keys once, streams the tokens' G query rows and adds
  its partial dk/dv into float32 buffers atomically (a popular block, such as block 0, is
  split over several items so no program serialises the whole sequence).

Shapes: q, o [B, Tq, HQ, K]; k, v [B, Tk, H, K]; idx [B, Tq, H, n] (ascending, -1 padded);
G = HQ // H. Query rows are at absolute positions q_start .. q_start + Tq - 1.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nsa.attention.config import NSAConfig


@triton.jit
def _sel_fwd_kernel(
    q, k, v, idx, o, lse2_out, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
):
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    pos = q_start + t
    g = tl.arange(0, GP)
    gmask = g < G
    offk = tl.arange(0, BK)
    kmask = offk < K
    row_base = (b.to(tl.int64) * Tq + t) * HQ + h * G
    m2 = gmask[:, None] & kmask[None, :]
    qt = tl.load(q + (row_base + g)[:, None] * K + offk[None, :], mask=m2, other=0.0)
    ibase = idx + ((b.to(tl.int64) * Tq + t) * H + h) * N
    sel = tl.load(ibase + tl.arange(0, NP), mask=tl.arange(0, NP) < N, other=-1)
    n_valid = tl.sum((sel >= 0).to(tl.int32), 0)
    kv_base = (b.to(tl.int64) * Tk * H + h) * K
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BK], tl.float32)
    offs = tl.arange(0, BS)
    for i in range(0, n_valid):
        j = tl.load(ibase + i)
        kpos = j * LS + offs
        kvis = (offs < LS) & (kpos <= pos) & (kpos < Tk)
        ptr = kv_base + kpos.to(tl.int64)[:, None] * (H * K) + offk[None, :]
        kt = tl.load(k + ptr, mask=kvis[:, None] & kmask[None, :], other=0.0)
        vt = tl.load(v + ptr, mask=kvis[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        s = tl.where(kvis[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(o + (row_base + g)[:, None] * K + offk[None, :], out.to(o.dtype.element_ty), mask=m2)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), 0.0)
    tl.store(lse2_out + row_base + g, lse2, mask=gmask)


@triton.jit
def _sel_bwd_dq_kernel(
    q, k, v, idx, o, do, lse2_in, delta, dq, Tq, Tk, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
):
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    pos = q_start + t
    g = tl.arange(0, GP)
    gmask = g < G
    offk = tl.arange(0, BK)
    kmask = offk < K
    row_base = (b.to(tl.int64) * Tq + t) * HQ + h * G
    m2 = gmask[:, None] & kmask[None, :]
    ptrs = (row_base + g)[:, None] * K + offk[None, :]
    qt = tl.load(q + ptrs, mask=m2, other=0.0)
    dot_ = tl.load(do + ptrs, mask=m2, other=0.0)
    ot = tl.load(o + ptrs, mask=m2, other=0.0)
    dl = tl.sum(dot_.to(tl.float32) * ot.to(tl.float32), 1)
    tl.store(delta + row_base + g, dl, mask=gmask)
    lse2 = tl.load(lse2_in + row_base + g, mask=gmask, other=0.0)
    ibase = idx + ((b.to(tl.int64) * Tq + t) * H + h) * N
    sel = tl.load(ibase + tl.arange(0, NP), mask=tl.arange(0, NP) < N, other=-1)
    n_valid = tl.sum((sel >= 0).to(tl.int32), 0)
    kv_base = (b.to(tl.int64) * Tk * H + h) * K
    qk_scale = sm_scale * 1.4426950408889634
    acc = tl.zeros([GP, BK], tl.float32)
    offs = tl.arange(0, BS)
    for i in range(0, n_valid):
        j = tl.load(ibase + i)
        kpos = j * LS + offs
        kvis = (offs < LS) & (kpos <= pos) & (kpos < Tk)
        ptr = kv_base + kpos.to(tl.int64)[:, None] * (H * K) + offk[None, :]
        kt = tl.load(k + ptr, mask=kvis[:, None] & kmask[None, :], other=0.0)
        vt = tl.load(v + ptr, mask=kvis[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        p = tl.where(kvis[None, :] & gmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(dot_, tl.trans(vt))
        ds = p * (dp - dl[:, None])
        acc += tl.dot(ds.to(kt.dtype), kt)
    tl.store(dq + ptrs, (acc * sm_scale).to(dq.dtype.element_ty), mask=m2)


@triton.jit
def _sel_bwd_dkv_kernel(
    q, k, v, do, lse2_in, delta, tok_sorted, item_seg, item_start, item_end, dk, dv,
    Tq, Tk, NB, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    LS: tl.constexpr, BS: tl.constexpr, BQ: tl.constexpr,
):
    w = tl.program_id(0)
    s0 = tl.load(item_start + w)
    s1 = tl.load(item_end + w)
    if s0 < s1:
        seg = tl.load(item_seg + w)
        bh = seg // NB
        j = seg % NB
        b = bh // H
        h = bh % H
        HQ: tl.constexpr = H * G
        ROWS: tl.constexpr = BQ * GP
        offs = tl.arange(0, BS)
        kpos = j * LS + offs
        kval = (offs < LS) & (kpos < Tk)
        offk = tl.arange(0, BK)
        kmask = offk < K
        kv_ptr = (b.to(tl.int64) * Tk * H + h) * K + kpos.to(tl.int64)[:, None] * (H * K) + offk[None, :]
        kvm = kval[:, None] & kmask[None, :]
        kt = tl.load(k + kv_ptr, mask=kvm, other=0.0)
        vt = tl.load(v + kv_ptr, mask=kvm, other=0.0)
        rows = tl.arange(0, ROWS)
        rq = rows // GP
        g = rows % GP
        qk_scale = sm_scale * 1.4426950408889634
        dk_acc = tl.zeros([BS, BK], tl.float32)
        dv_acc = tl.zeros([BS, BK], tl.float32)
        for u in range(s0, s1, BQ):
            tmask = (u + rq < s1) & (g < G)
            t = tl.load(tok_sorted + u + rq, mask=tmask, other=0)
            pos = q_start + t
            row = (b.to(tl.int64) * Tq + t) * HQ + h * G + g
            m2 = tmask[:, None] & kmask[None, :]
            ptrs = row[:, None] * K + offk[None, :]
            qt = tl.load(q + ptrs, mask=m2, other=0.0)
            dot_ = tl.load(do + ptrs, mask=m2, other=0.0)
            lse2 = tl.load(lse2_in + row, mask=tmask, other=0.0)
            dl = tl.load(delta + row, mask=tmask, other=0.0)
            vis = tmask[:, None] & kval[None, :] & (kpos[None, :] <= pos[:, None])
            s = tl.dot(qt, tl.trans(kt)) * qk_scale
            p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
            dv_acc += tl.dot(tl.trans(p.to(dot_.dtype)), dot_)
            dp = tl.dot(dot_, tl.trans(vt))
            ds = p * (dp - dl[:, None])
            dk_acc += tl.dot(tl.trans(ds.to(qt.dtype)), qt)
        tl.atomic_add(dk + kv_ptr, dk_acc * sm_scale, mask=kvm)
        tl.atomic_add(dv + kv_ptr, dv_acc, mask=kvm)


#: launch parameters on CUDA (bench/bench_nsa.py --sweep): forward/dq warps and stages;
#: dk/dv pass: tokens per work item (qc), query rows per step (rows), warps
TUNE = dict(fwd_warps=4, fwd_stages=3, qc=512, rows=128, dkv_warps=8)


def _meta(q, k, idx, sel_block: int):
    B, Tq, HQ, K = q.shape
    H = k.shape[2]
    G = HQ // H
    n = idx.shape[-1]
    return dict(
        H=H, G=G, K=K, BK=max(16, triton.next_power_of_2(K)),
        LS=sel_block, BS=max(16, triton.next_power_of_2(sel_block)),
    ), n


def _sel_fwd(q, k, v, idx, sel_block: int, q_start: int):
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    meta, n = _meta(q, k, idx, sel_block)
    GP = max(16, triton.next_power_of_2(meta["G"]))
    o = torch.empty_like(q)
    lse2 = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse2
    interpret = q.device.type == "cpu"
    _sel_fwd_kernel[(Tq, B * H)](
        q, k, v, idx, o, lse2, Tq, Tk, q_start, 1.0 / math.sqrt(K), GP=GP,
        N=n, NP=triton.next_power_of_2(n), **meta,
        num_warps=4 if interpret else TUNE["fwd_warps"], num_stages=1 if interpret else TUNE["fwd_stages"],
    )
    return o, lse2


def _inverse_selection(idx, Tk, ls, qc):
    """Work items for the dk/dv pass: tokens grouped by the (b, h, block) they selected.

    Returns tok_sorted [B*H*Tq*n] int32 (tokens, ascending within each block), and per work
    item its segment (b*H + h)*NB + block, and the [start, end) range of tok_sorted it owns.
    The item count is an upper bound known without a device-to-host sync; items past the
    real ones are empty."""
    B, Tq, H, n = idx.shape
    NB = triton.cdiv(Tk, ls)
    nseg = B * H * NB
    dev = idx.device
    bh = torch.arange(B * H, device=dev).view(B, H, 1, 1)
    sel = idx.permute(0, 2, 1, 3)  # [B, H, Tq, n]
    key = torch.where(sel >= 0, bh * NB + sel, nseg).flatten()
    key_sorted, order = torch.sort(key, stable=True)
    tok_sorted = torch.div(order, n, rounding_mode="floor").remainder(Tq).to(torch.int32)
    # segment bounds by binary search (torch.bincount would sync with the host for its length)
    bounds = torch.searchsorted(key_sorted, torch.arange(nseg + 1, device=dev))
    offs = bounds[:-1]
    counts = bounds[1:] - offs
    chunks = torch.div(counts + qc - 1, qc, rounding_mode="floor")
    cum = torch.cumsum(chunks, 0)
    n_items = (B * H * Tq * n) // qc + nseg
    wi = torch.arange(n_items, device=dev)
    seg = torch.searchsorted(cum, wi, right=True)
    real = seg < nseg
    seg = seg.clamp(max=nseg - 1)
    start = offs[seg] + (wi - (cum[seg] - chunks[seg])) * qc
    end = torch.minimum(start + qc, offs[seg] + counts[seg])
    end = torch.where(real, end, start)
    return tok_sorted, seg.to(torch.int32), start.to(torch.int32), end.to(torch.int32), NB


def _sel_bwd(q, k, v, idx, o, lse2, do, sel_block: int, q_start: int):
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    meta, n = _meta(q, k, idx, sel_block)
    G = meta["G"]
    interpret = q.device.type == "cpu"
    dq = torch.empty_like(q)
    if Tq == 0 or Tk == 0:
        return dq.zero_(), torch.zeros_like(k), torch.zeros_like(v)
    delta = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    GP16 = max(16, triton.next_power_of_2(G))
    sm = 1.0 / math.sqrt(K)
    _sel_bwd_dq_kernel[(Tq, B * H)](
        q, k, v, idx, o, do, lse2, delta, dq, Tq, Tk, q_start, sm, GP=GP16,
        N=n, NP=triton.next_power_of_2(n), **meta,
        num_warps=4 if interpret else TUNE["fwd_warps"], num_stages=1 if interpret else TUNE["fwd_stages"],
    )
    qc = 64 if interpret else TUNE["qc"]
    tok_sorted, seg, start, end, NB = _inverse_selection(idx, Tk, sel_block, qc)
    dk = torch.zeros(k.shape, device=k.device, dtype=torch.float32)
    dv = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
    GP = triton.next_power_of_2(G)
    rows = 64 if interpret else TUNE["rows"]
    BQ = max(1, rows // GP)
    _sel_bwd_dkv_kernel[(seg.numel(),)](
        q, k, v, do, lse2, delta, tok_sorted, seg, start, end, dk, dv,
        Tq, Tk, NB, q_start, sm, GP=GP, BQ=BQ, **meta,
        num_warps=4 if interpret else TUNE["dkv_warps"], num_stages=1 if interpret else 2,
    )
    return dq, dk.to(k.dtype), dv.to(v.dtype)


@torch.library.custom_op("nsa::sel_fwd", mutates_args=())
def sel_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, sel_block: int,
            q_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _sel_fwd(q, k, v, idx, sel_block, q_start)


@sel_fwd.register_fake
def _(q, k, v, idx, sel_block, q_start):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("nsa::sel_bwd", mutates_args=())
def sel_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, o: torch.Tensor,
            lse2: torch.Tensor, do: torch.Tensor, sel_block: int,
            q_start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _sel_bwd(q, k, v, idx, o, lse2, do.contiguous(), sel_block, q_start)


@sel_bwd.register_fake
def _(q, k, v, idx, o, lse2, do, sel_block, q_start):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _sel_setup(ctx, inputs, output):
    q, k, v, idx, sel_block, q_start = inputs
    ctx.save_for_backward(q, k, v, idx, *output)
    ctx.args = (sel_block, q_start)
    ctx.mark_non_differentiable(output[1])


def _sel_backward(ctx, do, dlse2):
    q, k, v, idx, o, lse2 = ctx.saved_tensors
    dq, dk, dv = sel_bwd(q, k, v, idx, o, lse2, do, *ctx.args)
    return dq, dk, dv, None, None, None


sel_fwd.register_autograd(_sel_backward, setup_context=_sel_setup)


def triton_sel_attention(q, k, v, idx, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """Selected branch: q [B, Tq, HQ, K] attends, per KV group, to the tokens of the blocks in
    idx [B, Tq, H, n] (ascending, -1 padded), causally inside the block holding the query.
    Same signature and semantics as torch_sel_attention; `chunk` is unused. Returns
    o [B, Tq, HQ, K]. Runs as the custom ops nsa::sel_fwd / nsa::sel_bwd (opaque to
    torch.compile)."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of KV heads {k.shape[2]}")
    q, k, v, idx = (t.contiguous() for t in (q, k, v, idx))
    return sel_fwd(q, k, v, idx, cfg.sel_block, int(q_start))[0]
