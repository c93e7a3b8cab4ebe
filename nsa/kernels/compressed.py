"""Triton compressed attention (the NSA cmp branch) with its log-sum-exp.

Compressed token i summarises positions [i*d, i*d + l) and is visible to query position t only
when i*d + l - 1 <= t; a query that sees none gets a zero output and lse = -inf. The kernels
are the band-attention kernels of nsa.kernels.band_attention with hi(t) = floor((t+1-l)/d).
"""
from __future__ import annotations

from nsa.attention.config import NSAConfig

from .band_attention import band_attention


def triton_cmp_attention(q, kc, vc, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """q [B, Tq, HQ, K]; kc, vc [B, Nc, H, K]. Returns o [B, Tq, HQ, K] and lse [B, Tq, HQ]
    (float32; lse carries no gradient). Same signature and semantics as
    nsa.attention.torch_branches.torch_cmp_attention; `chunk` is unused."""
    return band_attention(q, kc, vc, q_start, cfg.cmp_block, cfg.cmp_stride, 0, False)
