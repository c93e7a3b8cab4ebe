"""An NSA layer whose stages run on the kernels, and a second derivative (a gradient penalty):
the kernels compute their gradients outside autograd, so a double backward through them is
refused by name instead of silently missing their terms; under torch.func the layer runs op by
op on the PyTorch path, whose first and second derivatives it then has."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa.attention import NSAAttention, NSAConfig

pytestmark = pytest.mark.triton_interp

ON_TORCH = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4, backend_cmp="torch",
                     backend_sel="torch", backend_win="torch")
ON_KERNELS = dataclasses.replace(ON_TORCH, backend_cmp="triton", backend_sel="triton", backend_win="triton")


def _layers(kdev, phi: str) -> tuple[NSAAttention, NSAAttention]:
    """A layer on the kernels' routes and one on the PyTorch path, with the same weights."""
    torch.manual_seed(0)
    kernels = NSAAttention(32, 2, 1, 16, dataclasses.replace(ON_KERNELS, phi=phi), graph_tokens=0).to(kdev)
    torch_path = NSAAttention(32, 2, 1, 16, dataclasses.replace(ON_TORCH, phi=phi), graph_tokens=0).to(kdev)
    torch_path.load_state_dict(kernels.state_dict())
    return kernels, torch_path


@pytest.mark.parametrize("phi", ["mean", "mlp"])
def test_a_double_backward_through_the_kernels_is_refused_by_name(kdev, phi):
    """With phi='mean' (no compressor MLP node to refuse it) a gradient penalty through the kernels
    ran without a word, and its second derivative lacked the kernels' terms: x got none at all."""
    kernels, _ = _layers(kdev, phi)
    x = torch.randn(1, 13, 32, device=kdev, requires_grad=True)
    with pytest.raises(RuntimeError, match="no double backward .*under torch.func"):
        torch.autograd.grad(kernels(x).square().sum(), x, create_graph=True)


def test_under_torch_func_the_layer_runs_op_by_op_to_the_second_order(kdev):
    """torch.func refused the kernels' autograd, at the first order too ("In order to use an
    autograd.Function with functorch transforms ..., it must override the setup_context
    staticmethod"): the guide's way to a gradient penalty failed wherever the kernels run."""
    from torch.func import functional_call, grad

    kernels, torch_path = _layers(kdev, "mlp")
    x = torch.randn(1, 13, 32, device=kdev)

    def derivatives(layer):
        params = {k: v.detach() for k, v in layer.named_parameters()}
        first = grad(lambda x: functional_call(layer, params, (x,)).square().sum())
        return first(x), grad(lambda x: first(x).square().sum())(x)

    for got, want in zip(derivatives(kernels), derivatives(torch_path)):
        torch.testing.assert_close(got, want)
    assert {route.backend for route in kernels.routes.values()} == {"torch"}
