"""On the GPU: an NSA layer replayed from its own CUDA graphs (nsa.attention.graphed) computes what
the same layer computes eagerly, step after step, and stays exact where the graphs cannot hold
a forward's activations: two forwards before their backward, a second backward through a
retained graph, a checkpointed block's recomputation, a forward whose backward never runs."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from nsa.attention import NSAAttention
from nsa.model.config import load_model_config

pytestmark = pytest.mark.gpu

S = 2048


@pytest.fixture(autouse=True)
def _nan_poisoned_empty():
    """Plain torch.empty (tests/kernels/conftest.py would fill it with NaN on every call)."""
    yield


def _pair():
    """A layer of m7c_125m's shape with graphs and an eager copy of it (same weights)."""
    cfg = load_model_config("m7c_125m")
    torch.manual_seed(0)
    graphed = NSAAttention(cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.attn, cfg.rope_theta).cuda()
    graphed.count_calls = True
    eager = copy.deepcopy(graphed)
    eager.graphs.max_tokens = 0
    return graphed, eager


def _inputs(seed: int, n: int = 1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dim = load_model_config("m7c_125m").dim
    xs = [torch.randn(1, S, dim, device="cuda", generator=g, requires_grad=True) for _ in range(n)]
    dos = [torch.randn(1, S, dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(n)]
    return xs, dos


def _close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = 2e-2) -> None:
    err = (a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)
    assert err < tol, f"{what}: relative error {err:.3g}"


def _step(layer, xs, dos, **backward):
    """Forward every x (bf16 autocast), then one backward of all; the gradients of x and the params."""
    layer.zero_grad(set_to_none=True)
    for x in xs:
        x.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outs = [layer(x) for x in xs]
    torch.autograd.backward(outs, dos, **backward)
    return [o.detach() for o in outs], [x.grad for x in xs], {n: p.grad for n, p in layer.named_parameters()}


def _same(got, want):
    for name, a, b in (("output", got[0], want[0]), ("dx", got[1], want[1])):
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{name}[{i}]")
    for name, g in got[2].items():
        _close(g, want[2][name], name)


def test_replays_compute_what_the_eager_layer_does_step_after_step():
    graphed, eager = _pair()
    for step in range(4):  # eager first call, capture, replays
        xs, dos = _inputs(step)
        _same(_step(graphed, xs, dos), _step(eager, xs, dos))
    entry, = graphed.graphs.captured.values()
    assert entry.generation == 3, "the second step captures, then it and the next two replay"
    assert int(graphed.calls) == int(eager.calls) == 4


def test_two_forwards_before_their_backward_are_exact():
    graphed, eager = _pair()
    for step in range(3):
        xs, dos = _inputs(10 + step, n=2)
        _same(_step(graphed, xs, dos), _step(eager, xs, dos))
    assert graphed.graphs.captured, "the first forward of each step replays"


def test_a_second_backward_through_a_retained_graph_recomputes():
    graphed, eager = _pair()
    for step in range(3):
        xs, dos = _inputs(20 + step)
        _step(graphed, xs, dos)
        _step(eager, xs, dos)
    results = []
    for layer in (graphed, eager):
        layer.zero_grad(set_to_none=True)
        xs[0].grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(xs[0])
        out.backward(dos[0], retain_graph=True)
        out.backward(dos[0])  # gradients accumulate twice
        results.append(([out.detach()], [xs[0].grad], {n: p.grad for n, p in layer.named_parameters()}))
    _same(*results)


def test_a_double_backward_through_a_replay_is_refused_by_name():
    """A gradient penalty (create_graph=True) through a replayed layer took the graphs' gradients,
    which carry no graph of their own: the second derivative silently lacked the layer's terms."""
    graphed, _ = _pair()
    for step in range(2):  # eager first call, then the capture
        _step(graphed, *_inputs(30 + step))
    xs, dos = _inputs(32)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = graphed(xs[0])
    assert type(out.grad_fn).__name__ == "_ReplayBackward"
    with pytest.raises(RuntimeError, match="replayed from its CUDA graphs has no double backward .*under torch.func"):
        torch.autograd.grad(out, xs[0], dos[0], create_graph=True)


def test_a_checkpointed_layer_runs_eagerly_and_is_exact():
    graphed, eager = _pair()
    for step in range(3):
        xs, dos = _inputs(30 + step)
        got = []
        for layer in (graphed, eager):
            layer.zero_grad(set_to_none=True)
            xs[0].grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = checkpoint(layer, xs[0], use_reentrant=False)
            out.backward(dos[0])
            got.append(([out.detach()], [xs[0].grad], {n: p.grad for n, p in layer.named_parameters()}))
        _same(*got)
    assert not graphed.graphs.captured, "its recomputation must save what its forward saved"


def test_a_forward_without_its_backward_frees_the_graphs_for_the_next_call():
    graphed, eager = _pair()
    for step in range(2):
        xs, dos = _inputs(40 + step)
        _step(graphed, xs, dos)
    entry, = graphed.graphs.captured.values()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        graphed(xs[0])  # its graph is dropped at once: nothing owes a backward
    before = entry.generation
    xs, dos = _inputs(42)
    _same(_step(graphed, xs, dos), _step(eager, xs, dos))
    assert entry.generation == before + 1


def test_no_grad_and_inference_run_eagerly_and_agree():
    graphed, eager = _pair()
    xs, dos = _inputs(50)
    for _ in range(2):
        _step(graphed, xs, dos)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx(), torch.autocast("cuda", dtype=torch.bfloat16):
            _close(graphed(xs[0]), eager(xs[0]), ctx.__name__)


def test_a_forward_hook_runs_once_on_the_replayed_output():
    graphed, eager = _pair()
    for layer in (graphed, eager):
        layer.register_forward_hook(lambda module, args, out: out * 2)
    for step in range(3):
        xs, dos = _inputs(60 + step)
        _same(_step(graphed, xs, dos), _step(eager, xs, dos))
    assert graphed.graphs.captured


def test_past_the_memory_share_a_layer_stays_eager_and_exact(monkeypatch):
    from nsa.attention import graphed as G

    monkeypatch.setattr(G, "MEMORY_SHARE", 0.0)
    monkeypatch.setitem(G._typical, torch.cuda.current_device(), 1)
    graphed, eager = _pair()
    for step in range(3):
        xs, dos = _inputs(70 + step)
        _same(_step(graphed, xs, dos), _step(eager, xs, dos))
    assert not graphed.graphs.captured and graphed.graphs.short_of_memory


def test_a_deleted_layer_gives_its_graphs_memory_back():
    """A user who drops a model and builds another gets the first one's graph pools back, and the
    share they counted: nothing grows from one model to the next. (The first capture of a process
    sets up its capture stream, whose cuBLAS workspace lives as long as the process.)"""
    import gc

    from nsa.attention import graphed as G

    def captured_and_dropped():
        layer, _ = _pair()
        for step in range(3):
            xs, dos = _inputs(80 + step)
            _step(layer, xs, dos)
        assert layer.graphs.captured and G._held[device] > 0
        del layer, xs, dos
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    device = torch.cuda.current_device()
    captured_and_dropped()
    reserved, held = torch.cuda.memory_reserved(), G._held.get(device, 0)
    for _ in range(2):
        captured_and_dropped()
        assert G._held.get(device, 0) == held
        assert torch.cuda.memory_reserved() <= reserved + 64 * 2**20, (torch.cuda.memory_reserved(), reserved)
