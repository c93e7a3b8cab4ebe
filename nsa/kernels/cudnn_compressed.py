"""The compressed branch through cuDNN's fused attention (the kernel behind torch SDPA's cuDNN
backend), for long prefill.

Query t sees the compressed tokens i < nvis(t) = floor((t + 1 - l) / d) + 1 (none before
t = l - 1). nvis is constant on runs of d consecutive queries: run r = 0, 1, ... holds queries
l-1 + r*d .. l-2 + (r+1)*d and sees tokens 0..r. Folding the d queries of a run into the batch
dimension turns the branch into ordinary top-left causal attention of R runs over R compressed
tokens, which cuDNN runs at full speed. For one sequence the fold is a strided view of q (no
copy); the compressed keys and values are shared by the d folded queries through a zero stride
(and by the G query heads of a KV group through a copy, G times the size of kc).

What cuDNN does not cover goes through the Triton band kernel (band_attention): deterministic
runs, the partial run at the end (< d queries), decode and chunked prefill (q_start > 0), runs shorter
than CUDNN_MIN_QUERIES or queries of fewer than CUDNN_MIN_ELEMENTS elements, head dims above 128,
and calls that torch.compile traces (the fold's per-sequence autograd graphs are not a custom op,
so a compiled model takes the band kernel and stays one graph, fullgraph=True included). Queries before l - 1 get o = 0 and lse = -inf.
"""
from __future__ import annotations

import torch

from . import CUDNN_MIN_ELEMENTS, CUDNN_MIN_QUERIES
from .band_attention import band_attention

#: head dims cuDNN's fused attention takes
MAX_HEAD_DIM = 128


def _fold_kv(x: torch.Tensor, G: int, d: int) -> torch.Tensor:
    """x [R, H, K] (one sequence) -> [d, H*G, R, K]: each KV head repeated for its G query
    heads (a copy), then shared by the d folded queries through a zero batch stride (cuDNN
    gives the same outputs and gradients as for d copies, bit for bit)."""
    R, H, K = x.shape
    per_head = x.permute(1, 0, 2).unsqueeze(1).expand(H, G, R, K).reshape(H * G, R, K)
    return per_head.unsqueeze(0).expand(d, H * G, R, K)


def _fused_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Top-left causal attention, [batch, heads, R, K] each: cuDNN's fused kernel through torch's
    private op, the only public route that also returns the log-sum-exp (the selection scores
    need it). Differentiable: autograd runs cuDNN's fused backward."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
    return out[0], out[1]


