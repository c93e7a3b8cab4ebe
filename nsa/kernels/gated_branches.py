"""The selected and sliding-window branches and the gated sum of all three branches as one
differentiable op (nsa::gated_branches_fwd / nsa::gated_branches_bwd), for the NSA core when
both branches run on the Triton kernels:

    o = g_cmp * o_cmp + g_sel * Sel(q, k_sel, v_sel, idx) + g_win * Win(q, k_win, v_win)

The forward runs the kernels of the three separate calls (selection, band_attention with
WINDOW, combine). The backward leaves out glue the separate ops need between them:

* the gated sum's backward writes dgates and do_cmp = g_cmp * do (the compressed branch, cuDNN
  or the band kernel, takes its gradient as a tensor), but not g_sel * do nor g_win * do: the
  selected and window branches' backward kernels take do itself, with the gate folded into
  each row's log-sum-exp, lse - ln(g), so that the probabilities they recompute come out as
  g * P, and delta = rowsum(do * o) (which the gated sum's backward has on its way to dgates).
  Their softmax backward is then exactly that of the gradient g * do:
  dS = g P (do V^T - rowsum(do * o)), dV = (g P)^T do, with no work a tile added to the
  kernels. The gates must be non-negative (sigmoid outputs, as NSAAttention makes them): a
  negative gate makes the gradients NaN; a zero gate, zero;
* the selected branch's last dq kernel adds the window's dq, so autograd sums one dq fewer;
* the selected forward's inverse selection, where it built one the backward can take
  (nsa.kernels.selection._shared_qc), is saved for the backward's dk/dv pass, which then sorts
  nothing.

Neither branch reads its output again for its delta. The gradients are those of the separate
ops up to rounding (there g * do is rounded to do's dtype before the tensor-core products).
Shapes: gates [B, Tq, HQ, 3] (cmp, sel, win); o_cmp and q [B, Tq, HQ, K]; k_*, v_* [B, Tk, H,
K]; idx [B, Tq, H, n].
"""
from __future__ import annotations

import torch

from . import band_attention, combine, selection
from ._autograd import kernel_op
from ._ranges import stage_range
from ._inverse import as_outputs, from_outputs
from .tuning import SELECTION, SelectionTuning


