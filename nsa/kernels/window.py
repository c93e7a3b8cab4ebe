"""The NSA window branch (query at position p attends to keys (p - W, p]) on library kernels:
FlexAttention with a sliding-window block mask (CUDA), or flash-attn's local attention when it
is installed. (The Triton window kernel is band_attention with WINDOW=True.)

Shapes: q [B, Tq, HQ, K] at positions q_start .. q_start + Tq - 1; k, v [B, Tk, H, K] of
positions 0 .. Tk - 1 (later keys ignored). Both return o [B, Tq, HQ, K].
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _window_block_mask(Tq: int, Tk: int, q_start: int, W: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def sliding(b, h, q_idx, kv_idx):
        p = q_idx + q_start
        return (kv_idx <= p) & (kv_idx > p - W)

    return create_block_mask(sliding, B=None, H=None, Q_LEN=Tq, KV_LEN=Tk, device=device)


def flex_window_attention(q, k, v, q_start: int, W: int):
    Tq, Tk = q.shape[1], k.shape[1]
    mask = _window_block_mask(Tq, Tk, int(q_start), W, str(q.device))
    o = _compiled_flex()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         block_mask=mask, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def flash_attn_window_attention(q, k, v, q_start: int, W: int):
    from flash_attn import flash_attn_func

    # flash-attn aligns the last query with the last key: keep the keys up to the last query
    end = q_start + q.shape[1]
    return flash_attn_func(q, k[:, :end], v[:, :end], causal=True, window_size=(W - 1, 0))
