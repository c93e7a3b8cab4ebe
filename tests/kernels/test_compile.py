"""The Triton kernels are torch custom ops (nsa::*): their fake (meta) implementations agree
with the real ones, and a model whose blocks are torch.compile'd with every NSA stage on Triton
traces without graph breaks or recompiles and computes what the eager model computes.

On CPU the kernels run interpreted and the compile backend is aot_eager (dynamo + AOTAutograd,
no code generation), which is what checks the custom-op registration and the tracing; on CUDA
the same test uses inductor."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import pytest
import torch

from nsa.attention.config import NSAConfig
from nsa.model.config import load_model_config
from nsa.model.model import NSATransformer
from nsa.model.telemetry import count_calls
from nsa.train.parallelize import apply_compile

pytestmark = pytest.mark.triton_interp

TRITON_ROUTES = ["model.attn.backend_cmp=triton", "model.attn.backend_sel=triton",
                 "model.attn.backend_win=triton"]
# the smallest model that runs every NSA stage's custom op (compressed band, top-n, the selected
# and window branches with the gated sum as one op): one layer, one KV head of two query heads,
# blocks of 4 keys, so that 16 tokens hold 7 compressed tokens and 4 selection blocks, of which
# the later tokens choose 3
SMALL = TRITON_ROUTES + ["model.n_layers=1", "model.dim=32", "model.n_heads=2", "model.n_kv_groups=1",
                         "model.ffn_hidden=32", "model.attn.cmp_block=4", "model.attn.cmp_stride=2",
                         "model.attn.sel_block=4", "model.attn.n_selected=3", "model.attn.window=4"]
SEQ = 16


def _opcheck_inputs(dev):
    gen = torch.Generator().manual_seed(0)
    B, T, H, G, K = 1, 16, 1, 3, 16
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4)
    q = torch.randn(B, T, H * G, K, generator=gen).to(dev)
    k, v = (torch.randn(B, T, H, K, generator=gen).to(dev) for _ in range(2))
    nc = (T - cfg.cmp_block) // cfg.cmp_stride + 1
    kc, vc = (torch.randn(B, nc, H, K, generator=gen).to(dev) for _ in range(2))
    return cfg, q, k, v, kc, vc


def test_custom_ops_pass_opcheck(kdev):
    from nsa.kernels import band_attention, combine, gated_branches, selection, topk
    from nsa.kernels.tuning import BandTiles, SelectionTuning

    cfg, q, k, v, kc, vc = _opcheck_inputs(kdev)
    grad = [t.clone().requires_grad_() for t in (q, kc, vc)]
    band_args = (0, cfg.cmp_block, cfg.cmp_stride, 0, False, False)
    torch.library.opcheck(band_attention.band_op.fwd, (*grad, *band_args, ""))
    torch.library.opcheck(band_attention.band_op.fwd, (*grad, *band_args, BandTiles(fwd=(16, 16, 4, 1)).as_arg()))
    o, lse = band_attention.band_op.fwd(q, kc, vc, *band_args, "")
    sel_args = (q, kc, lse, 0, cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected, "")
    torch.library.opcheck(topk.select_blocks_op, sel_args)
    idx = topk.select_blocks_op(*sel_args)
    # the selected forward's forms (nsa.kernels.SEL_FORMS); a tuning that takes the dS tiles
    for form, tuning in (("tiles", ""), ("blocks", ""), ("blocks", SelectionTuning(tt=1, dq_keep="ds").as_arg())):
        torch.library.opcheck(selection.sel_op.fwd, (q.clone().requires_grad_(), k.clone().requires_grad_(),
                                                  v.clone().requires_grad_(), idx, cfg.sel_block, 0, False, form,
                                                  tuning))
    gates = torch.rand(*q.shape[:3], 3, device=kdev, requires_grad=True)
    parts = [torch.randn_like(q).requires_grad_() for _ in range(3)]
    torch.library.opcheck(combine.gate_combine_op.fwd, (gates, *parts))
    k2, v2 = (torch.randn_like(t).requires_grad_() for t in (k, v))
    torch.library.opcheck(gated_branches.gated_branches_op.fwd,
                          (gates, parts[0], parts[1], k.clone().requires_grad_(), v.clone().requires_grad_(), k2, v2,
                           idx, 0, cfg.sel_block, cfg.window, False, "auto", ""))


def _loss_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_blocks_match_eager_without_graph_breaks(kdev):
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = load_model_config("tiny", SMALL)
    torch.manual_seed(0)
    model = NSATransformer(cfg).to(kdev)
    count_calls(model)
    torch.manual_seed(0)
    eager_model = NSATransformer(cfg).to(kdev)
    x = torch.randint(0, cfg.vocab_size, (1, SEQ), device=kdev)
    torch._dynamo.reset()
    counters.clear()
    backend = "inductor" if kdev.type == "cuda" else "aot_eager"
    # compiled before any eager call, as the trainer does (that routing imports the kernels
    # before the trace is checked by tests/unit/test_kernel_layer.py)
    apply_compile(model, kdev, torch.float32, backend=backend)
    for block in model.layers:  # fullgraph: a graph break inside a block is an error
        block.compile(backend=backend, fullgraph=True)
    compiled = [_loss_and_grads(model, x) for _ in range(2)]
    ref_loss, ref_grads = _loss_and_grads(eager_model, x)
    for loss, grads in compiled:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] == len(model.layers), dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    # the route bookkeeping still runs under compile (the backend audit reads it)
    attn = model.layers[0].attn
    assert attn.routes["sel"].backend == "triton"
    assert int(attn.calls) == 2  # the two compiled calls


def test_whole_model_compiles_in_one_graph_as_a_user_compiles_it(kdev):
    """torch.compile(model, fullgraph=True) of the whole model, before any eager call (routing
    happens inside the first trace), as a user's script compiles it: one graph, no break, and
    the eager model's loss and gradients."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = load_model_config("tiny", SMALL)
    torch.manual_seed(0)
    model = NSATransformer(cfg).to(kdev)
    torch.manual_seed(0)
    eager_model = NSATransformer(cfg).to(kdev)
    x = torch.randint(0, cfg.vocab_size, (1, SEQ), device=kdev)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="inductor" if kdev.type == "cuda" else "aot_eager", fullgraph=True)

    def loss_and_grads(fn, params):
        for p in params.values():
            p.grad = None
        loss = fn(x).float().logsumexp(-1).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in params.items()}

    got = [loss_and_grads(compiled, dict(model.named_parameters())) for _ in range(2)]
    ref_loss, ref_grads = loss_and_grads(eager_model, dict(eager_model.named_parameters()))
    for loss, grads in got:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


