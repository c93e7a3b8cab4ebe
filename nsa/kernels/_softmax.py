"""The online-softmax pieces every attention kernel here shares, and the one log-sum-exp
convention: in device memory a row's log-sum-exp is in natural log (lse = log sum_j exp(s_j),
-inf for a row that sees no key), as PyTorch and cuDNN return it and the NSA stages pass it on;
inside a kernel scores are scaled by log2(e) so that exp2 (one instruction) replaces exp, and
``lse_log2`` / ``finish`` are the only places that convert between the two.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
"""log2(e): scores times LOG2E turn exp into exp2."""
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
"""ln(2) = 1 / log2(e): a base-2 log-sum-exp times LN2 is the natural one."""


@triton.jit
def lse_log2(lse):
    """A natural-log lse as loaded -> base 2; -inf (the row sees nothing) -> 0, so that
    exp2(s - lse2) stays finite for the masked lanes that are discarded anyway."""
    lse2 = lse * LOG2E
    return tl.where(lse2 == float("-inf"), 0.0, lse2)


@triton.jit
def online_step(acc, m_i, l_i, s, vt, MASKED: tl.constexpr, DOT: tl.constexpr):
    """Add one tile of base-2 scores s [rows, keys] (-inf where not visible) and its values
    vt [keys, BK] to the running maximum m_i, sum l_i and output acc. MASKED: a row may see
    none of this tile's keys nor any before (its maximum is still -inf). DOT: the products'
    input_precision (nsa.kernels._launch.dot_precision)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=DOT)
    return acc, m_new, l_i


@triton.jit
def finish(acc, m_i, l_i):
    """The normalised output [rows, BK] and the natural-log lse [rows] (-inf and a zero output
    for a row that saw no key)."""
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    return out, lse


@triton.jit
def score_grad(p, dot_, vt, dl, DOT: tl.constexpr):
    """dS = P * (dO V^T - delta), the softmax backward of one tile (p: probabilities, zero where
    not visible; dot_: dO rows; dl: delta = rowsum(dO * O))."""
    dp = tl.dot(dot_, tl.trans(vt), input_precision=DOT)
    return p * (dp - dl[:, None])


@triton.jit
def dq_rows(do, o, lse, delta, offs, mask, l_off, rmask, DELTA_GIVEN: tl.constexpr):
    """What a dq kernel reads per query row: the dO rows [rows, BK] at offs, delta =
    rowsum(dO * O) in float32 and the row's log-sum-exp in base 2. delta is computed here and
    stored at delta + l_off for the dk/dv pass, or, DELTA_GIVEN, loaded from there (o unread)."""
    dot_ = tl.load(do + offs, mask=mask, other=0.0)
    if DELTA_GIVEN:
        dl = tl.load(delta + l_off, mask=rmask, other=0.0)
    else:
        ot = tl.load(o + offs, mask=mask, other=0.0)
        dl = tl.sum(dot_.to(tl.float32) * ot.to(tl.float32), 1)
        tl.store(delta + l_off, dl, mask=rmask)
    return dot_, dl, lse_log2(tl.load(lse + l_off, mask=rmask, other=0.0))
