"""Per-branch backend registry and routing.

Each NSA stage has named implementations: 'cmp' (compressed attention, returns o and lse),
'select' (importance scores and top-n; follows the cmp branch's backend), 'sel' (selected
attention) and 'win' (sliding window). The PyTorch implementations are registered here; faster
ones (Triton, FlexAttention, SDPA, flash-attn) register themselves from nsa.kernels.

``resolve_route`` turns a requested backend ('auto' or a name) into a Route with the reason
it was chosen. A backend that is asked for by name but cannot run is an error
(BackendUnavailable), never a silent fallback; 'auto' takes the highest-priority available
implementation and says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import torch_branches as tb

STAGES = ("cmp", "select", "sel", "win")
#: which config key picks the backend of each stage
STAGE_CONFIG_KEY = {"cmp": "backend_cmp", "select": "backend_cmp", "sel": "backend_sel", "win": "backend_win"}


class BackendUnavailable(RuntimeError):
    """A backend was requested by name but cannot run here; the message says why."""


@dataclass(frozen=True)
class Impl:
    name: str
    fn: Callable
    available: Callable[[torch.device, torch.dtype], tuple[bool, str]]
    """(device, dtype) -> (usable, reason); reason says why not when unusable."""
    priority: int | Callable[[torch.device, torch.dtype], int | None]
    """Higher wins under 'auto'; a callable gives it per device and dtype (a GPU kernel that
    can also run interpreted on CPU should rank below torch there). None: not meant for this
    device and dtype, so 'auto' does not consider it and skipping it is no fallback."""

    def rank(self, device: torch.device, dtype: torch.dtype) -> int | None:
        return self.priority(device, dtype) if callable(self.priority) else self.priority


@dataclass(frozen=True)
class Route:
    stage: str
    backend: str
    reason: str
    fallback: bool = False
    """'auto' had to pass over a higher-ranked backend meant for this device (the reason
    names it and why): the run is slower than it should be."""


_REGISTRY: dict[str, dict[str, Impl]] = {s: {} for s in STAGES}


def register(stage: str, name: str, fn: Callable, available, priority) -> None:
    if stage not in _REGISTRY:
        raise ValueError(f"unknown NSA stage {stage!r}; stages: {STAGES}")
    _REGISTRY[stage][name] = Impl(name, fn, available, priority)


def registered(stage: str) -> list[str]:
    _load_optional_backends()
    return sorted(_REGISTRY[stage])


def _always(device, dtype):
    return True, "portable PyTorch path"


register("cmp", "torch", tb.torch_cmp_attention, _always, 0)
register("select", "torch", tb.torch_select_blocks, _always, 0)
register("sel", "torch", tb.torch_sel_attention, _always, 0)
register("win", "torch", tb.torch_win_attention, _always, 0)


def torch_gate_combine(gates, o_cmp, o_sel, o_win):
    """o = g_cmp * o_cmp + g_sel * o_sel + g_win * o_win (gates [..., 3], per query head)."""
    g = gates.to(o_cmp.dtype)
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_sel + g[..., 2:3] * o_win


#: fused gated sums, keyed by the backend of the sel stage (the torch sum otherwise)
_COMBINE: dict[str, Callable] = {}


def register_combine(name: str, fn: Callable) -> None:
    _COMBINE[name] = fn


def gate_combine(route: Route) -> Callable:
    """The gated sum that goes with the selected branch's backend."""
    return _COMBINE.get(route.backend, torch_gate_combine)


_optional_loaded = False


def _load_optional_backends() -> None:
    """Import nsa.kernels once; it registers whatever its dependencies allow."""
    global _optional_loaded
    if not _optional_loaded:
        _optional_loaded = True
        from .. import kernels  # noqa: F401  (registers on import)


def resolve_route(stage: str, requested: str, device: torch.device, dtype: torch.dtype) -> Route:
    _load_optional_backends()
    impls = _REGISTRY[stage]
    if requested != "auto":
        if requested not in impls:
            raise BackendUnavailable(
                f"attn.{STAGE_CONFIG_KEY[stage]}={requested!r} is not a backend of the {stage} "
                f"stage; registered: {', '.join(sorted(impls))}"
            )
        ok, why = impls[requested].available(device, dtype)
        if not ok:
            raise BackendUnavailable(
                f"attn.{STAGE_CONFIG_KEY[stage]}={requested!r} cannot run on {device.type}/{dtype}: {why}"
            )
        return Route(stage, requested, f"requested by config ({why})")
    skipped = []
    candidates = [i for i in impls.values() if i.rank(device, dtype) is not None]
    for impl in sorted(candidates, key=lambda i: -i.rank(device, dtype)):
        ok, why = impl.available(device, dtype)
        if ok:
            note = f"; skipped {', '.join(skipped)}" if skipped else ""
            return Route(stage, impl.name, f"auto: {why}{note}", fallback=bool(skipped))
        skipped.append(f"{impl.name} ({why})")
    raise BackendUnavailable(f"no backend can run the {stage} stage on {device.type}/{dtype}")


def implementation(route: Route) -> Callable:
    return _REGISTRY[route.stage][route.backend].fn


def preload(route: Route) -> None:
    """Import the route's implementation (and its gated sum) now: the fast backends import
    their kernels on first call, and that first call must not happen while torch.compile
    traces (a graph break at every NSA stage; seen as recompile-limit warnings)."""
    for fn in (implementation(route), gate_combine(route)):
        load = getattr(fn, "load", None)
        if load is not None:
            load()
