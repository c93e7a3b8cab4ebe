"""The NSA core: three branches on projected q/k/v, combined by the gates.

    o_t = g_cmp * Attn(q_t, compressed) + g_sel * Attn(q_t, selected) + g_win * Attn(q_t, window)

Which implementation runs each stage is decided by nsa.attention.backends; this function only
wires the stages together, so every backend is judged by the same oracle tests.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import record_function

from .backends import Route, gate_combine, gated_branches, implementation
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
    return nsa_core_remade(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, cfg, routes, q_start)[0]


def nsa_core_remade(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, cfg: NSAConfig, routes: dict[str, Route],
                    q_start: int = 0) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    """nsa_core's o, and a function that computes o again, bit for bit, from the branches'
    outputs and the gates, which the branches' backward keeps anyway: a consumer of o (the
    output projection) can keep that instead of o."""
    # named ranges: torch.profiler attributes time to each stage (the NVTX phase checks them),
    # and under torch.autograd.profiler.emit_nvtx they become NVTX ranges for Nsight users
    with record_function("nsa.cmp"):
        o_cmp, lse = implementation(routes["cmp"])(q, kc, vc, cfg, q_start)
    with record_function("nsa.select"):
        idx = implementation(routes["select"])(q, kc, lse, cfg, q_start)
    combine = gate_combine(routes["sel"])
    fused = gated_branches(routes)
    if fused is not None:  # the stages below as one op (the same ranges inside)
        o, o_sel, o_win = fused(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg, q_start)
    else:
        with record_function("nsa.sel"):
            o_sel = implementation(routes["sel"])(q, k_sel, v_sel, idx, cfg, q_start)
        with record_function("nsa.win"):
            o_win = implementation(routes["win"])(q, k_win, v_win, cfg, q_start)
        with record_function("nsa.gate_combine"):
            o = combine(gates, o_cmp, o_sel, o_win)
    branches = (gates.detach(), o_cmp.detach(), o_sel.detach(), o_win.detach())

    def remade() -> torch.Tensor:
        with torch.no_grad():
            return combine(*branches)

    return o, remade
