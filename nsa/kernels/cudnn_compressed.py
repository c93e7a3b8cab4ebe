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


def _fold_q(x: torch.Tensor, d: int) -> torch.Tensor:
    """x [R*d, HQ, K] (one sequence's whole runs) -> [d, HQ, R, K]: the d queries of a run become
    the batch (a view of a contiguous x)."""
    T, HQ, K = x.shape
    return x.reshape(T // d, d, HQ, K).permute(1, 2, 0, 3)


def _unfold_kv_grad(g: torch.Tensor, H: int) -> torch.Tensor:
    """The gradient [d, H*G, R, K] of _fold_kv's output -> that of its input [R, H, K]."""
    d, HQ, R, K = g.shape
    return g.sum(0).view(H, HQ // H, R, K).sum(1).permute(1, 0, 2)


def _fused_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Top-left causal attention, [batch, heads, R, K] each: cuDNN's fused kernel through torch's
    private op, the only public route that also returns the log-sum-exp (the selection scores
    need it). Returns o, lse (float32, batch x heads x R elements) and the state
    _fused_causal_backward takes with o."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
    return out[0], out[1], out[1:8]


def _fused_causal_backward(do, q, k, v, o, state, scale: float):
    """dq, dk, dv of _fused_causal, from its o and state: cuDNN's fused backward."""
    lse, cum_q, cum_k, max_q, max_k, seed, offset = state
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, True, scale=scale)


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
    sequence, and the backward writes dq into one tensor. The backward calls cuDNN's backward on
    views of the saved q and of o itself, so nothing of the fold outlives the forward but
    cuDNN's per-run lse: cuDNN's own output (o's size again) and the folded compressed keys
    (recomputed) are not kept. The partial last run keeps its own autograd graph through the
    band kernel, on detached leaves."""

    @staticmethod
    def forward(ctx, q, kc, vc, l: int, d: int, runs: int, keep_graph: bool):
        B, Tq, HQ, K = q.shape
        G = HQ // kc.shape[2]
        first = l - 1
        end = first + runs * d
        o = q.new_empty(q.shape)
        lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
        o[:, :first] = 0
        lse[:, :first] = float("-inf")
        states = []
        for b in range(B):
            o_runs, lse_runs, state = _fused_causal(
                _fold_q(q[b, first:end], d), _fold_kv(kc[b, :runs], G, d), _fold_kv(vc[b, :runs], G, d), K ** -0.5)
            _fold_q(o[b, first:end], d).copy_(o_runs)
            lse[b, first:end] = lse_runs.reshape(d, HQ, runs).permute(2, 0, 1).reshape(-1, HQ)
            states.append(state)
        tail = None
        if end < Tq:  # the partial last run: fewer than d queries, through the band kernel
            with torch.set_grad_enabled(keep_graph):
                # q's few tail rows as a copy: a view would keep all of q's memory past the
                # forward (its caller may free q and make it again for the backward)
                leaves = [t.detach().requires_grad_(keep_graph) for t in (q[:, end:].clone(), kc, vc)]
                o_tail, lse_tail = band_attention(*leaves, end, l, d, 0, False)
            o[:, end:] = o_tail.detach()
            lse[:, end:] = lse_tail
            tail = (o_tail, leaves)
        if keep_graph:
            ctx.save_for_backward(q, kc, vc, o)
            ctx.states, ctx.tail = states, tail
        ctx.geometry = (first, end, runs, d)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, kc, vc, o = ctx.saved_tensors
        first, end, runs, d = ctx.geometry
        H = kc.shape[2]
        G = q.shape[2] // H
        dq = do.new_empty(q.shape)
        dq[:, :first] = 0
        dkc, dvc = torch.zeros_like(kc), torch.zeros_like(vc)
        run = slice(first, end)
        for b, state in enumerate(ctx.states):
            gq, gk, gv = _fused_causal_backward(
                _fold_q(do[b, run], d), _fold_q(q[b, run], d), _fold_kv(kc[b, :runs], G, d),
                _fold_kv(vc[b, :runs], G, d), _fold_q(o[b, run], d), state, q.shape[-1] ** -0.5)
            _fold_q(dq[b, run], d).copy_(gq)
            dkc[b, :runs] += _unfold_kv_grad(gk, H)
            dvc[b, :runs] += _unfold_kv_grad(gv, H)
        if ctx.tail is not None:
            o_tail, leaves = ctx.tail
            gq, gk, gv = torch.autograd.grad(o_tail, leaves, do[:, end:], allow_unused=True)
            dq[:, end:] = 0 if gq is None else gq
            for acc, g in ((dkc, gk), (dvc, gv)):
                if g is not None:  # None: no query of the tail saw a compressed token
                    acc += g
        ctx.states = ctx.tail = None
        return dq, dkc, dvc, None, None, None, None


# Inductor fails to lower this function's views around the cuDNN op (InductorError CantSplit), so
# it is never traced: cudnn_cmp_attention sends traced calls to the band kernel
@torch.compiler.disable
def _folded_prefill(q, kc, vc, l: int, d: int, runs: int):
    keep_graph = torch.is_grad_enabled() and any(t.requires_grad for t in (q, kc, vc))
    return _FoldedPrefill.apply(q, kc, vc, l, d, runs, keep_graph)
