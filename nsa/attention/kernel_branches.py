"""The NSA stages on the fast kernels (nsa.kernels): each function takes the contract of its
PyTorch twin in torch_branches (q, keys, cfg, q_start) and calls a kernel with plain ints.

Here, not in the kernels, the config becomes kernel arguments (l, d, l', n, w), and so does
whether a backward pass must add its partial sums in a fixed order (``deterministic``). The
model's calls take the kernels' measured launches; a benchmark sweep passes others as
``tuning`` (nsa.kernels.tuning).

The kernel modules import Triton, so each function imports its kernel when it runs, and
``import_kernels`` imports them all ahead of time: whether Triton interprets a kernel
(TRITON_INTERPRET=1, CPU) is fixed when its @triton.jit runs, so ``import nsa`` must not import
Triton, and under torch.compile an import must not happen for the first time inside a trace
(routing calls ``import_kernels``, see backends.preload).

Shapes: q [B, Tq, HQ, K] at positions q_start..; per-token k/v [B, Tk, H, K]; compressed
kc/vc [B, Nc, H, K]; idx [B, Tq, H, n] (ascending, -1 padded); lse [B, Tq, HQ] (natural log).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .config import NSAConfig

if TYPE_CHECKING:
    from nsa.kernels.tuning import BandTiles, SelectionTuning, TopkTuning


def import_kernels() -> None:
    """Import every kernel module now (Triton, the @triton.jit kernels, the nsa:: custom ops)."""
    from nsa.kernels import (  # noqa: F401
        band_attention, combine, cudnn_compressed, gated_branches, phi_mlp, rope, selection, topk, window,
    )


def deterministic() -> bool:
    """Whether backward passes must sum in a fixed order (no float atomics): on when
    torch.use_deterministic_algorithms(True) is (the trainer's determinism switch). Read at
    each call; torch.compile reads it at trace time and guards on it."""
    return torch.are_deterministic_algorithms_enabled()


def triton_cmp_attention(q, kc, vc, cfg: NSAConfig, q_start: int = 0, tuning: BandTiles | None = None):
    """Compressed branch on the band kernel: compressed token i is visible to position t iff
    i*d + l - 1 <= t. Returns o [B, Tq, HQ, K] and lse [B, Tq, HQ] (float32, no gradient;
    -inf for a query that sees no compressed token, whose output is zero)."""
    from nsa.kernels.band_attention import band_attention
    from nsa.kernels.tuning import BAND

    return band_attention(q, kc, vc, q_start, cfg.cmp_block, cfg.cmp_stride, 0, False, deterministic(),
                          tuning or BAND)


def cudnn_cmp_attention(q, kc, vc, cfg: NSAConfig, q_start: int = 0):
    """Compressed branch on cuDNN's fused attention over folded query runs (long bf16/fp16
    prefill), the band kernel otherwise; returns what triton_cmp_attention returns."""
    from nsa.kernels.cudnn_compressed import cudnn_cmp_attention as cudnn
    from nsa.kernels.tuning import BAND

    return cudnn(q, kc, vc, q_start, cfg.cmp_block, cfg.cmp_stride, deterministic(), BAND)


def triton_select_blocks(q, kc, lse, cfg: NSAConfig, q_start: int = 0, tuning: TopkTuning | None = None):
    """Importance scores and top-n blocks fused: idx [B, Tq, H, n] int64, ascending, -1 padded."""
    from nsa.kernels.topk import select_blocks
    from nsa.kernels.tuning import TOPK

    return select_blocks(q, kc, lse, q_start, cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected,
                         tuning or TOPK)


def triton_sel_attention(q, k, v, idx, cfg: NSAConfig, q_start: int = 0, tuning: SelectionTuning | None = None):
    """Selected branch: each query attends to the blocks of l' tokens in idx, causally inside
    the block holding it. Returns o [B, Tq, HQ, K]."""
    from nsa.kernels.selection import selected_attention
    from nsa.kernels.tuning import SELECTION

    return selected_attention(q, k, v, idx, q_start, cfg.sel_block, deterministic(), cfg.sel_form,
                              tuning or SELECTION)


def triton_win_attention(q, k, v, cfg: NSAConfig, q_start: int = 0, tuning: BandTiles | None = None):
    """Window branch on the band kernel: query t sees keys (t - w, t]."""
    from nsa.kernels.band_attention import band_attention
    from nsa.kernels.tuning import BAND

    return band_attention(q, k, v, q_start, 1, 1, cfg.window, True, deterministic(), tuning or BAND)[0]


def flex_win_attention(q, k, v, cfg: NSAConfig, q_start: int = 0):
    """Window branch on FlexAttention with a sliding-window block mask (CUDA)."""
    from nsa.kernels.window import flex_window_attention

    return flex_window_attention(q, k, v, q_start, cfg.window)


def flash_attn_win_attention(q, k, v, cfg: NSAConfig, q_start: int = 0):
    """Window branch on flash-attn's local attention (CUDA, when installed)."""
    from nsa.kernels.window import flash_attn_window_attention

    return flash_attn_window_attention(q, k, v, q_start, cfg.window)


def triton_gate_combine(gates, o_cmp, o_sel, o_win):
    """o = sum of the gated branches, fused (gates [B, T, HQ, 3] in cmp, sel, win order)."""
    from nsa.kernels.combine import gate_combine

    return gate_combine(gates, o_cmp, o_sel, o_win)


def triton_gated_branches(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg: NSAConfig, q_start: int = 0):
    """The selected and window branches and the gated sum of all three as one op, whose backward
    leaves out the glue between them (nsa.kernels.gated_branches); returns o [B, Tq, HQ, K]."""
    return triton_gated_branches_outputs(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg, q_start)[0]


def triton_gated_branches_outputs(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg: NSAConfig,
                                  q_start: int = 0, tuning: SelectionTuning | None = None):
    """triton_gated_branches' o, and the selected and window branches' outputs and the window's
    lse, which its backward keeps."""
    from nsa.kernels.gated_branches import gated_branches_outputs
    from nsa.kernels.tuning import SELECTION

    return gated_branches_outputs(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start, cfg.sel_block,
                                  cfg.window, deterministic(), cfg.sel_form, tuning or SELECTION)


def triton_window_again(q, k_win, v_win, cfg: NSAConfig, q_start: int = 0):
    """The window branch's (o, lse) as triton_gated_branches_outputs computes them, bit for bit
    (no gradient)."""
    from nsa.kernels.gated_branches import window_forward

    return window_forward(q, k_win, v_win, q_start, cfg.window)
