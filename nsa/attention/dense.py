"""DenseAttention: causal attention over every earlier token, of the same shape as NSAAttention
(query heads, KV heads, head dim, RoPE), the baseline NSA is measured against (attn.kind=dense).

A LLaMA-style GQA attention: one query projection, one fused key/value projection, RoPE on q
and k, SDPA on the route of the 'dense' stage (attn.backend_dense; cuDNN's fused attention on
CUDA for bf16/fp16 by default), an output projection. It has the interface the model and the
trainer use of NSAAttention (rope, resolve_routes, routes, calls and count_calls, last_gate_mean, the decode
cache), so the same model, trainer and contract run either kind.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .autograd_state import count_call
from .backends import Route, implementation, resolve_route, rope_kernel
from .config import NSAConfig
from .module import NSACache, RoutedAttention, autocast_input
from .rope import apply_rope, table_dtype


class DenseAttention(RoutedAttention):
    def __init__(self, dim: int, n_heads: int, n_kv_groups: int, head_dim: int,
                 cfg: NSAConfig, rope_theta: float = 10000.0):
        super().__init__(dim, n_heads, n_kv_groups, head_dim, cfg, rope_theta, kv_streams=2)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.track_gates = False  # no gates: nothing to track
        self.last_gate_mean = None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.o_proj.reset_parameters()

    def _routes_for(self, device: torch.device, dtype: torch.dtype) -> tuple[dict[str, Route], bool]:
        routes = {"dense": resolve_route("dense", self.cfg.backend_dense, device, dtype)}
        return routes, dtype != torch.float64 and rope_kernel(device, dtype)

    def forward(self, x: torch.Tensor, cache: NSACache | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]; with a cache, x holds the positions after the cached
        ones and the cache is extended in place (see NSAAttention.forward)."""
        self.check_input(x, cache, rope)
        B, T, _ = x.shape
        H, HQ, K = self.n_kv, self.n_heads, self.head_dim
        start = cache.length if cache is not None else 0
        x = autocast_input(x)
        cos, sin = rope if rope is not None else self.rope(start, T, x.device, table_dtype(x.dtype))
        q = self.q_proj(x).view(B, T, HQ, K)
        kv = self.kv_proj(x).view(B, T, 2, H, K)
        routes, fused_rope = self._resolve(x.device, q.dtype)
        if fused_rope:  # the same RoPE kernel as NSAAttention's
            from nsa.kernels.rope import rope_split

            q, kv = rope_split(q, kv, cos, sin)
            k, v = kv.unbind(0)
        else:
            q = apply_rope(q, cos, sin)
            k, v = kv.unbind(2)
            k = apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append("k", k), cache.append("v", v)
            cache.length += T
        if self.count_calls:
            count_call(self.calls)
        o = implementation(routes["dense"])(q, k, v, start)
        return self.o_proj(o.reshape(B, T, -1))
