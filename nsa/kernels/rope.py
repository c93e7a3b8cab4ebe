"""RoPE on the projections of an attention layer and their split into per-branch tensors, as one
differentiable op (nsa::rope_split_fwd / nsa::rope_split_bwd): one kernel forward, one backward.

In PyTorch the same work is a dozen elementwise kernels per rotated tensor (casts, the even/odd
products, the stack), each forward saving float32 copies for its backward, and a copy per
branch tensor the attention kernels want contiguous. Here one pass reads the query projection
and the key/value projection once and writes the rotated queries and every branch's keys
(rotated) and values as contiguous tensors; the backward applies the inverse rotation in one
pass and writes the gradients of both projections. Nothing is saved but the angle tables (and
project_split's gates and bias).

Pairs (x[2m], x[2m+1]) rotate by the angle of cos/sin[t, m] (nsa.attention.rope.apply_rope's
convention), computed in float32 and rounded to the input's dtype.

project_split takes one stacked projection's output [B, T, W] (q's columns, the pairs', the gates'
logits, padding) and makes the gates, sigmoid(logits + bias), in the same kernel. Its streams
are separate outputs, so their gradients reach its backward as they are (one stacked output would
have autograd stack them first), and its backward writes the gradient of that projection output
as one tensor, so the stacked matmul's backward takes it as it is (no concatenation of the
parts' gradients, no zeros for the padding).

Shapes: q [B, T, HQ, K]; kv [B, T, 2P, H, K], the P (key, value) pairs in order (key of pair 0,
its value, key of pair 1, ...), each read in place where a token's values are contiguous and
tokens evenly spaced (q and kv as slices of one projection's output), else from a copy; cos, sin
[T, K/2] float32. Outputs: q rotated [B, T, HQ, K] and kv_out [2P, B, T, H, K] (each kv_out[i]
contiguous; keys rotated, values copied).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl

from ._autograd import _eager_function, run_op


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
def _gate_rows(g_in, saved, g_out, tok, tmask, bias, g_in_stride, g_out_stride, PACK: tl.constexpr,
               NG: tl.constexpr, PAD: tl.constexpr, BG: tl.constexpr):
    """The gates of BT tokens: forward, sigmoid(logits + bias) of the logits g_in (a token's NG
    values g_in_stride apart) -> g_out (NG a token); backward (PACK), the gradient of the
    logits dg * g * (1 - g) of the gates' gradient g_in and the saved gates -> g_out (a token's
    g_out_stride apart), with the PAD columns after them (the projection's zero rows) zeroed."""
    c = tl.arange(0, BG)
    at = tok.to(tl.int64)[:, None]
    mask = tmask[:, None] & (c[None, :] < NG)
    x = tl.load(g_in + at * g_in_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
    if PACK:
        g = tl.load(saved + at * NG + c[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.where(c[None, :] < NG, x * g * (1.0 - g), 0.0)
        tl.store(g_out + at * g_out_stride + c[None, :], y.to(g_out.dtype.element_ty),
                 mask=tmask[:, None] & (c[None, :] < NG + PAD))
    else:
        b = tl.load(bias + c, mask=c < NG, other=0.0).to(tl.float32)
        y = tl.sigmoid(x + b[None, :])
        tl.store(g_out + at * g_out_stride + c[None, :], y.to(g_out.dtype.element_ty), mask=mask)


@triton.jit
def _stream(s0, s1, s2, s3, s4, s5, j):
    """The j-th of the split streams' pointers (j < 6, a runtime value)."""
    p = s0
    if j == 1:
        p = s1
    elif j == 2:
        p = s2
    elif j == 3:
        p = s3
    elif j == 4:
        p = s4
    elif j == 5:
        p = s5
    return p


@triton.jit
def _rope_split_kernel(q_in, q_out, packed, s0, s1, s2, s3, s4, s5, cos, sin, g_in, g_saved, g_out, bias, n_tokens,
                       T, sign, q_in_stride, q_out_stride, kv_packed_stride, g_in_stride, g_out_stride,
                       HQ: tl.constexpr, H: tl.constexpr, P: tl.constexpr, HALF: tl.constexpr, BH: tl.constexpr,
                       BT: tl.constexpr, PACK: tl.constexpr, NG: tl.constexpr, PAD: tl.constexpr,
                       BG: tl.constexpr):
    """BT tokens of one row a program: row r < HQ is query head r, row HQ + j * H + h is head h of
    kv stream j (keys on even j, rotated; values on odd j, copied), and with NG gates the last
    row is the gates' (_gate_rows). The 2P split streams are each their own tensor [.., H, K]
    (s0 .. s5, the unused ones any valid pointer). Forward (PACK False): q_in and the packed
    kv as the projections make them -> q_out and the split streams. Backward (PACK True, sign -1:
    the inverse rotation): the gradients q_in (of q_out) and the split streams' -> q_out and the
    packed kv. A token's rows in q_in, q_out and the packed kv are q_in_stride, q_out_stride and
    kv_packed_stride elements apart (slices of one projection's output, or contiguous), a split
    stream's H * K."""
    K: tl.constexpr = 2 * HALF
    tok = tl.program_id(0) * BT + tl.arange(0, BT)
    row = tl.program_id(1)
    tmask = tok < n_tokens
    if row == HQ + 2 * P * H:  # only in a grid with the gates' row (NG > 0)
        _gate_rows(g_in, g_saved, g_out, tok, tmask, bias, g_in_stride, g_out_stride, PACK, NG, PAD, BG)
    else:
        m = tl.arange(0, BH)
        t = tok % T
        tab = t.to(tl.int64)[:, None] * HALF + m[None, :]
        tmask2 = tmask[:, None] & (m[None, :] < HALF)
        c = tl.load(cos + tab, mask=tmask2, other=1.0)
        s = tl.load(sin + tab, mask=tmask2, other=0.0) * sign
        if row < HQ:
            _rotate_rows(q_in + row * K, q_out + row * K, tok, tmask, c, s, q_in_stride, q_out_stride, True, HALF, BH)
        else:
            j = (row - HQ) // H
            h = (row - HQ) % H
            at_packed = packed + (j * H + h) * K
            at_split = _stream(s0, s1, s2, s3, s4, s5, j) + h * K
            if PACK:
                _rotate_rows(at_split, at_packed, tok, tmask, c, s, H * K, kv_packed_stride, j % 2 == 0, HALF, BH)
            else:
                _rotate_rows(at_packed, at_split, tok, tmask, c, s, kv_packed_stride, H * K, j % 2 == 0, HALF, BH)


@dataclass(frozen=True)
class _Gates:
    """The gate columns of a launch: logits (forward) or the gates' gradient (backward) in
    ``src``, a token's values ``src_stride`` apart; the saved gates (backward); the output,
    ``dst_stride`` a token, followed by ``pad`` zeroed columns (backward); the bias (forward)."""
    src: torch.Tensor
    dst: torch.Tensor
    src_stride: int
    dst_stride: int
    bias: torch.Tensor | None = None
    saved: torch.Tensor | None = None
    pad: int = 0


#: the most (key, value) pairs a launch splits (the kernel's stream pointers s0 .. s5)
MAX_PAIRS = 3


def _launch(q_in, q_out, packed, streams: Sequence[torch.Tensor], cos, sin, HQ: int, H: int, K: int, pack: bool,
            q_in_stride: int, q_out_stride: int, kv_packed_stride: int, gates: _Gates | None = None):
    """The kernel over q, the packed kv and the 2P split ``streams`` (each contiguous [B, T, H, K]):
    forward (pack False) from q_in and packed to q_out and the streams, backward the other way."""
    n_tokens, T = q_in.shape[0] * q_in.shape[1], cos.shape[0]
    if n_tokens == 0:
        return
    P = len(streams) // 2
    if not 0 < P <= MAX_PAIRS:
        raise ValueError(f"rope: {len(streams)} key/value streams; expected 2 to {2 * MAX_PAIRS}")
    half = K // 2
    BH = triton.next_power_of_2(half)
    BT = max(1, min(64, 2048 // BH))
    NG = gates.src.shape[-1] if gates is not None else 0
    g = gates or _Gates(q_in, q_in, 0, 0)  # valid pointers the kernel does not read
    split = [*streams, *(streams[0],) * (2 * MAX_PAIRS - len(streams))]
    _rope_split_kernel[(triton.cdiv(n_tokens, BT), HQ + 2 * P * H + (NG > 0))](
        q_in, q_out, packed, *split, cos, sin, g.src, g.saved if g.saved is not None else g.src, g.dst,
        g.bias if g.bias is not None else g.src, n_tokens, T, -1.0 if pack else 1.0, q_in_stride, q_out_stride,
        kv_packed_stride, g.src_stride, g.dst_stride, HQ=HQ, H=H, P=P, HALF=half, BH=BH, BT=BT, PACK=pack, NG=NG,
        PAD=g.pad, BG=triton.next_power_of_2(max(1, NG + g.pad)), num_warps=4)


def _token_rows(t: torch.Tensor) -> torch.Tensor:
    """t [B, T, ...] laid out as the kernel reads it: each token's values contiguous, tokens
    evenly spaced (a slice of a projection's output along its last dim is); else a copy."""
    inner = t[0, 0] if t.shape[0] and t.shape[1] else t
    if inner.is_contiguous() and (t.shape[0] == 1 or t.stride(0) == t.shape[1] * t.stride(1)):
        return t
    return t.contiguous()


def _fwd(q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, HQ, K = q.shape
    P, H = kv.shape[2] // 2, kv.shape[3]
    q, kv = _token_rows(q), _token_rows(kv)
    q_out = q.new_empty(q.shape)
    kv_out = kv.new_empty(2 * P, B, T, H, K)
    _launch(q, q_out, kv, kv_out.unbind(0), cos, sin, HQ, H, K, pack=False, q_in_stride=q.stride(1),
            q_out_stride=HQ * K, kv_packed_stride=kv.stride(1))
    return q_out, kv_out


def _bwd(cos: torch.Tensor, sin: torch.Tensor, dq: torch.Tensor, dkv: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, HQ, K = dq.shape
    P2, H = dkv.shape[0], dkv.shape[3]
    dq_in = dq.new_empty(dq.shape)
    dkv_in = dkv.new_empty(B, T, P2, H, K)
    _launch(dq, dq_in, dkv_in, dkv.unbind(0), cos, sin, HQ, H, K, pack=True, q_in_stride=HQ * K,
            q_out_stride=HQ * K, kv_packed_stride=P2 * H * K)
    return dq_in, dkv_in


rope_split_fwd = torch.library.custom_op("nsa::rope_split_fwd", _fwd, mutates_args=())
rope_split_bwd = torch.library.custom_op("nsa::rope_split_bwd", _bwd, mutates_args=())


@rope_split_fwd.register_fake
def _(q, kv, cos, sin):
    B, T, P2, H, K = kv.shape
    return q.new_empty(q.shape), kv.new_empty(P2, B, T, H, K)


@rope_split_bwd.register_fake
def _(cos, sin, dq, dkv):
    P2, B, T, H, K = dkv.shape
    return dq.new_empty(dq.shape), dkv.new_empty(B, T, P2, H, K)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[2], inputs[3])


def _backward(ctx, dq, dkv):
    cos, sin = ctx.saved_tensors
    dq_in, dkv_in = run_op(rope_split_bwd, _bwd, cos, sin, dq.contiguous(), dkv.contiguous())
    return dq_in, dkv_in, None, None


rope_split_fwd.register_autograd(_backward, setup_context=_setup_context)


_Eager = _eager_function("RopeSplit", _fwd, _setup_context, _backward)


def rope_split(q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, HQ, K] rotated, and kv [B, T, 2P, H, K] ((key, value) pairs) split into
    [2P, B, T, H, K] with the keys rotated (see the module docstring); cos, sin [T, K/2] (cast
    to float32). Under torch.compile it runs as the custom op nsa::rope_split_fwd."""
    if q.shape[-1] % 2 or kv.shape[2] % 2:
        raise ValueError(f"rope_split: head dim {q.shape[-1]} must be even and kv {tuple(kv.shape)} must hold "
                         "(key, value) pairs on dim 2")
    args = (q, kv, cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous())
    return run_op(rope_split_fwd, _Eager.apply, *args)


#: project_split's (key, value) pairs: NSA's three branches (its op returns them as separate tensors,
#: a fixed number of outputs)
PROJECT_PAIRS = 3


def _project_fwd(prod: torch.Tensor, bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, HQ: int, H: int,
                 P: int, K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, W = prod.shape
    G, qw, kvw = bias.shape[0], HQ * K, 2 * P * H * K
    prod = _token_rows(prod)
    q_out = prod.new_empty(B, T, HQ, K)
    # each stream its own tensor: their gradients come back to the backward as they are, where
    # one stacked output would have autograd stack the streams' gradients first
    streams = [prod.new_empty(B, T, H, K) for _ in range(2 * P)]
    gates = prod.new_empty(B, T, G)
    _launch(prod, q_out, prod[..., qw:], streams, cos, sin, HQ, H, K, pack=False, q_in_stride=prod.stride(1),
            q_out_stride=qw, kv_packed_stride=prod.stride(1),
            gates=_Gates(prod[..., qw + kvw:qw + kvw + G], gates, prod.stride(1), G, bias=bias))
    return q_out, *streams, gates


def _project_bwd(cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, gates: torch.Tensor, dq: torch.Tensor,
                 dstreams: list[torch.Tensor], dgates: torch.Tensor, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, HQ, K = dq.shape
    H, G = dstreams[0].shape[2], gates.shape[-1]
    qw, kvw = HQ * K, len(dstreams) * H * K
    d_prod = dq.new_empty(B, T, W)
    _launch(dq, d_prod, d_prod[..., qw:], dstreams, cos, sin, HQ, H, K, pack=True, q_in_stride=qw,
            q_out_stride=W, kv_packed_stride=W,
            gates=_Gates(dgates, d_prod[..., qw + kvw:], G, W, saved=gates, pad=W - qw - kvw - G))
    d_bias = d_prod[..., qw + kvw:qw + kvw + G].sum((0, 1), dtype=torch.float32).to(bias.dtype)
    return d_prod, d_bias


project_split_fwd = torch.library.custom_op("nsa::project_split_fwd", _project_fwd, mutates_args=())
project_split_bwd = torch.library.custom_op("nsa::project_split_bwd", _project_bwd, mutates_args=())


@project_split_fwd.register_fake
def _(prod, bias, cos, sin, HQ, H, P, K):
    B, T, _ = prod.shape
    return (prod.new_empty(B, T, HQ, K), *(prod.new_empty(B, T, H, K) for _ in range(2 * P)),
            prod.new_empty(B, T, bias.shape[0]))


@project_split_bwd.register_fake
def _(cos, sin, bias, gates, dq, dstreams, dgates, W):
    B, T = dq.shape[:2]
    return dq.new_empty(B, T, W), bias.new_empty(bias.shape)


def _project_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[2], inputs[3], inputs[1], output[-1])
    ctx.width = inputs[0].shape[-1]


def _project_backward(ctx, dq, *grads):
    cos, sin, bias, gates = ctx.saved_tensors
    *dstreams, dgates = grads
    d_prod, d_bias = run_op(project_split_bwd, _project_bwd, cos, sin, bias, gates, dq.contiguous(),
                            [d.contiguous() for d in dstreams], dgates.contiguous(), ctx.width)
    return d_prod, d_bias, None, None, None, None, None, None


project_split_fwd.register_autograd(_project_backward, setup_context=_project_setup_context)
_EagerProject = _eager_function("ProjectSplit", _project_fwd, _project_setup_context, _project_backward)


def project_split(prod: torch.Tensor, bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, HQ: int, H: int,
                  P: int, K: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """rope_split of the query and key/value columns of one projection's output prod [B, T, W]
    (HQ * K query columns, then P (key, value) pairs of H * K columns each, then the G gate
    logits of bias [G], then columns nothing reads), and gates = sigmoid(logits + bias) [B, T, G] in
    prod's dtype, in the same kernel: q [B, T, HQ, K], the 2P streams (key of pair 0, its value,
    ...) as separate tensors [B, T, H, K], the gates. Its backward takes each stream's gradient as
    it comes and writes the gradient of prod as one tensor (the unread columns zero), so the
    projection's matmul takes it without a concatenation, and the bias's gradient, summed over
    the tokens in float32. Under torch.compile it runs as the custom op nsa::project_split_fwd."""
    G = bias.shape[0]
    if K % 2 or prod.shape[-1] < (HQ + 2 * P * H) * K + G:
        raise ValueError(f"project_split: head dim {K} must be even and prod's {prod.shape[-1]} columns must hold "
                         f"{HQ} query heads, {P} (key, value) pairs of {H} heads and {G} gate logits")
    if P != PROJECT_PAIRS:
        raise ValueError(f"project_split: {P} (key, value) pairs; it splits NSA's {PROJECT_PAIRS}")
    args = (prod, bias, cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous(), HQ, H, P, K)
    q, *streams, gates = run_op(project_split_fwd, _EagerProject.apply, *args)
    return q, tuple(streams), gates
