"""The NSA core: three branches on projected q/k/v, combined by the gates.

    o_t = g_cmp * Attn(q_t, compressed) + g_sel * Attn(q_t, selected) + g_win * Attn(q_t, window)

Which implementation runs each stage is decided by nsa.attention.backends; this function only
wires the stages together, so every backend is judged by the same oracle tests.

On long CUDA inputs the window branch runs on a side stream beside the compressed -> top-n ->
selected chain (which it does not depend on): the selected kernels are bound by L2 bandwidth
(they gather K/V blocks per token) and the window's by the tensor cores, so the GPU overlaps
them; autograd runs each backward on its forward's stream, so the backward overlaps too.
"""
from __future__ import annotations

import functools

import torch
from torch.profiler import record_function

from .backends import Route, gate_combine, implementation
from .config import NSAConfig

#: query tokens from which the window branch runs on a side stream (see the module docstring)
SIDE_STREAM_MIN_TOKENS = 8192


@functools.lru_cache(maxsize=None)
def _stream_of(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def _side_stream(q: torch.Tensor) -> torch.cuda.Stream | None:
    """The window branch's stream, or None to run it in line: off CUDA, on short inputs, and
    under torch.compile or CUDA-graph capture (which order their own streams)."""
    if q.device.type != "cuda" or q.shape[1] < SIDE_STREAM_MIN_TOKENS or torch.compiler.is_compiling():
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    return _stream_of(q.device)


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
    # named ranges: torch.profiler attributes time to each stage (the NVTX phase checks them),
    # and under torch.autograd.profiler.emit_nvtx they become NVTX ranges for Nsight users
    side = _side_stream(q)
    if side is not None:
        main = torch.cuda.current_stream(q.device)
        side.wait_stream(main)
        with torch.cuda.stream(side), record_function("nsa.win"):
            o_win = implementation(routes["win"])(q, k_win, v_win, cfg, q_start)
        for t in (q, k_win, v_win):  # main's memory, read on the side stream
            t.record_stream(side)
    with record_function("nsa.cmp"):
        o_cmp, lse = implementation(routes["cmp"])(q, kc, vc, cfg, q_start)
    with record_function("nsa.select"):
        idx = implementation(routes["select"])(q, kc, lse, cfg, q_start)
    with record_function("nsa.sel"):
        o_sel = implementation(routes["sel"])(q, k_sel, v_sel, idx, cfg, q_start)
    if side is None:
        with record_function("nsa.win"):
            o_win = implementation(routes["win"])(q, k_win, v_win, cfg, q_start)
    else:
        main.wait_stream(side)
        o_win.record_stream(main)  # the side stream's memory, read on main
    with record_function("nsa.gate_combine"):
        return gate_combine(routes["sel"])(gates, o_cmp, o_sel, o_win)
