"""An NSA layer's projections: the query, key/value and gate projections of its input run as one
matmul (one launch each way, one gradient of the input), and the gates are sigmoid(W_g x + b_g)
of the gate projection's own weight and bias, whatever padding the stacked weights take."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from nsa.attention import NSAAttention
from nsa.attention.config import NSAConfig

_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class _MatmulsOf(TorchDispatchMode):
    """Counts the matmuls whose arguments include a tensor of the given storage."""

    def __init__(self, x: torch.Tensor):
        super().__init__()
        self.storage = x.untyped_storage().data_ptr()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _MATMULS:
            self.count += any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == self.storage
                              for a in args)
        return func(*args, **(kwargs or {}))


# (query heads, KV heads, head dim): 4 * 16 + 6 * 2 * 16 + 3 * 4 = 268 rows, padded to 272; 8
# heads: 128 + 192 + 24 = 344, a multiple of 8 already
@pytest.mark.parametrize("heads", [(4, 2, 16), (8, 2, 16)], ids=["padded", "unpadded"])
def test_one_matmul_projects_the_input_and_the_gates_are_their_projections(heads):
    torch.manual_seed(0)
    HQ, H, K = heads
    layer = NSAAttention(48, HQ, H, K, NSAConfig(), graph_tokens=0)
    torch.nn.init.normal_(layer.gate_proj.bias)
    x = torch.randn(2, 24, 48, requires_grad=True)
    with _MatmulsOf(x) as seen:
        q, kv, gates = layer.project(x, 0)
    assert seen.count == 1
    expected = torch.sigmoid(F.linear(x, layer.gate_proj.weight, layer.gate_proj.bias)).view(2, 24, HQ, 3)
    torch.testing.assert_close(gates, expected)
    assert q.shape == (2, 24, HQ, K) and all(t.shape == (2, 24, H, K) for t in kv)

    dgates = torch.randn_like(gates)
    grads = torch.autograd.grad(gates, [x, layer.gate_proj.weight, layer.gate_proj.bias, layer.q_proj.weight],
                                dgates, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, [x, layer.gate_proj.weight, layer.gate_proj.bias], dgates)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)
    assert grads[3] is None or not grads[3].any()  # the gates read no query weight
