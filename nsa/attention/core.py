"""The NSA core: three branches on projected q/k/v, combined by the gates.

    o_t = g_cmp * Attn(q_t, compressed) + g_sel * Attn(q_t, selected) + g_win * Attn(q_t, window)

Which implementation runs each stage is decided by nsa.attention.backends; this function only
wires the stages together, so every backend is judged by the same oracle tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from nsa.kernels._ranges import stage_range

from .backends import Route, fused_window_again, gate_combine, gated_branches, implementation
from .config import NSAConfig


def nsa_core(
    q: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    k_sel: torch.Tensor,
    v_sel: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    routes: dict[str, Route],
    q_start: int = 0,
) -> torch.Tensor:
    """q [B, Tq, HQ, K] at positions q_start..; kc/vc [B, Nc, H, K] compressed tokens;
    k_*/v_* [B, Tk, H, K] per-token keys of positions 0..Tk-1; gates [B, Tq, HQ, 3] in
    (cmp, sel, win) order. Returns o [B, Tq, HQ, K]."""
    return nsa_core_parts(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, cfg, routes, q_start).o


Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class CoreParts:
    """nsa_core's o and what makes parts of it again, bit for bit, for a layer that keeps
    recipes instead of tensors (nsa.attention.remade): ``cmp_again(q, kc, vc)`` gives the
    compressed branch's (o_cmp, lse_cmp); ``combine(gates, o_cmp, o_sel, o_win)`` gives o; where
    the window branch ran inside the fused op, ``window_again(q, k_win, v_win)`` gives its
    (o_win, lse_win), which that op's backward keeps (else None, and lse_win None)."""

    o: torch.Tensor
    o_cmp: torch.Tensor
    lse_cmp: torch.Tensor
    o_sel: torch.Tensor
    o_win: torch.Tensor
    lse_win: torch.Tensor | None
    cmp_again: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Pair]
    combine: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    window_again: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Pair] | None


def nsa_core_parts(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, cfg: NSAConfig, routes: dict[str, Route],
                   q_start: int = 0, one_op: bool = True) -> CoreParts:
    """nsa_core's o, with its branches' outputs and the functions that make them again.
    ``one_op``: the selected and window branches and the gated sum as one op where the routes
    allow it (backends.gated_branches); False: as three, whose outputs a caller can keep or make
    again one by one."""
    # named ranges: torch.profiler attributes time to each stage (the NVTX phase checks them),
    # and under torch.autograd.profiler.emit_nvtx they become NVTX ranges for Nsight users
    cmp_again = partial(implementation(routes["cmp"]), cfg=cfg, q_start=q_start)
    with stage_range("nsa.cmp"):
        o_cmp, lse = cmp_again(q, kc, vc)
    with stage_range("nsa.select"):
        idx = implementation(routes["select"])(q, kc, lse, cfg, q_start)
    combine = gate_combine(routes["sel"])
    fused = gated_branches(routes) if one_op else None
    if fused is not None:  # the stages below as one op (the same ranges inside)
        o, o_sel, o_win, lse_win = fused(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg, q_start)
        window_again = partial(fused_window_again(routes), cfg=cfg, q_start=q_start)
    else:
        with stage_range("nsa.sel"):
            o_sel = implementation(routes["sel"])(q, k_sel, v_sel, idx, cfg, q_start)
        with stage_range("nsa.win"):
            o_win = implementation(routes["win"])(q, k_win, v_win, cfg, q_start)
        with stage_range("nsa.gate_combine"):
            o = combine(gates, o_cmp, o_sel, o_win)
        lse_win = window_again = None
    return CoreParts(o, o_cmp, lse, o_sel, o_win, lse_win, cmp_again, combine, window_again)
