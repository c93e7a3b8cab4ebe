"""Gate statistics and backend routes, read by walking the modules.

Walking ``model.modules()`` works through DDP, FSDP2 and checkpoint wrappers alike; a method on
the top-level model would not (the seeds' FSDP run died on a missing ``get_gate_stats``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from nsa import kernels

from ..attention import NSAAttention
from ..attention.backends import Route
from ..attention.config import BRANCHES
from ..attention.dense import DenseAttention
from ..attention.kernel_branches import deterministic


def attention_modules(model: nn.Module) -> list[NSAAttention | DenseAttention]:
    """The attention modules of either kind (model.attn.kind)."""
    return [m for m in model.modules() if isinstance(m, (NSAAttention, DenseAttention))]


def track_gates(model: nn.Module, on: bool = True) -> None:
    """Have every attention layer keep the mean gate per branch of its last forward (a small
    reduction a forward), which gate_stats reads; off by default, so that a model nobody asks
    statistics of does no work for them."""
    for m in attention_modules(model):
        m.track_gates = on


def count_calls(model: nn.Module, on: bool = True) -> None:
    """Have every attention layer count its forward calls (a one-element add a forward, which
    torch.compile and the layer's CUDA graphs keep), which backend_report reads; off by default,
    so that a model nobody audits launches nothing for it."""
    for m in attention_modules(model):
        m.count_calls = on


def gate_stats(model: nn.Module) -> dict[str, float]:
    """Mean gate value per branch over all layers from the last forward while track_gates was on
    ({} before any, and for dense attention, which has no gates).
    Reading it synchronises with the device: call it on logging steps only."""
    means = [m.last_gate_mean for m in attention_modules(model) if m.last_gate_mean is not None]
    if not means:
        return {}
    total = sum(means) / len(means)
    return {b: float(v) for b, v in zip(BRANCHES, total.tolist())}


def backend_report(model: nn.Module, tokens: int | None = None) -> dict[str, dict]:
    """Per stage: the backend that ran, why, whether 'auto' fell back past a backend meant for
    this device, and how many layer-calls ran it (the layers counting calls, count_calls; None
    where none does). ``tokens``: the length of the sequences the model is called on from their
    start (a training step's); a route that hands calls of some sizes to another backend is named
    by the one that ran at that length (``_ran``). Reading the call counts synchronises with the
    device: call it on logging steps only."""
    report: dict[str, dict] = {}
    modules = attention_modules(model)
    counting = any(m.count_calls for m in modules)
    calls = torch.stack([m.calls for m in modules]).tolist() if counting else [0] * len(modules)
    for m, n in zip(modules, calls):
        for stage, route in m.routes.items():
            backend, reason = _ran(m, stage, route, tokens)
            entry = report.setdefault(stage, {"backend": backend, "reason": reason,
                                              "fallback": route.fallback, "calls": 0 if counting else None})
            if entry["backend"] != backend:
                entry["backend"] = "mixed"
            if m.count_calls:
                entry["calls"] += n
    return report


def _ran(m: NSAAttention | DenseAttention, stage: str, route: Route, tokens: int | None) -> tuple[str, str]:
    """The backend that runs a stage's calls of ``tokens`` tokens from the sequence's start, and
    why: the route's, but for the compressed branch's 'cudnn', which folds long prefills only and
    runs the Triton band kernel below them (nsa.kernels.cudnn_folds)."""
    if stage != "cmp" or route.backend != "cudnn" or tokens is None or not isinstance(m, NSAAttention):
        return route.backend, route.reason
    cfg, fixed_order = m.cfg, deterministic()
    if kernels.cudnn_folds(tokens, m.n_heads, m.head_dim, cfg.cmp_block, cfg.cmp_stride, 0, fixed_order):
        return route.backend, route.reason
    if fixed_order:
        return "triton", ("the Triton band kernel: attn.backend_cmp's cuDNN route runs it where a fixed summation "
                          "order is asked for (torch.use_deterministic_algorithms)")
    elements = tokens * m.n_heads * m.head_dim
    # the thresholds read at the call, as cudnn_folds reads them (a benchmark may set them)
    short = []
    if tokens < kernels.CUDNN_MIN_QUERIES:
        short.append(f"{tokens:,} tokens, under {kernels.CUDNN_MIN_QUERIES:,}")
    if elements < kernels.CUDNN_MIN_ELEMENTS:
        short.append(f"{elements:,} query elements ({tokens:,} x {m.n_heads} heads x {m.head_dim}), under "
                     f"{kernels.CUDNN_MIN_ELEMENTS:,}")
    if m.head_dim > kernels.CUDNN_MAX_HEAD_DIM:
        short.append(f"head dim {m.head_dim}, over {kernels.CUDNN_MAX_HEAD_DIM}")
    return "triton", (f"the Triton band kernel at {tokens:,} tokens: attn.backend_cmp's cuDNN route folds long "
                      f"prefills only, and these have " + "; ".join(short))
