"""Triton gated sum of the three NSA branches, forward and backward in one pass each:

    o = g_cmp * o_cmp + g_sel * o_sel + g_win * o_win      (gates per query head)

PyTorch autograd runs this as about a dozen elementwise kernels over [B, T, HQ, K] tensors
(five forward, the rest backward, plus gate-slice scatters); at long sequence lengths that
traffic is a noticeable share of the NSA core, so it is fused here.

Shapes: gates [B, T, HQ, 3] (cmp, sel, win); o_* and o [B, T, HQ, K]; rows are (b, t, hq).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autograd import kernel_op


@triton.jit
def _combine_fwd_kernel(g, oc, os_, ow, o, n_rows, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = rows < n_rows
    cols = tl.arange(0, BK)
    m = rm[:, None] & (cols < K)[None, :]
    off = rows.to(tl.int64)[:, None] * K + cols[None, :]
    g0 = tl.load(g + rows.to(tl.int64) * 3, mask=rm, other=0.0).to(tl.float32)
    g1 = tl.load(g + rows.to(tl.int64) * 3 + 1, mask=rm, other=0.0).to(tl.float32)
    g2 = tl.load(g + rows.to(tl.int64) * 3 + 2, mask=rm, other=0.0).to(tl.float32)
    acc = g0[:, None] * tl.load(oc + off, mask=m, other=0.0).to(tl.float32)
    acc += g1[:, None] * tl.load(os_ + off, mask=m, other=0.0).to(tl.float32)
    acc += g2[:, None] * tl.load(ow + off, mask=m, other=0.0).to(tl.float32)
    tl.store(o + off, acc.to(o.dtype.element_ty), mask=m)


@triton.jit
def _combine_bwd_kernel(g, oc, os_, ow, do, dg, doc, dos, dow, lse_s, lse_w, fold_s, fold_w, n_rows,
                        K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr):
    """dg and do_cmp = g_cmp * do; then do_sel, do_win into dos, dow or, FOLD, what the selected
    and window branches' backward takes instead (nsa.kernels.gated_branches): delta =
    rowsum(do * o) (float32 [rows]) into dos, dow, and lse - ln(g) of lse_s, lse_w into fold_s,
    fold_w."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = rows < n_rows
    cols = tl.arange(0, BK)
    m = rm[:, None] & (cols < K)[None, :]
    off = rows.to(tl.int64)[:, None] * K + cols[None, :]
    r3 = rows.to(tl.int64) * 3
    dout = tl.load(do + off, mask=m, other=0.0).to(tl.float32)
    g0 = tl.load(g + r3, mask=rm, other=0.0).to(tl.float32)
    g1 = tl.load(g + r3 + 1, mask=rm, other=0.0).to(tl.float32)
    g2 = tl.load(g + r3 + 2, mask=rm, other=0.0).to(tl.float32)
    tl.store(doc + off, (g0[:, None] * dout).to(doc.dtype.element_ty), mask=m)
    d0 = tl.sum(dout * tl.load(oc + off, mask=m, other=0.0).to(tl.float32), 1)
    d1 = tl.sum(dout * tl.load(os_ + off, mask=m, other=0.0).to(tl.float32), 1)
    d2 = tl.sum(dout * tl.load(ow + off, mask=m, other=0.0).to(tl.float32), 1)
    if FOLD:
        tl.store(dos + rows, d1, mask=rm)
        tl.store(dow + rows, d2, mask=rm)
        _fold_gate(lse_s, fold_s, rows, rm, g1)
        _fold_gate(lse_w, fold_w, rows, rm, g2)
    else:
        tl.store(dos + off, (g1[:, None] * dout).to(dos.dtype.element_ty), mask=m)
        tl.store(dow + off, (g2[:, None] * dout).to(dow.dtype.element_ty), mask=m)
    tl.store(dg + r3, d0.to(dg.dtype.element_ty), mask=rm)
    tl.store(dg + r3 + 1, d1.to(dg.dtype.element_ty), mask=rm)
    tl.store(dg + r3 + 2, d2.to(dg.dtype.element_ty), mask=rm)


