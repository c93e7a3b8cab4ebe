"""The compressed branch through cuDNN's fused attention (the kernel behind torch SDPA's cuDNN
backend), for long prefill.

Query t sees the compressed tokens i < nvis(t) = floor((t + 1 - l) / d) + 1 (none before
t = l - 1). nvis is constant on runs of d consecutive queries: run r = 0, 1, ... holds queries
l-1 + r*d .. l-2 + (r+1)*d and sees tokens 0..r. Folding the d queries of a run into the batch
dimension turns the branch into ordinary top-left causal attention of R runs over R compressed
tokens, which cuDNN runs at full speed. For one sequence the fold is a strided view of q (no
copy); the compressed keys and values are shared by the d folded queries through a zero stride
(and by the G query heads of a KV group through a copy, G times the size of kc).

The fold is the custom-op pair nsa::cmp_fold_fwd / nsa::cmp_fold_bwd (nsa.kernels._autograd), so
a compiled model runs it as one opaque call, fullgraph=True included. Its backward makes cuDNN's
state again from the lse it returns (cuDNN's per-run lse is the same values, folded), so nothing of
the fold but o and lse outlives the forward.

What cuDNN does not cover goes through the Triton band kernel (band_attention): deterministic
runs, the partial run at the end (< d queries, inside the same op), decode and chunked prefill
(q_start > 0), runs shorter than CUDNN_MIN_QUERIES or queries of fewer than CUDNN_MIN_ELEMENTS
elements, and head dims above 128. Queries before l - 1 get o = 0 and lse = -inf.
"""
from __future__ import annotations

import torch

from . import cudnn_folds
from ._autograd import kernel_op
from .band_attention import band_attention, band_backward, band_forward
from .tuning import BAND, BandTiles


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
    need it). Returns o and lse (float32, batch x heads x R elements)."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
    return out[0], out[1]


def _fused_causal_backward(do, q, k, v, o, state, scale: float):
    """dq, dk, dv of _fused_causal, from its o and state (_state): cuDNN's fused backward."""
    lse, cum_q, cum_k, max_q, max_k, seed, offset = state
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, True, scale=scale)


def _state(lse_runs: torch.Tensor, d: int) -> tuple:
    """_fused_causal's state for one sequence, made from its lse in this module's layout
    ([runs * d, HQ], natural log): cuDNN's lse ([d, HQ, runs, 1], the same values), no
    cumulative lengths (one dense batch) and, without dropout, a zero seed and offset."""
    T, HQ = lse_runs.shape
    runs = T // d
    folded = lse_runs.reshape(runs, d, HQ).permute(1, 2, 0).contiguous().unsqueeze(-1)
    zero = torch.zeros((), dtype=torch.int64, device=lse_runs.device)
    return folded, None, None, runs, runs, zero, zero


def cudnn_cmp_attention(q, kc, vc, q_start: int, l: int, d: int, deterministic: bool = False,
                        tiles: BandTiles = BAND):
    """q [B, Tq, HQ, K] at positions q_start..; kc, vc [B, Nc, H, K], compressed token i
    covering [i*d, i*d + l). Returns o [B, Tq, HQ, K] and lse [B, Tq, HQ] (float32, natural
    log, no gradient), as band_attention(q, kc, vc, q_start, l, d, 0, False) does.
    deterministic: the band kernel's fixed-order backward throughout (this code does not
    vouch for the summation order of cuDNN's fused backward). tiles: the band kernel's launches
    where it runs instead (nsa.kernels.tuning.BandTiles)."""
    B, Tq, HQ, K = q.shape
    if not cudnn_folds(Tq, HQ, K, l, d, q_start, deterministic):
        return band_attention(q, kc, vc, q_start, l, d, 0, False, deterministic, tiles)
    return fold_op(q.contiguous(), kc.contiguous(), vc.contiguous(), int(l), int(d))


def _geometry(Tq: int, l: int, d: int) -> tuple[int, int, int]:
    """The first query that sees a compressed token, the end of the whole runs, their count
    (negative when no query sees one)."""
    first = l - 1
    runs = (Tq - first) // d
    return first, first + runs * d, runs


def _fold_forward(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, l: int, d: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """nsa::cmp_fold_fwd: o and lse of the whole sequence; the whole runs through cuDNN, one
    sequence a call, the partial last run through the band kernel."""
    B, Tq, HQ, K = q.shape
    G = HQ // kc.shape[2]
    first, end, runs = _geometry(Tq, l, d)
    o = q.new_empty(q.shape)
    lse = torch.empty(B, Tq, HQ, device=q.device, dtype=torch.float32)
    o[:, :first] = 0
    lse[:, :first] = float("-inf")
    for b in range(B):
        o_runs, lse_runs = _fused_causal(
            _fold_q(q[b, first:end], d), _fold_kv(kc[b, :runs], G, d), _fold_kv(vc[b, :runs], G, d), K ** -0.5)
        _fold_q(o[b, first:end], d).copy_(o_runs)
        lse[b, first:end] = lse_runs.reshape(d, HQ, runs).permute(2, 0, 1).reshape(-1, HQ)
    if end < Tq:
        o[:, end:], lse[:, end:] = band_forward(q[:, end:].contiguous(), kc, vc, end, l, d, 0, False)
    return o, lse


def _fold_backward(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   do: torch.Tensor, l: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """nsa::cmp_fold_bwd: dq, dkc, dvc; cuDNN's backward on views of q, o and do, the band
    kernel's on the partial last run."""
    B, Tq, HQ, K = q.shape
    H = kc.shape[2]
    G = HQ // H
    first, end, runs = _geometry(Tq, l, d)
    do = do.contiguous()
    dq = do.new_empty(q.shape)
    dq[:, :first] = 0
    dkc, dvc = torch.zeros_like(kc), torch.zeros_like(vc)
    run = slice(first, end)
    for b in range(B):
        gq, gk, gv = _fused_causal_backward(
            _fold_q(do[b, run], d), _fold_q(q[b, run], d), _fold_kv(kc[b, :runs], G, d),
            _fold_kv(vc[b, :runs], G, d), _fold_q(o[b, run], d), _state(lse[b, run], d), K ** -0.5)
        _fold_q(dq[b, run], d).copy_(gq)
        dkc[b, :runs] += _unfold_kv_grad(gk, H)
        dvc[b, :runs] += _unfold_kv_grad(gv, H)
    if end < Tq:
        q_t, o_t, lse_t, do_t = (t[:, end:].contiguous() for t in (q, o, lse, do))
        dq[:, end:], gk, gv = band_backward(q_t, kc, vc, o_t, lse_t, do_t, end, l, d, 0, False, False)
        dkc += gk
        dvc += gv
    return dq, dkc, dvc


def _fold_fake(q, kc, vc, *args):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


#: the custom ops nsa::cmp_fold_fwd / nsa::cmp_fold_bwd (see nsa.kernels._autograd)
fold_op = kernel_op("cmp_fold", _fold_forward, _fold_backward, _fold_fake, tensors=3, grads=3)
