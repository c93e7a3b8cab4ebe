"""nsa.kernels.rope: the one-kernel RoPE and split computes what apply_rope and the split of the
projections compute, forward and backward, and passes opcheck as a custom op."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.rope import apply_rope, rope_angles

pytestmark = pytest.mark.triton_interp


def _inputs(dev, dtype, B=2, T=37, HQ=6, H=2, P=3, K=16, seed=0):
    """qkv [B, T, (HQ + 2P H) K] as a projection makes it, and the float64 tables of nsa.attention.rope."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, (HQ + 2 * P * H) * K, generator=gen).to(dev, dtype)
    cos, sin = rope_angles(torch.arange(5, 5 + T), K, 10000.0)
    return qkv, cos.to(dev), sin.to(dev), (HQ, H, K)


def _reference(qkv, cos, sin, HQ, H, K):
    """apply_rope on q and every key, the values as they are, split as the op's kv is."""
    B, T, _ = qkv.shape
    q, kv = qkv.split((HQ * K, qkv.shape[-1] - HQ * K), dim=-1)
    kv = kv.view(B, T, -1, H, K)
    parts = [apply_rope(kv[:, :, j], cos, sin) if j % 2 == 0 else kv[:, :, j] for j in range(kv.shape[2])]
    return apply_rope(q.view(B, T, HQ, K), cos, sin), torch.stack(parts)


@pytest.mark.parametrize("P,K", [(3, 16), (1, 64), (3, 24)], ids=["nsa-K16", "dense-K64", "nsa-K24"])
def test_rope_split_matches_apply_rope(kdev, P, K):
    """Outputs and the projection's gradient against apply_rope and autograd's split, with the
    float64 tables read as they are (rounded to float32 in the kernel, as apply_rope casts them)."""
    from nsa.kernels.rope import rope_split

    qkv, cos, sin, heads = _inputs(kdev, torch.float32, P=P, K=K)
    assert cos.dtype == torch.float64
    x1, x2 = qkv.clone().requires_grad_(), qkv.clone().requires_grad_()
    got_q, got_kv = rope_split(x1, cos, sin, *heads)
    ref_q, ref_kv = _reference(x2, cos, sin, *heads)
    assert got_kv.shape == ref_kv.shape and all(got_kv[i].is_contiguous() for i in range(2 * P))
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_kv, ref_kv, rtol=1e-5, atol=1e-5)
    gq, gkv = torch.randn_like(got_q), torch.randn_like(got_kv)
    torch.autograd.backward((got_q, *got_kv.unbind(0)), (gq, *gkv.unbind(0)))
    torch.autograd.backward((ref_q, ref_kv), (gq, gkv))
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)


def test_rope_split_reads_float64_and_float32_tables_alike(kdev):
    """The kernel rounds float64 tables to float32 as it reads them: the same bits as tables cast
    by the caller."""
    from nsa.kernels.rope import rope_split

    qkv, cos, sin, heads = _inputs(kdev, torch.float32)
    got = rope_split(qkv, cos, sin, *heads)
    ref = rope_split(qkv, cos.float(), sin.float(), *heads)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def test_rope_split_passes_opcheck(kdev):
    from nsa.kernels.rope import rope_split_fwd

    qkv, cos, sin, heads = _inputs(kdev, torch.float32, T=9)
    torch.library.opcheck(rope_split_fwd, (qkv.requires_grad_(), cos, sin, *heads))


def test_rope_split_reads_a_slice_of_one_projection_in_place(kdev):
    """qkv as a slice of a wider [B, T, N] projection output (a gate projection's columns beside
    it) is read where it lies, with the outputs and gradient of a contiguous copy, bit for bit."""
    from nsa.kernels.rope import _token_rows, rope_split

    qkv, cos, sin, heads = _inputs(kdev, torch.float32)
    B, T, N = qkv.shape
    gates = torch.randn(B, T, 5, device=kdev)
    y = torch.cat([qkv, gates], dim=-1).requires_grad_()
    view = y[..., :N]
    assert _token_rows(view) is view
    x1 = qkv.clone().requires_grad_()
    got_q, got_kv = rope_split(view, cos, sin, *heads)
    ref_q, ref_kv = rope_split(x1, cos, sin, *heads)
    assert torch.equal(got_q, ref_q) and torch.equal(got_kv, ref_kv)
    gq, gkv = torch.randn_like(got_q), torch.randn_like(got_kv)
    torch.autograd.backward((got_q, got_kv), (gq, gkv))
    torch.autograd.backward((ref_q, ref_kv), (gq, gkv))
    assert torch.equal(y.grad, torch.cat([x1.grad, torch.zeros_like(gates)], -1))


def test_rope_split_copies_tokens_that_are_not_evenly_spaced(kdev):
    """A batch whose tokens are not evenly spaced across its rows (the first T - 1 tokens of each
    sequence) is read from a copy, with the same outputs as from a contiguous tensor."""
    from nsa.kernels.rope import _token_rows, rope_split

    qkv, cos, sin, heads = _inputs(kdev, torch.float32)
    T = qkv.shape[1]
    part = qkv[:, : T - 1]
    assert _token_rows(part) is not part
    got = rope_split(part, cos[: T - 1], sin[: T - 1], *heads)
    ref = rope_split(part.contiguous(), cos[: T - 1], sin[: T - 1], *heads)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def test_rope_split_names_a_row_that_is_not_heads_and_pairs(kdev):
    from nsa.kernels.rope import rope_split

    qkv, cos, sin, _ = _inputs(kdev, torch.float32)
    with pytest.raises(ValueError, match="not 6 query heads and \\(key, value\\) pairs of 4 heads of 16"):
        rope_split(qkv, cos, sin, 6, 4, 16)
