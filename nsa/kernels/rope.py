"""RoPE on the projections of an attention layer and their split into per-branch tensors, as one
differentiable op (nsa::rope_split_fwd / nsa::rope_split_bwd): one kernel forward, one backward.

In PyTorch the same work is a dozen elementwise kernels per rotated tensor (casts, the even/odd
products, the stack), each forward saving float32 copies for its backward, a copy per branch
tensor the attention kernels want contiguous, and, in the backward, a concatenation of the
query's and the keys' and values' gradients into the gradient of the one projection that made
them. Here one pass reads the projection's output once and writes the rotated queries and every
branch's keys (rotated) and values as contiguous tensors; the backward applies the inverse
rotation in one pass and writes the projection's gradient whole. Nothing is saved but the angle
tables, read as the caller keeps them (float64 from nsa.attention.rope, shared by every layer):
no float32 copy is made per call.

Pairs (x[2m], x[2m+1]) rotate by the angle of cos/sin[t, m] (nsa.attention.rope.apply_rope's
convention), computed in float32 (the tables rounded to float32 as they are read) and rounded to
the input's dtype.

Shapes: qkv [B, T, (HQ + 2P H) K], each token's row the HQ query heads, then the P (key, value)
pairs in order (key of pair 0, its value, key of pair 1, ...) of H heads each, read in place where
a token's values are contiguous and tokens evenly spaced (a projection's output, or a slice of one
along its last dim), else from a copy; cos, sin [T, K/2] of any float dtype. Outputs: q rotated
[B, T, HQ, K] and kv [2P, B, T, H, K] (each kv[i] contiguous; keys rotated, values copied).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autograd import run_op


@triton.jit
def _rotate_rows(src, dst, rows, rmask, c, s, src_stride, dst_stride, rotate, HALF: tl.constexpr,
                 BH: tl.constexpr):
    """Rows ``rows`` of src (row r at src + r * src_stride, K = 2 HALF values) to dst, the pairs
    rotated by (c, s) [BT, BH] where ``rotate``, else copied (through float32, so exactly). A row
    is read and written whole, [BT, 2 BH] (wide contiguous accesses), and split into its pairs
    in registers."""
    k = tl.arange(0, 2 * BH)
    mask = rmask[:, None] & (k[None, :] < 2 * HALF)
    at = rows.to(tl.int64)[:, None]
    x = tl.load(src + at * src_stride + k[None, :], mask=mask, other=0.0).to(tl.float32)
    x1, x2 = tl.split(tl.reshape(x, [rows.shape[0], BH, 2]))
    y = tl.where(rotate, tl.reshape(tl.join(x1 * c - x2 * s, x1 * s + x2 * c), [rows.shape[0], 2 * BH]), x)
    tl.store(dst + at * dst_stride + k[None, :], y.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_split_kernel(q_in, kv_in, cos, sin, q_out, kv_out, n_tokens, T, sign, q_in_stride, q_out_stride,
                       kv_packed_stride, HQ: tl.constexpr, H: tl.constexpr, P: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr,
                       BT: tl.constexpr, PACK: tl.constexpr):
    """BT tokens of one row a program: row r < HQ is query head r, row HQ + j * H + h is head h of
    kv stream j (keys on even j, rotated; values on odd j, copied). Forward (PACK False): q_in,
    kv_in packed as the projections make them -> q_out and the split kv_out. Backward (PACK True,
    sign -1: the inverse rotation): the gradients q_in (of q_out) and kv_in (split, as kv_out) ->
    q_out and kv_out packed. A token's rows in q_in and the packed kv are q_in_stride and
    kv_packed_stride elements apart (slices of one projection's output), the split kv's and q_out's
    H * K and HQ * K."""
    K: tl.constexpr = 2 * HALF
    tok = tl.program_id(0) * BT + tl.arange(0, BT)
    row = tl.program_id(1)
    tmask = tok < n_tokens
    m = tl.arange(0, BH)
    t = tok % T
    tab = t.to(tl.int64)[:, None] * HALF + m[None, :]
    tmask2 = tmask[:, None] & (m[None, :] < HALF)
    c = tl.load(cos + tab, mask=tmask2, other=1.0).to(tl.float32)
    s = tl.load(sin + tab, mask=tmask2, other=0.0).to(tl.float32) * sign
    if row < HQ:
        _rotate_rows(q_in + row * K, q_out + row * K, tok, tmask, c, s, q_in_stride, q_out_stride, True, HALF,
                     BH)
    else:
        j = (row - HQ) // H
        h = (row - HQ) % H
        packed = (j * H + h) * K
        split = j.to(tl.int64) * n_tokens * (H * K) + h * K
        if PACK:
            _rotate_rows(kv_in + split, kv_out + packed, tok, tmask, c, s, H * K, kv_packed_stride,
                         j % 2 == 0, HALF, BH)
        else:
            _rotate_rows(kv_in + packed, kv_out + split, tok, tmask, c, s, kv_packed_stride, H * K,
                         j % 2 == 0, HALF, BH)


def _launch(q_in, kv_in, cos, sin, q_out, kv_out, n_tokens: int, HQ: int, H: int, P: int, K: int, pack: bool,
            q_in_stride: int, q_out_stride: int, kv_packed_stride: int):
    T = cos.shape[0]
    if n_tokens == 0:
        return
    half = K // 2
    BH = triton.next_power_of_2(half)
    BT = max(1, min(64, 2048 // BH))
    _rope_split_kernel[(triton.cdiv(n_tokens, BT), HQ + 2 * P * H)](
        q_in, kv_in, cos, sin, q_out, kv_out, n_tokens, T, -1.0 if pack else 1.0, q_in_stride, q_out_stride,
        kv_packed_stride, HQ=HQ, H=H, P=P, HALF=half, BH=BH, BT=BT, PACK=pack, num_warps=4)


def _token_rows(t: torch.Tensor) -> torch.Tensor:
    """t [B, T, N] laid out as the kernel reads it: each token's values contiguous, tokens
    evenly spaced (a projection's output is, and so is a slice of one along its last dim); else
    a copy."""
    if t.stride(2) == 1 and (t.shape[0] <= 1 or t.stride(0) == t.shape[1] * t.stride(1)):
        return t
    return t.contiguous()


def _streams(N: int, n_heads: int, n_kv: int, head_dim: int) -> int:
    """P, the (key, value) pairs in a token's row of N values."""
    P2, rest = divmod(N // head_dim - n_heads, n_kv)
    if N % head_dim or rest or P2 <= 0 or P2 % 2:
        raise ValueError(f"rope_split: a token's row of {N} values is not {n_heads} query heads and (key, value) "
                         f"pairs of {n_kv} heads of {head_dim}")
    return P2 // 2


def _fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int, head_dim: int
         ) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, N = qkv.shape
    HQ, H, K = n_heads, n_kv, head_dim
    P = _streams(N, HQ, H, K)
    qkv = _token_rows(qkv)
    q_out = qkv.new_empty(B, T, HQ, K)
    kv_out = qkv.new_empty(2 * P, B, T, H, K)
    _launch(qkv, qkv[..., HQ * K:], cos, sin, q_out, kv_out, B * T, HQ, H, P, K, pack=False,
            q_in_stride=qkv.stride(1), q_out_stride=HQ * K, kv_packed_stride=qkv.stride(1))
    return q_out, kv_out


def _bwd(cos: torch.Tensor, sin: torch.Tensor, dq: torch.Tensor, dkv: torch.Tensor) -> torch.Tensor:
    B, T, HQ, K = dq.shape
    P2, H = dkv.shape[0], dkv.shape[3]
    N = (HQ + P2 * H) * K
    dqkv = dq.new_empty(B, T, N)
    _launch(dq, dkv, cos, sin, dqkv, dqkv[..., HQ * K:], B * T, HQ, H, P2 // 2, K, pack=True, q_in_stride=HQ * K,
            q_out_stride=N, kv_packed_stride=N)
    return dqkv


rope_split_fwd = torch.library.custom_op("nsa::rope_split_fwd", _fwd, mutates_args=())
rope_split_bwd = torch.library.custom_op("nsa::rope_split_bwd", _bwd, mutates_args=())


@rope_split_fwd.register_fake
def _(qkv, cos, sin, n_heads, n_kv, head_dim):
    B, T, N = qkv.shape  # N may be symbolic: rope_split checked it
    P2 = (N // head_dim - n_heads) // n_kv
    return qkv.new_empty(B, T, n_heads, head_dim), qkv.new_empty(P2, B, T, n_kv, head_dim)


@rope_split_bwd.register_fake
def _(cos, sin, dq, dkv):
    B, T, HQ, K = dq.shape
    return dq.new_empty(B, T, (HQ + dkv.shape[0] * dkv.shape[3]) * K)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])


def _backward(ctx, dq, dkv):
    cos, sin = ctx.saved_tensors
    dqkv = run_op(rope_split_bwd, _bwd, cos, sin, dq.contiguous(), dkv.contiguous())
    return dqkv, None, None, None, None, None


rope_split_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The op's forward and backward without the dispatcher's custom-op path (eager calls, as
    nsa.kernels._autograd's pairs)."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_heads, n_kv, head_dim):
        out = _fwd(qkv, cos, sin, n_heads, n_kv, head_dim)
        _setup_context(ctx, (qkv, cos, sin), out)
        return out

    @staticmethod
    def backward(ctx, dq, dkv):
        return _backward(ctx, dq, dkv)


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int, head_dim: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, HQ, K] rotated, and the (key, value) pairs of qkv [B, T, (HQ + 2P H) K] split into
    kv [2P, B, T, H, K] with the keys rotated (see the module docstring); cos, sin [T, K/2]. Its
    gradient is the projection's, whole. Under torch.compile it runs as the custom op
    nsa::rope_split_fwd."""
    if head_dim % 2:
        raise ValueError(f"rope_split: head dim {head_dim} must be even")
    _streams(qkv.shape[-1], n_heads, n_kv, head_dim)
    args = (qkv, cos.contiguous(), sin.contiguous(), int(n_heads), int(n_kv), int(head_dim))
    return run_op(rope_split_fwd, _Eager.apply, *args)
