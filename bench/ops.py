"""The NSA ops and their baselines, registered once for every benchmark (fla's
benchmarks/ops/registry.py habit): each entry builds, from a set of core inputs (bench/inputs.py)
and an NSA config (whose keys choose the kernel variants, e.g. attn.sel_form), the forward to
time and the leaves its backward differentiates, and counts its work (bench/kernel_work.py).

    from bench.ops import OPS
    fwd, leaves = OPS["nsa_core"].build(x, cfg)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from bench import kernel_work as kw
from bench.inputs import CoreInputs, selection
from nsa.attention.backends import Route, resolve_route
from nsa.attention.config import NSAConfig
from nsa.attention.core import nsa_core

Built = tuple[Callable[[], torch.Tensor], list[torch.Tensor]]


@dataclass(frozen=True)
class Op:
    name: str
    build: Callable[[CoreInputs, NSAConfig], Built]
    """(inputs, config) -> (forward closure, the leaves of its backward)."""
    work: Callable[[kw.Shape, NSAConfig], tuple[kw.Work, kw.Work]] | None = None
    """(forward work, backward work) at a shape, where counted."""
    backward: bool = True
    """False: the op has no backward (top-n)."""


OPS: dict[str, Op] = {}


def register(name: str, work=None, backward: bool = True):
    def add(build):
        OPS[name] = Op(name, build, work, backward)
        return build
    return add


def _shape(x: CoreInputs) -> kw.Shape:
    return kw.Shape(*x.shape())


def _core_routes(x: CoreInputs, cmp: str) -> dict[str, Route]:
    routes = {s: Route(s, cmp if s in ("cmp", "select") else "triton", "bench") for s in ("cmp", "select", "sel")}
    routes["win"] = Route("win", "triton", "bench")
    return routes


def _kept(s: kw.Shape, cfg: NSAConfig) -> str:
    """What the selected dk/dv pass keeps for dq at the long contexts benchmarked."""
    from nsa.kernels.selection import _dq_source

    return _dq_source(s.K, cfg.sel_block)


def _core_work(s: kw.Shape, cfg: NSAConfig) -> tuple[kw.Work, kw.Work]:
    return kw.core_fwd(s, cfg), kw.core_bwd(s, cfg, _kept(s, cfg))


@register("nsa_core", work=_core_work)
def _nsa_core(x: CoreInputs, cfg: NSAConfig) -> Built:
    """The whole NSA core on the routes 'auto' takes on the GPU (cuDNN compressed branch for
    bf16/fp16, Triton elsewhere)."""
    routes = _core_routes(x, resolve_route("cmp", "auto", x.q.device, x.q.dtype).backend)
    return (lambda: nsa_core(*x.leaves()[:7], x.gates, cfg, routes)), x.leaves()


@register("nsa_core_triton", work=_core_work)
def _nsa_core_triton(x: CoreInputs, cfg: NSAConfig) -> Built:
    """The whole NSA core with every stage on Triton."""
    routes = _core_routes(x, "triton")
    return (lambda: nsa_core(*x.leaves()[:7], x.gates, cfg, routes)), x.leaves()


@register("sel", work=lambda s, cfg: (kw.sel_fwd(s, cfg), kw.sel_bwd(s, cfg, _kept(s, cfg))))
def _sel(x: CoreInputs, cfg: NSAConfig) -> Built:
    """The selected branch alone, on the top-n of these inputs (attn.sel_form: its forward)."""
    from nsa.attention.kernel_branches import triton_sel_attention

    idx = selection(x, cfg)
    return (lambda: triton_sel_attention(x.q, x.k_sel, x.v_sel, idx, cfg)), [x.q, x.k_sel, x.v_sel]


@register("topn", work=lambda s, cfg: (kw.topn(s, cfg), kw.Work(0, 0)), backward=False)
def _topn(x: CoreInputs, cfg: NSAConfig) -> Built:
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks

    with torch.no_grad():
        _, lse = triton_cmp_attention(x.q, x.kc, x.vc, cfg)
    return (lambda: triton_select_blocks(x.q, x.kc, lse, cfg)), []


@register("cmp", work=lambda s, cfg: (kw.cmp_fwd(s, cfg), kw.cmp_bwd(s, cfg)))
def _cmp(x: CoreInputs, cfg: NSAConfig) -> Built:
    from nsa.attention.kernel_branches import triton_cmp_attention

    return (lambda: triton_cmp_attention(x.q, x.kc, x.vc, cfg)[0]), [x.q, x.kc, x.vc]


@register("cmp_cudnn", work=lambda s, cfg: (kw.cmp_fwd(s, cfg), kw.cmp_bwd(s, cfg)))
def _cmp_cudnn(x: CoreInputs, cfg: NSAConfig) -> Built:
    from nsa.attention.kernel_branches import cudnn_cmp_attention

    return (lambda: cudnn_cmp_attention(x.q, x.kc, x.vc, cfg)[0]), [x.q, x.kc, x.vc]


@register("win", work=lambda s, cfg: (kw.win_fwd(s, cfg), kw.win_bwd(s, cfg)))
def _win(x: CoreInputs, cfg: NSAConfig) -> Built:
    from nsa.attention.kernel_branches import triton_win_attention

    return (lambda: triton_win_attention(x.q, x.k_win, x.v_win, cfg)), [x.q, x.k_win, x.v_win]


def _sdpa(kernel) -> Callable[[CoreInputs, NSAConfig], Built]:
    def build(x: CoreInputs, cfg: NSAConfig) -> Built:
        """Full causal attention over one k/v pair of the same heads: what a dense model runs."""
        from torch.nn.attention import sdpa_kernel

        q, k, v = (t.transpose(1, 2) for t in (x.q, x.k_sel, x.v_sel))

        def fwd():
            with sdpa_kernel(kernel):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        return fwd, [x.q, x.k_sel, x.v_sel]
    return build


def _register_sdpa() -> None:
    from torch.nn.attention import SDPBackend

    work = lambda s, cfg: (kw.causal_fwd(s), kw.causal_bwd(s))  # noqa: E731
    register("sdpa_cudnn", work=work)(_sdpa(SDPBackend.CUDNN_ATTENTION))
    register("sdpa_flash", work=work)(_sdpa(SDPBackend.FLASH_ATTENTION))


_register_sdpa()


@register("flex_window", work=lambda s, cfg: (kw.win_fwd(s, cfg), kw.win_bwd(s, cfg)))
def _flex_window(x: CoreInputs, cfg: NSAConfig) -> Built:
    """FlexAttention (compiled) with the window's sliding-window block mask."""
    from nsa.attention.kernel_branches import flex_win_attention

    return (lambda: flex_win_attention(x.q, x.k_win, x.v_win, cfg)), [x.q, x.k_win, x.v_win]


@register("fla_nsa")
def _fla_nsa(x: CoreInputs, cfg: NSAConfig) -> Built:
    """fla-core's parallel_nsa, compression + selection (window_size=0); it asserts a power-of-two
    group of at least 16 heads."""
    from fla.ops.nsa import parallel_nsa

    g_cmp, g_slc = (x.gates[..., i].detach().clone().requires_grad_() for i in (0, 1))
    return (lambda: parallel_nsa(x.q, x.k_sel, x.v_sel, g_cmp=g_cmp, g_slc=g_slc, block_counts=cfg.n_selected,
                                 block_size=cfg.sel_block, window_size=0)), [x.q, x.k_sel, x.v_sel, g_cmp, g_slc]