#: operators that change a tensor in place, as dynamo records them (beside methods and torch functions named with
#: a trailing underscore, and ops of a mutable schema)
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                 operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                 operator.ixor, operator.ilshift, operator.irshift})


def _in_place(node: torch.fx.Node) -> bool:
    """Whether a node of a graph dynamo traced changes a tensor in place."""
    target = node.target
    if node.op == "call_method":
        return target.endswith("_") and not target.startswith("_")
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    name = getattr(target, "__name__", "")
    return (target in _IN_PLACE_OPERATORS or "out" in node.kwargs
            or (name.endswith("_") and not name.startswith("_") and getattr(target, "__module__", "") != "_operator"))


@dataclass
class _LongContextTrace:
    """A compiled NSA layer's training call from RECOMPUTE_TOKENS tokens, traced: what its forward
    saves for the backward ((the op that made it or the input's name, shape), in order), each
    checkpointed region's policy (whether a context_fn came with it: torch's warning "context_fn is
    passed to torch.utils.checkpoint under torch.compile"), the policy's cache_hash (None without
    one: torch's AOTAutograd cache then compiles the graph anew in every process) and in-place
    ops, and the compiled and eager layers' output and gradients."""

    saved: list[tuple[str, tuple[int, ...]]]
    policies: list[bool]
    cache_hashes: list[str | None]
    in_place: list[str]
    compiled: list[torch.Tensor]
    eager: list[torch.Tensor]

    @property
    def saved_by(self) -> list[str]:
        """The ops whose outputs are saved (the inputs and parameters aside)."""
        return [name for name, _ in self.saved if not name.startswith("primals_")]


def _trace_long_context(dev: torch.device, monkeypatch, route: str) -> _LongContextTrace:
    import torch._dynamo
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    from nsa.attention import compress
    from nsa.attention.module import NSAAttention

    T = 32
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", T)
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4, backend_cmp=route,
                    backend_sel=route, backend_win=route)
    trace = _LongContextTrace([], [], [], [], [], [])

    def partition(joint, inputs, *, num_fwd_outputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0][num_fwd_outputs:]
        for node in outputs:
            if isinstance(node, torch.fx.Node):
                made_by = node.args[0] if node.target is operator.getitem else node
                name = made_by.target.name() if hasattr(made_by.target, "name") else str(made_by.target)
                trace.saved.append((name, tuple(node.meta["val"].shape)))
        return fw, bw

    aot = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), partition_fn=partition)

    def backend(gm, inputs):
        for node in gm.graph.nodes:
            if node.target is tag_activation_checkpoint:
                body = getattr(gm, node.args[0].target)
                trace.policies.append("_checkpoint_context_fn" in body.meta)
                trace.cache_hashes.append(getattr(body.meta.get("_checkpoint_context_fn"), "cache_hash", None))
                trace.in_place += [n.format_node() for n in body.graph.nodes if _in_place(n)]
        return aot(gm, inputs)

    torch.manual_seed(0)
    layer = NSAAttention(32, 2, 1, 16, cfg, graph_tokens=0).to(dev)
    x = torch.randn(1, T, 32, device=dev)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for fn, results in ((compiled, trace.compiled), (layer, trace.eager)):
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        y = fn(xi)
        y.square().mean().backward()
        results += [y.detach(), xi.grad, *(p.grad for p in layer.parameters())]
    return trace


