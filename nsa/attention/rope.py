"""Rotary position embedding, one implementation for q and every branch's k.

Pairs (x[2m], x[2m+1]) rotate by angle pos * theta^(-2m/K). The frequencies depend on the head
dim K only, so q and k always agree (a public NSA port once rotated them differently).
"""
from __future__ import annotations

import torch

from .autograd_state import unwrapped

#: the last few tables made by rope_tables, by (start, T, head dim, theta, device, dtype)
_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_TABLES_KEPT = 4


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, K/2] in float64 for the given absolute positions [T]; apply_rope
    casts them to the compute dtype (float32, or float64 for float64 inputs)."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    ang = positions.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, K]; cos/sin [T, K/2]. Computed in x's dtype (float64 stays float64)."""
    dtype = x.dtype if x.dtype == torch.float64 else torch.float32
    cos = cos.to(dtype)[None, :, None, :]
    sin = sin.to(dtype)[None, :, None, :]
    xf = x.to(dtype)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def table_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE computes in for inputs of ``dtype``, and so its tables' (apply_rope's rule)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_tables(start: int, T: int, head_dim: int, theta: float, device: torch.device,
                dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_angles of positions start..start+T-1 in ``dtype``, kept for the next calls with the
    same arguments in eager mode (an attention layer called without its model's tables would
    otherwise make and cast them again on every call, a handful of launches); made afresh while
    torch.compile traces."""
    if torch.compiler.is_compiling():
        cos, sin = rope_angles(torch.arange(start, start + T, device=device), head_dim, theta)
        return cos.to(dtype), sin.to(dtype)
    key = (start, T, head_dim, theta, torch.device(device), dtype)
    tables = _TABLES.get(key)
    if tables is None:
        with unwrapped():  # kept past a torch.func transform
            tables = tuple(t.to(dtype) for t in rope_angles(torch.arange(start, start + T, device=device), head_dim,
                                                             theta))
        while len(_TABLES) >= _TABLES_KEPT:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = tables
    return tables
