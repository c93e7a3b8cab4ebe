"""The compressors' MLP as one autograd node (nsa.attention.phi_mlp.one_node), as an eager NSA layer runs
it: the outputs of the traced MLP, bit for bit, and its gradients up to rounding, for every
stream and parameter, at whole and partial chunks and from a later block; and one node in the
graph where the traced MLP records dozens."""
from __future__ import annotations

import pytest
import torch

from nsa.attention import compress
from nsa.attention.config import NSAConfig


def _compressors(cfg: NSAConfig, K: int, dtype: torch.dtype):
    torch.manual_seed(0)
    comps = [compress.Compressor(K, cfg).to(dtype) for _ in range(2)]
    for c in comps:
        with torch.no_grad():
            c.pos.normal_()
            c.fc1.bias.normal_()
            c.fc2.bias.normal_()
    return comps


def _run(comps, xs, first, one_node, autocast=False):
    leaves = [*xs, *(p for c in comps for p in c.parameters())]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = compress.compress(comps, xs, first, one_node=one_node)
    gen = torch.Generator().manual_seed(1)
    dy = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in out]
    return out, torch.autograd.grad(out, leaves, dy)


@pytest.mark.parametrize("cmp_block, cmp_stride, T, first",
                         [(8, 4, 70, 0), (8, 4, 64, 1), (12, 4, 41, 0), (4, 4, 9, 0), (32, 16, 100, 2)])
def test_one_node_is_the_traced_mlp(cmp_block, cmp_stride, T, first):
    cfg = NSAConfig(cmp_block=cmp_block, cmp_stride=cmp_stride)
    comps = _compressors(cfg, 8, torch.float64)
    xs = [torch.randn(2, T, 3, 8, dtype=torch.float64, requires_grad=True) for _ in comps]
    out, grads = _run(comps, xs, first, one_node=True)
    want, want_grads = _run(comps, xs, first, one_node=False)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_one_node_under_autocast_keeps_the_traced_rounding():
    """bf16 autocast (parameters float32): the same outputs, and gradients within bf16 rounding,
    in the parameters' dtype."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = _compressors(cfg, 16, torch.float32)
    xs = [torch.randn(1, 64, 2, 16, dtype=torch.bfloat16, requires_grad=True) for _ in comps]
    out, grads = _run(comps, xs, 0, one_node=True, autocast=True)
    want, want_grads = _run(comps, xs, 0, one_node=False, autocast=True)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    for g, w in zip(grads, want_grads):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert (g.float() - w.float()).norm() <= 1e-2 * w.float().norm()


def test_one_node_records_one_node():
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = _compressors(cfg, 8, torch.float32)
    xs = [torch.randn(1, 40, 2, 8, requires_grad=True) for _ in comps]
    kc, vc = compress.compress(comps, xs, one_node=True)
    assert kc.grad_fn is vc.grad_fn and type(kc.grad_fn).__name__ == "_PhiMLPBackward"


@pytest.mark.parametrize("one_node", [True, False], ids=["one node", "traced"])
def test_float16_streams_under_bfloat16_autocast(one_node):
    """Streams of another 16-bit dtype than autocast's are taken in autocast's (a stack of them
    under autocast was an error), and their gradient comes back in their own."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = _compressors(cfg, 16, torch.float32)
    xs = [torch.randn(1, 64, 2, 16, dtype=torch.float16, requires_grad=True) for _ in comps]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compress.compress(comps, xs, one_node=one_node)
    assert all(t.dtype == torch.bfloat16 for t in out)
    grads = torch.autograd.grad(out, xs, [torch.ones_like(t) for t in out])
    assert all(g.dtype == torch.float16 and g.shape == x.shape for g, x in zip(grads, xs))


def test_double_backward_is_refused_by_name_and_runs_under_torch_func():
    """A gradient penalty through an eager layer (a backward with create_graph=True) meets the
    one-node MLP, whose backward writes its buffers through out= and has no derivative of its own:
    refused with what to do instead, not failed inside. Under torch.func the MLP runs op by op: the penalty's gradient there matches
    its finite difference in float64."""
    from torch.func import grad

    from nsa.attention import NSAAttention, NSAConfig

    torch.manual_seed(0)
    layer = NSAAttention(8, 2, 1, 4, NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4),
                         graph_tokens=0).double()
    x = torch.randn(1, 13, 8, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="no double backward .* under torch.func"):
        torch.autograd.grad(layer(xg).square().sum(), xg, create_graph=True)

    def penalty(x):
        return grad(lambda x: layer(x).square().sum())(x).square().sum()

    direction = torch.randn_like(x)
    eps = 1e-6
    numeric = (penalty(x + eps * direction) - penalty(x - eps * direction)) / (2 * eps)
    torch.testing.assert_close((grad(penalty)(x) * direction).sum(), numeric, rtol=1e-6, atol=1e-8)


def test_a_second_order_gradient_under_torch_func_runs_again_on_the_next_call():
    """The layer's first call under nested torch.func transforms kept what it made for later calls
    (the zero rows padding its stacked weights, its RoPE tables), wrapped for the transform's
    level: the next penalty's gradient failed inside functorch ('escaped?'). A fresh layer and a
    RoPE theta no other test uses, so that both are made under the transform here."""
    from torch.func import functional_call, grad

    from nsa.attention import NSAAttention, NSAConfig

    torch.manual_seed(0)
    layer = NSAAttention(8, 2, 1, 4, NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4),
                         rope_theta=12345.0, graph_tokens=0)
    x = torch.randn(2, 11, 8)

    def penalty(x):
        return grad(lambda x: layer(x).square().sum())(x).square().sum()

    first = grad(penalty)(x)
    torch.testing.assert_close(grad(penalty)(x), first, rtol=0, atol=0)
    params = dict(layer.named_parameters())

    def inner_step(params, x):  # one MAML-style step of the parameters, differentiated through
        g = grad(lambda p: functional_call(layer, p, (x,)).square().mean())(params)
        return functional_call(layer, {k: v - 0.1 * g[k] for k, v in params.items()}, (x,)).square().mean()

    meta = [grad(inner_step)(params, x) for _ in range(2)]
    torch.testing.assert_close(meta[1], meta[0], rtol=0, atol=0)
