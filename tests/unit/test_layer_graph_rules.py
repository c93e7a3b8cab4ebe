"""The rules of an NSA layer's own CUDA graphs that hold without a GPU (nsa.attention.graphed;
tests/kernels/test_layer_graphs.py replays them on one): when a call may be graphed, what a
copy of a layer keeps, and the packed gradients a replay hands out."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from nsa.attention import NSAAttention, NSAConfig, set_graph_tokens
from nsa.attention.graphed import GRAPH_TOKENS, MAX_SEEN, LayerGraphs, _Packed
from nsa.model.config import load_model_config
from nsa.model.model import NSATransformer


def _layer(**kw) -> NSAAttention:
    return NSAAttention(64, 4, 2, 16, NSAConfig(), **kw)


def test_a_cpu_input_is_never_graphed_and_runs_the_eager_forward():
    layer = _layer()
    x = torch.randn(1, 64, 64, requires_grad=True)
    assert not layer.graphs.applies(x)
    torch.testing.assert_close(layer(x), layer.eager_forward(x))
    assert not layer.graphs.seen and not layer.graphs.captured


def test_a_copy_or_a_pickle_of_a_layer_starts_without_graphs():
    layer = _layer(graph_tokens=4096)
    layer.graphs.seen[("a key",)] = None
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert other.graphs is not layer.graphs
        assert other.graphs.max_tokens == 4096 and not other.graphs.seen and not other.graphs.captured


def test_a_layer_whose_parameters_move_every_call_remembers_few_keys():
    """FSDP2 gathers the parameters anew for each step, maybe elsewhere: every call is a new key,
    run eagerly, and the layer remembers only the latest MAX_SEEN of them, not one a step."""
    layer = _layer()
    x = torch.randn(1, 64, 64, requires_grad=True)
    for _ in range(3 * MAX_SEEN):
        for p in layer.parameters():
            p.data = p.data.clone()  # a new address, as a new all-gather buffer gives
        torch.testing.assert_close(layer.graphs(layer, x, None), layer.eager_forward(x))
    assert len(layer.graphs.seen) == MAX_SEEN and not layer.graphs.captured


def test_graph_tokens_default_setting_and_refusal():
    assert _layer().graphs.max_tokens == GRAPH_TOKENS
    model = NSATransformer(load_model_config("tiny"))
    set_graph_tokens(model, 0)
    layers = [m for m in model.modules() if isinstance(m, NSAAttention)]
    assert layers and all(m.graphs.max_tokens == 0 for m in layers)
    with pytest.raises(ValueError, match=r"graph_tokens \(the most tokens a layer graphs\) must be an integer >= 0"):
        LayerGraphs(-1)


def test_packed_gradients_come_back_as_fresh_copies_of_each_shape_and_dtype():
    grads = [torch.randn(3, 4), None, torch.randn(5).to(torch.bfloat16), torch.randn(2, 2, 2)]
    packed = _Packed.pack(grads)
    assert set(packed.flats) == {torch.float32, torch.bfloat16}
    out = packed.copies()
    assert out[1] is None
    for got, want in zip(out, grads):
        if want is not None:
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want)
    packed.flats[torch.float32].zero_()  # the next replay overwrites the buffers
    torch.testing.assert_close(out[0], grads[0])
