"""The compressors' MLP where its Triton kernels cannot run (the CPU without TRITON_INTERPRET=1):
an eager layer's one-node request runs the traced MLP, and under torch.func the layer's MLP runs
op by op, second-order gradients included. The node on the kernels: tests/kernels/test_phi_mlp.py."""
from __future__ import annotations

import pytest
import torch

from nsa.attention import compress
from nsa.attention.config import NSAConfig


def compressors(cfg: NSAConfig, K: int, G: int = 2, dtype: torch.dtype = torch.float32, device="cpu"):
    """G compressors of head dim K, their position embedding and biases drawn too (not zero)."""
    torch.manual_seed(0)
    comps = [compress.Compressor(K, cfg).to(device, dtype) for _ in range(G)]
    for c in comps:
        with torch.no_grad():
            c.pos.normal_()
            c.fc1.bias.normal_()
            c.fc2.bias.normal_()
    return comps


def test_without_the_kernels_one_node_runs_the_traced_mlp(monkeypatch):
    """No node of its own: the traced MLP's outputs and gradients, bit for bit."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the kernels run here")
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 8)
    xs = [torch.randn(1, 41, 2, 8, requires_grad=True) for _ in comps]
    leaves = [*xs, *(p for c in comps for p in c.parameters())]
    runs = []
    for one_node in (True, False):
        out = compress.compress(comps, xs, 1, one_node=one_node)
        runs.append((out, torch.autograd.grad(out, leaves, [torch.ones_like(t) for t in out])))
        assert type(out[0].grad_fn).__name__ != "_PhiMLPBackward"
    for got, want in zip([*runs[0][0], *runs[0][1]], [*runs[1][0], *runs[1][1]]):
        assert torch.equal(got, want)


def test_float16_streams_under_bfloat16_autocast():
    """Streams of another 16-bit dtype than autocast's are taken in autocast's (a stack of them
    under autocast was an error), and their gradient comes back in their own (the kernels' node:
    tests/kernels/test_phi_mlp.py)."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 16)
    xs = [torch.randn(1, 64, 2, 16, dtype=torch.float16, requires_grad=True) for _ in comps]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compress.compress(comps, xs)
    assert all(t.dtype == torch.bfloat16 for t in out)
    grads = torch.autograd.grad(out, xs, [torch.ones_like(t) for t in out])
    assert all(g.dtype == torch.float16 and g.shape == x.shape for g, x in zip(grads, xs))


def test_a_gradient_penalty_under_torch_func_matches_its_finite_difference():
    """A gradient penalty through a layer under torch.func, where the MLP runs op by op (an eager
    layer's node on the kernels refuses one: tests/kernels/test_phi_mlp.py): its gradient
    matches its finite difference in float64."""
    from torch.func import grad

    from nsa.attention import NSAAttention, NSAConfig

    torch.manual_seed(0)
    layer = NSAAttention(8, 2, 1, 4, NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4),
                         graph_tokens=0).double()
    x = torch.randn(1, 13, 8, dtype=torch.float64)

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