def _causal_runs(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, d: int):
    """One sequence: q [R*d, HQ, K] (R whole runs), kc/vc [R, H, K]. Returns o [R*d, HQ, K]
    and lse [R*d, HQ]."""
    T, HQ, K = q.shape
    R, H = kc.shape[0], kc.shape[1]
    # [R, d, HQ, K] -> [d, HQ, R, K]: the d queries of a run become the batch (a view)
    qf = q.reshape(R, d, HQ, K).permute(1, 2, 0, 3)
    kf, vf = _fold_kv(kc, HQ // H, d), _fold_kv(vc, HQ // H, d)
    o, lse = _fused_causal(qf, kf, vf, K ** -0.5)
    o = o.permute(2, 0, 1, 3).reshape(T, HQ, K)  # a view when cuDNN kept q's layout
    lse = lse.reshape(d, HQ, R).permute(2, 0, 1).reshape(T, HQ)
    return o, lse.float()


def cudnn_cmp_attention(q, kc, vc, q_start: int, l: int, d: int, deterministic: bool = False):
    """q [B, Tq, HQ, K] at positions q_start..; kc, vc [B, Nc, H, K], compressed token i
    covering [i*d, i*d + l). Returns o [B, Tq, HQ, K] and lse [B, Tq, HQ] (float32, natural
    log, no gradient), as band_attention(q, kc, vc, q_start, l, d, 0, False) does.
    deterministic: the band kernel's fixed-order backward throughout (this code does not
    vouch for the summation order of cuDNN's fused backward)."""
    B, Tq, HQ, K = q.shape
    first = l - 1  # the first query that sees a compressed token
    runs = max(0, (Tq - first) // d)
    if (deterministic or q_start != 0 or Tq < CUDNN_MIN_QUERIES or Tq * HQ * K < CUDNN_MIN_ELEMENTS
            or K > MAX_HEAD_DIM or runs == 0 or torch.compiler.is_compiling()):
        return band_attention(q, kc, vc, q_start, l, d, 0, False, deterministic)
    return _folded_prefill(q, kc, vc, l, d, runs)


class _FoldedPrefill(torch.autograd.Function):
    """The folded prefill as one autograd node: o and lse are written into tensors of the whole
    sequence, and the backward writes dq into one tensor. (Through plain autograd, the slices
    q[b, l-1:end] and q[:, end:] each gave a full-size zero gradient to fill, copy into and add.)
    Inside, each piece (one sequence's runs through cuDNN; the tail through the band kernel)
    keeps its own autograd graph on detached leaves, which the backward runs."""

    @staticmethod
    def forward(ctx, q, kc, vc, l: int, d: int, runs: int, keep_graph: bool):
        B, Tq, HQ, K = q.shape
        first = l - 1
        end = first + runs * d
        o = q.new_empty(q.shape)
        lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
        o[:, :first] = 0
        lse[:, :first] = float("-inf")
        pieces = []  # (a piece's output, its leaves, the index of its part of q and of kc/vc)
        with torch.set_grad_enabled(keep_graph):
            for b in range(B):
                where = ((b, slice(first, end)), (b, slice(0, runs)))
                leaves = [t.detach().requires_grad_(keep_graph) for t in (q[where[0]], kc[where[1]], vc[where[1]])]
                o_runs, lse_runs = _causal_runs(*leaves, d)
                o[where[0]] = o_runs.detach()
                lse[where[0]] = lse_runs.detach()
                pieces.append((o_runs, leaves, where))
            if end < Tq:  # the partial last run: fewer than d queries, through the band kernel
                where = ((slice(None), slice(end, Tq)), (slice(None),))
                leaves = [t.detach().requires_grad_(keep_graph) for t in (q[where[0]], kc, vc)]
                o_tail, lse_tail = band_attention(*leaves, end, l, d, 0, False)
                o[where[0]] = o_tail.detach()
                lse[where[0]] = lse_tail
                pieces.append((o_tail, leaves, where))
        ctx.pieces = pieces if keep_graph else None
        ctx.first = first
        ctx.shapes = (q.shape, kc.shape, kc.dtype)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q_shape, kc_shape, kc_dtype = ctx.shapes
        dq = do.new_empty(q_shape)
        dq[:, :ctx.first] = 0
        dkc, dvc = (do.new_zeros(kc_shape, dtype=kc_dtype) for _ in range(2))
        for o_piece, leaves, (q_at, kc_at) in ctx.pieces:
            gq, gk, gv = torch.autograd.grad(o_piece, leaves, do[q_at], allow_unused=True)
            dq[q_at] = 0 if gq is None else gq
            for acc, g in ((dkc, gk), (dvc, gv)):
                if g is not None:  # None: no query of the piece saw a compressed token
                    acc[kc_at] += g
        ctx.pieces = None
        return dq, dkc, dvc, None, None, None, None


# Inductor fails to lower this function's views around the cuDNN op (InductorError CantSplit), so
# it is never traced: cudnn_cmp_attention sends traced calls to the band kernel
@torch.compiler.disable
def _folded_prefill(q, kc, vc, l: int, d: int, runs: int):
    keep_graph = torch.is_grad_enabled() and any(t.requires_grad for t in (q, kc, vc))
    return _FoldedPrefill.apply(q, kc, vc, l, d, runs, keep_graph)