def window_forward(q: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, q_start: int, window: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The window branch's o_win and lse_win, as the op's forward computes them."""
    return band_attention.band_forward(q.contiguous(), k_win.contiguous(), v_win.contiguous(), q_start, 1, 1,
                                       window, True)


def _fwd(gates: torch.Tensor, o_cmp: torch.Tensor, q: torch.Tensor, k_sel: torch.Tensor, v_sel: torch.Tensor,
         k_win: torch.Tensor, v_win: torch.Tensor, idx: torch.Tensor, q_start: int, sel_block: int, window: int,
         deterministic: bool, sel_form: str, sel_tuning: str,
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                    torch.Tensor]:
    """o, and what the backward needs: o_sel, lse_sel, o_win, lse_win, and the selected
    forward's inverse selection as three tensors (tokens, perm, items; empty where none);
    sel_tuning: a SelectionTuning.as_arg()."""
    # the ranges of the separate stages (nsa.attention.core), for the profile phase
    with stage_range("nsa.sel"):
        o_sel, lse_sel, inverse = selection._sel_fwd(q, k_sel, v_sel, idx, sel_block, q_start, deterministic,
                                                     sel_form, SelectionTuning.from_arg(sel_tuning))
    with stage_range("nsa.win"):
        o_win, lse_win = window_forward(q, k_win, v_win, q_start, window)
    with stage_range("nsa.gate_combine"):
        o = combine._combine_fwd(gates, o_cmp, o_sel.to(o_cmp.dtype), o_win.to(o_cmp.dtype))
    return (o, o_sel, lse_sel, o_win, lse_win, *as_outputs(inverse, q.device))


def _bwd(gates: torch.Tensor, o_cmp: torch.Tensor, q: torch.Tensor, k_sel: torch.Tensor, v_sel: torch.Tensor,
         k_win: torch.Tensor, v_win: torch.Tensor, idx: torch.Tensor, o_sel: torch.Tensor,
         lse_sel: torch.Tensor, o_win: torch.Tensor, lse_win: torch.Tensor, tokens: torch.Tensor, perm: torch.Tensor,
         items: torch.Tensor, do: torch.Tensor, q_start: int, sel_block: int, window: int, deterministic: bool,
         sel_form: str, sel_tuning: str,
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dgates, do_cmp, dq (selected + window), dk_sel, dv_sel, dk_win, dv_win."""
    dgates, do_cmp, delta_sel, delta_win, lse_sel_g, lse_win_g = combine.combine_bwd_folded(
        gates, o_cmp, o_sel, o_win, do, lse_sel, lse_win)
    dq_win, dk_win, dv_win = band_attention.band_backward(q, k_win, v_win, o_win, lse_win_g, do, q_start, 1, 1,
                                                          window, True, deterministic, delta_win)
    dq, dk_sel, dv_sel = selection.selection_backward(
        q, k_sel, v_sel, idx, o_sel, lse_sel_g, do, sel_block, q_start, deterministic, delta_sel, dq_win,
        from_outputs(tokens, perm, items, k_sel.shape[1], sel_block), SelectionTuning.from_arg(sel_tuning))
    return dgates, do_cmp, dq, dk_sel, dv_sel, dk_win, dv_win


def _fake(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start, sel_block, window, deterministic, sel_form,
          sel_tuning):
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    return (torch.empty_like(o_cmp), torch.empty_like(q), lse, torch.empty_like(q), torch.empty_like(lse),
            *selection.fake_inverse(q, k_sel, idx, sel_block, deterministic, sel_form,
                                    SelectionTuning.from_arg(sel_tuning)))


#: the custom ops nsa::gated_branches_fwd / _bwd (see nsa.kernels._autograd); idx gets no gradient.
#: The backward keeps the branches' outputs, not o: a consumer of o may keep how to make it again
#: (as NSAAttention does from 32k tokens), and o's memory is then free after that consumer's forward
gated_branches_op = kernel_op("gated_branches", _fwd, _bwd, _fake, tensors=8, grads=7,
                              saved_outputs=slice(1, None))


def gated_branches(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start: int, sel_block: int, window: int,
                   deterministic: bool = False, sel_form: str = "auto",
                   sel_tuning: SelectionTuning = SELECTION) -> torch.Tensor:
    """o = g_cmp * o_cmp + g_sel * (selected branch) + g_win * (window branch), see the module
    docstring; what selected_attention, band_attention(..., window=True) and gate_combine
    compute in three calls (sel_form: the selected forward, one of nsa.kernels.SEL_FORMS;
    sel_tuning: its launch parameters and variants, nsa.kernels.tuning). Returns o [B, Tq, HQ, K]
    in o_cmp's dtype."""
    return gated_branches_outputs(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start, sel_block, window,
                                  deterministic, sel_form, sel_tuning)[0]


def gated_branches_outputs(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start: int, sel_block: int,
                           window: int, deterministic: bool = False, sel_form: str = "auto",
                           sel_tuning: SelectionTuning = SELECTION
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """gated_branches' o, and the selected and window branches' outputs and the window's lse,
    which its backward keeps (no gradient): gate_combine(gates, o_cmp, o_sel, o_win) gives o
    again, bit for bit, and window_forward(q, k_win, v_win, q_start, window) (o_win, lse_win)."""
    if q.shape[2] % k_sel.shape[2] or q.shape[2] % k_win.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of KV heads "
                         f"({k_sel.shape[2]} selected, {k_win.shape[2]} window)")
    tensors = (t.contiguous() for t in (gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx))
    o, o_sel, _, o_win, lse_win, *_ = gated_branches_op(*tensors, int(q_start), int(sel_block), int(window),
                                                        bool(deterministic), str(sel_form), sel_tuning.as_arg())
    return o, o_sel, o_win, lse_win