def test_a_traced_layer_at_long_context_keeps_only_the_selection(kdev, monkeypatch):
    """From RECOMPUTE_TOKENS tokens a compiled NSA layer's forward saves for its backward, besides
    its input and parameters, only the outputs of the top-n selection and of the selected branch
    (nsa.attention.checkpointed): q, the key/value streams, the compressed tokens, the compressed
    and window branches' outputs, the gates and the gated sum are made again by the compiler, as
    the eager layer's recipes make them. Output and gradients are the eager layer's. The
    checkpointed region, which takes a policy (torch warns once that such a region must hold no
    in-place op: the compiler can lose one there), holds none. The policy has a cache_hash, without
    which torch's AOTAutograd cache passes the graph by (counted as autograd_cache_bypass), so
    that every new process traced and partitioned the model again."""
    from nsa.attention import checkpointed

    trace = _trace_long_context(kdev, monkeypatch, "triton")
    assert trace.saved_by and set(trace.saved_by) <= {"nsa::select_blocks", "nsa::sel_fwd"}, trace.saved
    assert trace.policies == [True] and trace.in_place == [], (trace.policies, trace.in_place)
    assert trace.cache_hashes == [checkpointed._POLICY.cache_hash] and trace.cache_hashes[0], trace.cache_hashes
    for got, want in zip(trace.compiled, trace.eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_traced_layer_on_the_pytorch_path_passes_no_policy(kdev, monkeypatch):
    """On the PyTorch path no op the policy keeps runs (checkpointed.KEPT_OPS are the kernels'),
    so it tagged every op to be made again, as torch.compile tags a checkpoint given no policy;
    passing it printed torch's warning "context_fn is passed to torch.utils.checkpoint under
    torch.compile" for nothing. The traced region takes none, and the compiler saves the same
    tensors as with it (the input and parameters); output and gradients are the eager layer's."""
    from nsa.attention import checkpointed

    trace = _trace_long_context(kdev, monkeypatch, "torch")
    assert trace.policies == [False]
    monkeypatch.setattr(checkpointed, "runs_kept_ops", lambda routes: True)
    with_policy = _trace_long_context(kdev, monkeypatch, "torch")
    assert with_policy.policies == [True]
    assert trace.saved == with_policy.saved and not trace.saved_by, (trace.saved, with_policy.saved)
    for got, want in zip(trace.compiled, trace.eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the check of in-place ops sees them (the region holds none on either route)
    graph = torch.fx.symbolic_trace(lambda t: t.mul(2).relu_().add_(1) + torch.relu_(t)).graph
    assert [n.name for n in graph.nodes if _in_place(n)] == ["relu_", "add_", "relu__1"]


@pytest.mark.parametrize("route", ["torch", "triton"])
def test_a_compiled_layer_takes_new_lengths_without_a_graph_each(kdev, route):
    """torch.compile(layer, fullgraph=True) recompiled at every new sequence length (the PyTorch
    path's query chunks ranged over the length, fixing it): the ninth length failed on dynamo's
    recompile limit. The first length compiles a static graph, the second a dynamic one that the
    later lengths of the same regime reuse: here, as many selection blocks as n or more, a multiple
    of the stride, and for the selected kernels' tiles more than SelectionTuning.tt_nb * n blocks
    (one token a tile)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from nsa.attention import NSAAttention

    if route == "torch" and kdev.type == "cuda":
        pytest.skip("the PyTorch path's chunks are the same code on any device: checked on the CPU")
    backends = {f"backend_{s}": route for s in ("cmp", "sel", "win")}
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4, **backends)
    torch.manual_seed(0)
    layer = NSAAttention(32, 2, 1, 16, cfg, graph_tokens=0).to(kdev)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if kdev.type == "cuda" else "aot_eager")
    lengths = (28, 32, 36) if route == "triton" else (28, 32, 36, 40, 48, 56, 64, 72, 80, 88)
    for T in lengths:
        x = torch.randn(1, T, 32, device=kdev)
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-6, msg=f"T={T}")
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
