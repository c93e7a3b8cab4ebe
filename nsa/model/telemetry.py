"""Gate statistics and backend routes, read by walking the modules.

Walking ``model.modules()`` works through DDP, FSDP2 and checkpoint wrappers alike; a method on
the top-level model would not (the seeds' FSDP run died on a missing ``get_gate_stats``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..attention import NSAAttention
from ..attention.config import BRANCHES
from ..attention.dense import DenseAttention


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


def backend_report(model: nn.Module) -> dict[str, dict]:
    """Per stage: the backend chosen, why, whether 'auto' fell back past a backend meant for
    this device, and how many layer-calls ran it (the layers counting calls, count_calls; None
    where none does). Reading the call counts synchronises with the device: call it on logging
    steps only."""
    report: dict[str, dict] = {}
    modules = attention_modules(model)
    counting = any(m.count_calls for m in modules)
    calls = torch.stack([m.calls for m in modules]).tolist() if counting else [0] * len(modules)
    for m, n in zip(modules, calls):
        for stage, route in m.routes.items():
            entry = report.setdefault(stage, {"backend": route.backend, "reason": route.reason,
                                              "fallback": route.fallback, "calls": 0 if counting else None})
            if entry["backend"] != route.backend:
                entry["backend"] = "mixed"
            if m.count_calls:
                entry["calls"] += n
    return report