@triton.jit
def _fold_gate(lse, out, rows, rm, g):
    """out = lse - ln(g): exp(s - that) = g * exp(s - lse), so a branch's backward run on it
    sees its probabilities times its gate (+inf for g = 0: probabilities 0; a row that sees no
    key keeps -inf; g < 0 gives NaN, loudly: the gates are sigmoid outputs)."""
    x = tl.load(lse + rows, mask=rm, other=0.0)
    ln_g = tl.log(tl.where(rm, g, 1.0))  # rows past the end: no log(0)
    tl.store(out + rows, tl.where(x == float("-inf"), x, x - ln_g), mask=rm)


def _launch_meta(K: int):
    BK = triton.next_power_of_2(K)
    return dict(K=K, BK=BK, BR=max(1, 4096 // BK))


def _combine_fwd(gates: torch.Tensor, oc: torch.Tensor, os_: torch.Tensor, ow: torch.Tensor) -> torch.Tensor:
    o = torch.empty_like(oc)
    n_rows, K = oc.numel() // oc.shape[-1], oc.shape[-1]
    meta = _launch_meta(K)
    if n_rows:
        _combine_fwd_kernel[(triton.cdiv(n_rows, meta["BR"]),)](gates, oc, os_, ow, o, n_rows, **meta)
    return o


def _combine_bwd_launch(gates, oc, os_, ow, do, lse_sel=None, lse_win=None):
    fold = lse_sel is not None
    do = do.contiguous()
    dg = torch.empty_like(gates)
    doc = torch.empty_like(oc)
    if fold:  # delta and the folded lse of both branches, one allocation
        dos, dow, fold_s, fold_w = torch.empty(4, *oc.shape[:-1], device=oc.device, dtype=torch.float32).unbind(0)
    else:
        dos, dow = torch.empty_like(os_), torch.empty_like(ow)
        lse_sel = lse_win = fold_s = fold_w = dos  # valid pointers the kernel does not read
    n_rows, K = oc.numel() // oc.shape[-1], oc.shape[-1]
    meta = _launch_meta(K)
    if n_rows:
        _combine_bwd_kernel[(triton.cdiv(n_rows, meta["BR"]),)](
            gates, oc, os_, ow, do, dg, doc, dos, dow, lse_sel, lse_win, fold_s, fold_w, n_rows, FOLD=fold, **meta)
    return (dg, doc, dos, dow, fold_s, fold_w) if fold else (dg, doc, dos, dow)


def _combine_bwd(gates: torch.Tensor, oc: torch.Tensor, os_: torch.Tensor, ow: torch.Tensor,
                 do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _combine_bwd_launch(gates, oc, os_, ow, do)


def combine_bwd_folded(gates, oc, os_, ow, do, lse_sel, lse_win):
    """dgates and do_cmp = g_cmp * do, and for the selected and window branches what their
    backward takes in place of g * do: delta = rowsum(do * o) and lse - ln(g) ([B, T, HQ]
    float32 each; nsa.kernels.gated_branches). Returns dgates, do_cmp, delta_sel, delta_win,
    lse_sel - ln(g_sel), lse_win - ln(g_win)."""
    return _combine_bwd_launch(gates, oc, os_, ow, do, lse_sel, lse_win)


#: the custom ops nsa::gate_combine_fwd / nsa::gate_combine_bwd (see nsa.kernels._autograd)
gate_combine_op = kernel_op("gate_combine", _combine_fwd, _combine_bwd,
                            lambda gates, oc, os_, ow: torch.empty_like(oc), tensors=4, grads=4, saved_outputs=slice(0))


def gate_combine(gates, o_cmp, o_sel, o_win):
    """gates [B, T, HQ, 3]; o_* [B, T, HQ, K] (one dtype) -> o [B, T, HQ, K] in o_cmp's dtype.
    Under torch.compile it runs as the custom op nsa::gate_combine_fwd (see nsa.kernels._autograd)."""
    args = (t.contiguous() for t in (gates, o_cmp, o_sel.to(o_cmp.dtype), o_win.to(o_cmp.dtype)))
    return gate_combine_op(*args)
