"""nsa.kernels.rope: the one-kernel RoPE and split computes what apply_rope and the split of the
projections compute, forward and backward, and passes opcheck as a custom op."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.rope import apply_rope, rope_angles

pytestmark = pytest.mark.triton_interp


def _inputs(dev, dtype, B=2, T=37, HQ=6, H=2, P=3, K=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, K, generator=gen).to(dev, dtype)
    kv = torch.randn(B, T, 2 * P, H, K, generator=gen).to(dev, dtype)
    cos, sin = rope_angles(torch.arange(5, 5 + T), K, 10000.0)
    return q, kv, cos.to(dev, torch.float32), sin.to(dev, torch.float32)


def _reference(q, kv, cos, sin):
    """apply_rope on q and every key, the values as they are, split as kv_out is."""
    P2 = kv.shape[2]
    parts = [apply_rope(kv[:, :, j], cos, sin) if j % 2 == 0 else kv[:, :, j] for j in range(P2)]
    return apply_rope(q, cos, sin), torch.stack(parts)


@pytest.mark.parametrize("P,K", [(3, 16), (1, 64), (3, 24)], ids=["nsa-K16", "dense-K64", "nsa-K24"])
def test_rope_split_matches_apply_rope(kdev, P, K):
    from nsa.kernels.rope import rope_split

    q, kv, cos, sin = _inputs(kdev, torch.float32, P=P, K=K)
    q1, kv1 = (t.clone().requires_grad_() for t in (q, kv))
    q2, kv2 = (t.clone().requires_grad_() for t in (q, kv))
    got_q, got_kv = rope_split(q1, kv1, cos, sin)
    ref_q, ref_kv = _reference(q2, kv2, cos, sin)
    assert got_kv.shape == ref_kv.shape and all(got_kv[i].is_contiguous() for i in range(2 * P))
    torch.testing.assert_close(got_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_kv, ref_kv, rtol=1e-5, atol=1e-5)
    gq, gkv = torch.randn_like(got_q), torch.randn_like(got_kv)
    torch.autograd.backward((got_q, got_kv), (gq, gkv))
    torch.autograd.backward((ref_q, ref_kv), (gq, gkv))
    torch.testing.assert_close(q1.grad, q2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv1.grad, kv2.grad, rtol=1e-5, atol=1e-5)


def test_rope_split_passes_opcheck(kdev):
    from nsa.kernels.rope import rope_split_fwd

    q, kv, cos, sin = _inputs(kdev, torch.float32, T=9)
    torch.library.opcheck(rope_split_fwd, (q.requires_grad_(), kv.requires_grad_(), cos, sin))


def test_rope_split_reads_slices_of_one_projection_in_place(kdev):
    """q and kv as slices of one [B, T, N] projection output (as NSAAttention makes them) are read
    where they lie, with the outputs and gradients of contiguous copies, bit for bit."""
    from nsa.kernels.rope import _token_rows, rope_split

    q, kv, cos, sin = _inputs(kdev, torch.float32)
    B, T, HQ, K = q.shape
    P2, H = kv.shape[2], kv.shape[3]
    gates = torch.randn(B, T, 5, device=kdev)
    y = torch.cat([q.flatten(2), kv.flatten(2), gates], dim=-1).requires_grad_()
    q_view, kv_view, _ = y.split((HQ * K, P2 * H * K, 5), dim=-1)
    q_view, kv_view = q_view.view(B, T, HQ, K), kv_view.view(B, T, P2, H, K)
    assert _token_rows(q_view) is q_view and _token_rows(kv_view) is kv_view
    q1, kv1 = q.clone().requires_grad_(), kv.clone().requires_grad_()
    got_q, got_kv = rope_split(q_view, kv_view, cos, sin)
    ref_q, ref_kv = rope_split(q1, kv1, cos, sin)
    assert torch.equal(got_q, ref_q) and torch.equal(got_kv, ref_kv)
    gq, gkv = torch.randn_like(got_q), torch.randn_like(got_kv)
    torch.autograd.backward((got_q, got_kv), (gq, gkv))
    torch.autograd.backward((ref_q, ref_kv), (gq, gkv))
    assert torch.equal(y.grad, torch.cat([q1.grad.flatten(2), kv1.grad.flatten(2), torch.zeros_like(gates)], -1))


def test_rope_split_copies_tokens_that_are_not_evenly_spaced(kdev):
    """A batch whose tokens are not evenly spaced across its rows (the first T - 1 tokens of each
    sequence) is read from a copy, with the same outputs as from a contiguous tensor."""
    from nsa.kernels.rope import _token_rows, rope_split

    q, kv, cos, sin = _inputs(kdev, torch.float32)
    T = q.shape[1]
    q_part, kv_part = q[:, : T - 1], kv[:, : T - 1]
    assert _token_rows(q_part) is not q_part and _token_rows(kv_part) is not kv_part
    got = rope_split(q_part, kv_part, cos[: T - 1], sin[: T - 1])
    ref = rope_split(q_part.contiguous(), kv_part.contiguous(), cos[: T - 1], sin[: T - 1])
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def _projection(dev, HQ=6, H=2, P=3, K=16, G=18, pad=6, B=2, T=37, seed=1):
    """One projection's output [B, T, W] (query, key/value, gate-logit and unread columns) and a
    gate bias."""
    gen = torch.Generator().manual_seed(seed)
    prod = torch.randn(B, T, (HQ + 2 * P * H) * K + G + pad, generator=gen).to(dev)
    bias = torch.randn(G, generator=gen).to(dev)
    return prod, bias


@pytest.mark.parametrize("pad", [6, 0], ids=["padded", "unpadded"])
def test_project_split_is_rope_split_and_the_gates_and_its_gradient_is_one_tensor(kdev, pad):
    """project_split gives rope_split's q and streams of its slices and sigmoid(logits + bias),
    and the gradients of prod (the unread columns zero) and of the bias that the same ops in
    PyTorch give."""
    from nsa.kernels.rope import project_split, rope_split

    HQ, H, P, K, G = 6, 2, 3, 16, 18
    prod, bias = _projection(kdev, HQ, H, P, K, G, pad)
    _, _, cos, sin = _inputs(kdev, torch.float32, T=prod.shape[1])
    B, T, _ = prod.shape
    prod1, bias1 = prod.clone().requires_grad_(), bias.clone().requires_grad_()
    prod2, bias2 = prod.clone().requires_grad_(), bias.clone().requires_grad_()
    q, kv, gates = project_split(prod1, bias1, cos, sin, HQ, H, P, K)
    q_ref, kv_ref, logits, _ = prod2.split((HQ * K, 2 * P * H * K, G, pad), dim=-1)
    q_ref, kv_ref = rope_split(q_ref.reshape(B, T, HQ, K), kv_ref.reshape(B, T, 2 * P, H, K), cos, sin)
    gates_ref = torch.sigmoid(logits + bias2)
    assert len(kv) == 2 * P and all(t.is_contiguous() for t in kv)
    assert torch.equal(q, q_ref) and torch.equal(torch.stack(kv), kv_ref)
    torch.testing.assert_close(gates, gates_ref, rtol=1e-6, atol=1e-6)
    grads = [torch.randn_like(t) for t in (q, *kv, gates)]
    torch.autograd.backward((q, *kv, gates), grads)
    torch.autograd.backward((q_ref, *kv_ref.unbind(0), gates_ref), grads)
    torch.testing.assert_close(prod1.grad, prod2.grad, rtol=1e-5, atol=1e-6)
    assert not prod1.grad[..., prod.shape[-1] - pad:].any()
    torch.testing.assert_close(bias1.grad, bias2.grad, rtol=1e-5, atol=1e-5)


def test_project_split_passes_opcheck(kdev):
    from nsa.kernels.rope import project_split_fwd

    prod, bias = _projection(kdev, T=9)
    _, _, cos, sin = _inputs(kdev, torch.float32, T=9)
    torch.library.opcheck(project_split_fwd, (prod.requires_grad_(), bias.requires_grad_(), cos, sin, 6, 2, 3, 16))


@pytest.mark.parametrize("heads", [(4, 2, 16), (8, 2, 16)], ids=["padded", "unpadded"])
def test_layer_projections_through_the_kernel_match_pytorch(kdev, heads):
    """NSAAttention.project with the kernel (project_split) gives what its PyTorch path gives:
    q, the six streams (outputs of the kernel's autograd node itself), the gates, and the
    gradients of the input and every projection weight and bias."""
    from nsa.attention import NSAAttention
    from nsa.attention.config import NSAConfig

    torch.manual_seed(0)
    HQ, H, K = heads
    layer = NSAAttention(48, HQ, H, K, NSAConfig(), graph_tokens=0).to(kdev)
    torch.nn.init.normal_(layer.gate_proj.bias)
    x = torch.randn(2, 24, 48, device=kdev, requires_grad=True)
    leaves = [x, layer.q_proj.weight, layer.kv_proj.weight, layer.gate_proj.weight, layer.gate_proj.bias]
    outs = {}
    for fused in (True, False):
        q, kv, gates = layer.project(x, 3, fused_rope=fused)
        if fused:  # the eager path, not the custom op's (the gate bias is an nn.Parameter)
            assert type(q.grad_fn).__name__ == "ProjectSplitBackward"
            # the streams are the node's own outputs: no unbind whose backward stacks their gradients
            assert all(t.grad_fn is q.grad_fn for t in kv)
        flat = [q, *kv, gates]
        grads = torch.autograd.grad(flat, leaves, [torch.ones_like(t) * (i + 1) for i, t in enumerate(flat)])
        outs[fused] = (flat, grads)
    for got, want in zip(*([*outs[f][0], *outs[f][1]] for f in (True, False))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
