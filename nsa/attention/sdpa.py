"""Dense causal attention through PyTorch's scaled_dot_product_attention, in the layout of the
NSA stages: q [B, Tq, HQ, K] at positions q_start.., k and v [B, Tk, H, K] of positions
0..Tk-1, HQ a multiple of H (grouped-query heads). The backend of the 'dense' stage
(nsa.attention.backends) picks which of SDPA's kernels runs: torch's own choice, cuDNN's fused
attention or flash attention.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from nsa.kernels import CUDNN_MAX_HEAD_DIM


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int = 0,
                     kernel: SDPBackend | None = None) -> torch.Tensor:
    """Query t (absolute position q_start + t) attends to keys 0..q_start + t. Returns
    o [B, Tq, HQ, K]. ``kernel``: the one SDPA kernel to run a whole-sequence prefill with
    (None: torch's choice); a continuation (q_start > 0: decode, chunked prefill) needs an
    explicit mask, which not every kernel takes, so it always runs on torch's choice."""
    Tq, Tk = q.shape[1], k.shape[1]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    gqa = q.shape[2] != k.shape[2]
    if q_start == 0 and Tq == Tk:
        with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    else:
        # is_causal aligns the first query with the first key; here query t sees keys up to
        # q_start + t (the error the design notes warn of: a decode query seeing key 0 alone)
        pos = torch.arange(q_start, q_start + Tq, device=q.device)
        mask = torch.arange(Tk, device=q.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    return o.transpose(1, 2)


def torch_dense_attention(q, k, v, q_start: int = 0):
    """Causal attention on the SDPA kernel torch picks (its priority order and the enabled flags)."""
    return causal_attention(q, k, v, q_start)


def cudnn_dense_attention(q, k, v, q_start: int = 0):
    """Causal attention on cuDNN's fused attention (CUDA, bf16/fp16) up to head dim 128; on
    torch's choice of kernel above."""
    kernel = SDPBackend.CUDNN_ATTENTION if q.shape[-1] <= CUDNN_MAX_HEAD_DIM else None
    return causal_attention(q, k, v, q_start, kernel)


def flash_dense_attention(q, k, v, q_start: int = 0):
    """Causal attention on SDPA's flash attention kernel (CUDA, bf16/fp16)."""
    return causal_attention(q, k, v, q_start, SDPBackend.FLASH_ATTENTION)
