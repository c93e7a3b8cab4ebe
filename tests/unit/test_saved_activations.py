"""What an attention layer keeps for its backward: one autocast copy of its input however many
projections read it, and, at long context, neither the compressor's overlapping blocks nor the
gated sum the output projection reads, nor q, the key/value streams and the compressed branch's
output (all made again in the backward: from the per-token keys, the branch outputs, the
projections' input, q and the compressed tokens); the outputs and gradients are those of the
layer that keeps them.
(`python bench/saved_memory.py` lists a layer's saved tensors on a GPU.)"""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from nsa.attention import NSAAttention, NSAConfig, compress
from nsa.attention.dense import DenseAttention


def saved_storages(fn) -> list[torch.Tensor]:
    """One tensor per storage autograd saves while fn() runs (fn's result is dropped)."""
    seen: dict[int, torch.Tensor] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return list(seen.values())


def storages_kept_by(y: torch.Tensor) -> set[int]:
    """The storages (data pointers) of the tensors y's autograd graph keeps for its backward, as
    its nodes give them back: a tensor kept as a recipe comes back in a new storage. The storage,
    not the tensor object: autograd keeps an op's own output as a new tensor on the same memory."""
    kept, seen, todo = set(), set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        values = list(getattr(node, "saved_tensors", ()))  # a Python autograd.Function's
        values += [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
        for value in values:
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    kept.add(t.untyped_storage().data_ptr())
        todo += [next_node for next_node, _ in node.next_functions]
    return kept


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_projections_keep_one_autocast_copy_of_the_input(kind):
    cfg = NSAConfig(kind=kind, cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8)
    # model width 48, attention width 4 x 16: an input copy is told from the heads' tensors by shape
    layer = (NSAAttention(48, 4, 2, 16, cfg, graph_tokens=0) if kind == "nsa"
             else DenseAttention(48, 4, 2, 16, cfg))
    x0 = torch.randn(1, 32, 48, requires_grad=True)
    x = x0 * 1.0  # a block's normalised input: no leaf, so autocast's cache does not share its casts

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(x)

    copies = [t for t in saved_storages(forward) if t.dtype == torch.bfloat16 and t.shape[-1] == 48
              and t.numel() == x.numel()]
    assert len(copies) == 1, [tuple(t.shape) for t in copies]


def _compressor_grads(recompute_from: int, monkeypatch, T: int = 70):
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", recompute_from)
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    torch.manual_seed(0)
    comp = compress.Compressor(16, cfg)
    with torch.no_grad():
        comp.pos.normal_()
    x = torch.randn(1, T, 2, 16, requires_grad=True)
    out = {}
    saved = saved_storages(lambda: out.setdefault("y", comp(x)))
    leaves = [x, *comp.parameters()]
    grads = torch.autograd.grad(out["y"], leaves, torch.randn_like(out["y"]))
    return out["y"], grads, saved


def test_the_compressor_recomputes_its_chunks_at_long_context(monkeypatch):
    """T = 70: Nc = 16 blocks of l = 8 tokens, every d = 4, read by fc1 as 17 chunks of d tokens
    (68 of x's 70). From RECOMPUTE_TOKENS tokens no saved tensor holds the chunks, and the output
    and gradients are bit for bit those of the compressor that keeps them."""
    kept_y, kept_grads, kept = _compressor_grads(10**9, monkeypatch)
    y, grads, saved = _compressor_grads(64, monkeypatch)
    chunks = 17 * 2 * 4 * 16 * 4  # bytes of m x H x d x K float32
    assert chunks in {t.untyped_storage().nbytes() for t in kept}  # what the short sequence keeps
    assert chunks not in {t.untyped_storage().nbytes() for t in saved}, [tuple(t.shape) for t in saved]
    assert torch.equal(y, kept_y)
    for g, ref in zip(grads, kept_grads):
        assert torch.equal(g, ref)


@pytest.mark.parametrize("cmp_block, cmp_stride, T", [(8, 4, 70), (8, 4, 64), (12, 4, 41), (4, 4, 9), (32, 16, 100)])
def test_the_compressor_matches_its_blocks_formula(cmp_block, cmp_stride, T):
    """fc1 over chunks of d tokens (l = r*d) gives what the paper's formula gives, W2 silu(W1
    flatten(block + pos) + b1) + b2 of each block, in float64, with its gradients; and the key and
    value compressors run together as each alone."""
    cfg = NSAConfig(cmp_block=cmp_block, cmp_stride=cmp_stride)
    torch.manual_seed(0)
    comps = [compress.Compressor(8, cfg).double() for _ in range(2)]
    for c in comps:
        with torch.no_grad():
            c.pos.normal_()
    xs = [torch.randn(2, T, 3, 8, dtype=torch.float64, requires_grad=True) for _ in comps]

    def formula(c, x):
        blocks = x.unfold(1, cfg.cmp_block, cfg.cmp_stride).transpose(-1, -2)  # [B, Nc, H, l, K]
        return c.fc2(F.silu(c.fc1((blocks + c.pos).flatten(-2))))

    got = compress.compress(comps, xs)
    dy = [torch.randn_like(t) for t in got]
    leaves = [*xs, *(p for c in comps for p in c.parameters())]
    got_grads = torch.autograd.grad(got, leaves, dy)
    want = [formula(c, x) for c, x in zip(comps, xs)]
    want_grads = torch.autograd.grad(want, leaves, dy)
    for g, w in zip([*got, *got_grads], [*want, *want_grads]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    alone = comps[1](xs[1], first=1)
    torch.testing.assert_close(alone, want[1][:, 1:], rtol=1e-12, atol=1e-12)


class _SumsIntoFloat32(TorchFunctionMode):
    """A sum with no dtype named, of a 16-bit tensor, into float32: what CUDA's autocast does (its
    fp32_set_opt_dtype policy), which CPU's autocast does not."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.sum, torch.Tensor.sum) and args[0].dtype == torch.bfloat16 and "dtype" not in kwargs:
            kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


def test_the_compressors_keep_no_float32_tensor_under_autocast():
    """Under bfloat16 autocast the compressors keep only bfloat16 tensors for their backward (their
    parameters' float32 copies aside), also where autocast sums into float32 as on CUDA: a float32
    sum of the blocks' terms would have silu keep a float32 copy of them."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = [compress.Compressor(16, cfg) for _ in range(2)]
    xs = [torch.randn(1, 64, 2, 16, dtype=torch.bfloat16, requires_grad=True) for _ in comps]
    params = {p.untyped_storage().data_ptr() for c in comps for p in c.parameters()}
    with _SumsIntoFloat32():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            saved = saved_storages(lambda: compress.compress(comps, xs))
    wide = [tuple(t.shape) for t in saved if t.dtype != torch.bfloat16 and t.untyped_storage().data_ptr() not in params]
    assert not wide, wide


def test_the_layer_keeps_how_to_make_its_projections_and_gated_sum_at_long_context(monkeypatch):
    """From RECOMPUTE_TOKENS tokens none of the key/value streams, the compressed branch's output
    and the gated sum o that the PyTorch route keeps below it outlives the forward (that route's
    attention keeps its own copies of q and the compressor's keys; the kernels' route, with the
    window branch's output, in tests/kernels/test_gated_branches.py), and output and gradients
    are the same bit for bit."""
    assert_layer_remakes(NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8),
                         torch.device("cpu"), monkeypatch, exact=True,
                         remade={"v_cmp", "k_sel", "v_sel", "k_win", "v_win", "o_cmp", "o"})


#: what an NSA layer keeps below RECOMPUTE_TOKENS and makes again from it (nsa.attention.remade)
REMADE = {"q", "k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win", "o_cmp", "o"}


def assert_layer_remakes(cfg: NSAConfig, device: torch.device, monkeypatch, exact: bool,
                         remade: set[str] = REMADE, never_kept: set[str] = frozenset()) -> None:
    """The tensors named in ``remade`` (REMADE, lse_cmp, o_win, lse_win) and the compressors' fc1
    inputs are alive after the forward below RECOMPUTE_TOKENS and freed from it, those named in
    ``never_kept`` freed after the forward at either length, the projections
    run once more in the backward, and the output and gradients are the same (bit for bit where
    ``exact``, else within bf16 rounding under autocast)."""
    from nsa.attention import module

    torch.manual_seed(0)
    layer = NSAAttention(48, 4, 2, 16, cfg, graph_tokens=0).to(device)
    x = torch.randn(1, 64, 48, device=device, requires_grad=True)
    dy = torch.randn(1, 64, 48, device=device)
    project, project_qkv, core = layer._projected, layer.project_qkv, module.nsa_core_parts
    fc1_input, one_node = compress.fc1_input, compress.phi_mlp.one_node

    def run(recompute_from: int):
        monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", recompute_from)
        made: dict[str, torch.Tensor] = {}
        projections = []

        def counted_project_qkv(*args, **kwargs):
            projections.append(1)
            return project_qkv(*args, **kwargs)

        def watched_fc1_input(*args, **kwargs):
            flat = fc1_input(*args, **kwargs)
            made.setdefault("fc1 input", flat)
            return flat

        def watched_one_node(*args, **kwargs):  # the kernels' node writes fc1's input itself
            out, flat = one_node(*args, **kwargs)
            made.setdefault("fc1 input", flat)
            return out, flat

        def watched_project(*args, **kwargs):
            q, kv, gates = project(*args, **kwargs)
            made.setdefault("q", q)
            for name, t in zip(("k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win"), kv):
                made.setdefault(name, t)
            return q, kv, gates

        def watched_core(*args, **kwargs):
            parts = core(*args, **kwargs)
            made.update(o=parts.o, o_cmp=parts.o_cmp, lse_cmp=parts.lse_cmp, o_win=parts.o_win,
                        lse_win=parts.lse_win)
            return parts

        monkeypatch.setattr(layer, "_projected", watched_project)
        monkeypatch.setattr(layer, "project_qkv", counted_project_qkv)
        monkeypatch.setattr(compress, "fc1_input", watched_fc1_input)
        monkeypatch.setattr(module, "fc1_input", watched_fc1_input)
        monkeypatch.setattr(compress.phi_mlp, "one_node", watched_one_node)
        monkeypatch.setattr(module, "nsa_core_parts", watched_core)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            y = layer(x)
        storages = {name: StorageWeakRef(t.untyped_storage()) for name, t in made.items() if t is not None}
        made.clear()
        gc.collect()
        alive = {name for name, ref in storages.items() if not ref.expired()}
        forward_projections = len(projections)
        grads = torch.autograd.grad(y, [x, *layer.parameters()], dy.to(y.dtype))
        return y, grads, alive, len(projections) - forward_projections

    y_kept, grads_kept, kept, _ = run(10**9)
    y, grads, alive, projected_again = run(64)
    remade = remade | {"fc1 input"}
    assert remade <= kept, f"below RECOMPUTE_TOKENS the layer keeps {sorted(kept)}"
    assert not remade & alive, f"alive after the forward: {sorted(remade & alive)}"
    assert not never_kept & (kept | alive), f"kept: {sorted(never_kept & (kept | alive))}"
    assert projected_again == 1, "q, the key/value streams and fc1's inputs are made once in the backward"
    assert torch.equal(y, y_kept)
    for g, ref in zip(grads, grads_kept):
        if exact:
            assert torch.equal(g, ref)
        else:
            assert (g.float() - ref.float()).norm() <= 2e-2 * ref.float().norm() + 1e-6


def test_a_torch_func_transform_of_a_long_input_runs_without_recomputation(monkeypatch):
    """torch.func takes no saved-tensor hooks (checkpointing's): under it the compressor keeps
    its blocks as below RECOMPUTE_TOKENS, and its gradient is the one autograd gives."""
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", 64)
    torch.manual_seed(0)
    comp = compress.Compressor(16, NSAConfig(cmp_block=8, cmp_stride=4))
    x = torch.randn(1, 64, 2, 16, requires_grad=True)
    got = torch.func.grad(lambda t: comp(t).square().sum())(x)
    want, = torch.autograd.grad(comp(x).square().sum(), x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["nsa", "dense"])
@pytest.mark.parametrize("recompute_from", [64, 10**9], ids=["long", "short"])
def test_a_layer_under_torch_func_grad_of_its_parameters(kind, recompute_from, monkeypatch):
    """torch.func.grad through functional_call (the parameters wrapped, the input not): the same
    gradients as autograd's, the recomputation off, and the forward counted for the audit."""
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", recompute_from)
    cfg = NSAConfig(kind=kind, cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8)
    torch.manual_seed(0)
    layer = (NSAAttention(48, 4, 2, 16, cfg, graph_tokens=0) if kind == "nsa"
             else DenseAttention(48, 4, 2, 16, cfg))
    layer.count_calls = True
    x = torch.randn(1, 64, 48)
    params = dict(layer.named_parameters())

    def loss(p):
        return torch.func.functional_call(layer, p, (x,)).square().sum()

    before = int(layer.calls)
    got = torch.func.grad(loss)(params)
    assert int(layer.calls) == before + 1
    want = torch.autograd.grad(loss(params), list(params.values()))
    for (name, g), ref in zip(got.items(), want):
        torch.testing.assert_close(g, ref, msg=name)


def _recomputing_layer_and_its_gradients(monkeypatch):
    """A small layer recomputing from 64 tokens, an input of 64 tokens, the leaves (the input and
    the parameters) and their gradients of the layer's output's squared sum."""
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", 64)
    torch.manual_seed(0)
    layer = NSAAttention(48, 4, 2, 16, NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8),
                         graph_tokens=0)
    x = torch.randn(1, 64, 48, requires_grad=True)
    leaves = [x, *layer.parameters()]
    return layer, x, leaves, torch.autograd.grad(layer(x).square().sum(), leaves)


def test_under_a_callers_checkpoint_the_layer_keeps_its_tensors(monkeypatch):
    """Activation checkpointing recomputes the layer and expects its forward to save what it saved
    the first time: from RECOMPUTE_TOKENS tokens, under the caller's hooks, the layer keeps no
    recipes of its own, and the gradients are those of the layer without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    from nsa.attention import remade

    layer, x, leaves, want = _recomputing_layer_and_its_gradients(monkeypatch)
    recipes = []
    monkeypatch.setattr(remade.Remaking, "add", lambda self, make, tensors, reads=(): recipes.append(make))
    got = torch.autograd.grad(checkpoint(layer, x, use_reentrant=False).square().sum(), leaves)
    assert recipes == []
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_the_remade_projections_read_the_forwards_weights(monkeypatch):
    """From RECOMPUTE_TOKENS tokens the backward makes q and the key/value streams again from the
    stacked weight the forward read, not from the parameters as they are by then: a weight changed
    in place between the forward and the backward (which autograd does not see, as the matmul
    keeps a stacked copy) leaves the gradients those of the forward's values."""
    layer, x, leaves, want = _recomputing_layer_and_its_gradients(monkeypatch)
    y = layer(x).square().sum()
    with torch.no_grad():
        layer.q_proj.weight.mul_(2.0)
        layer.kv_proj.weight.add_(1.0)
    got = torch.autograd.grad(y, leaves)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "remade"])
def test_an_input_changed_in_place_before_the_backward_is_refused(monkeypatch, recompute):
    """A block that adds the attention's output into its input in place (h += attn(h)) changes
    what the layer's backward reads: autograd refuses it for the tensors a layer keeps, and the
    layer that makes them again from h (from RECOMPUTE_TOKENS tokens) refuses it alike, rather
    than making them from the changed h and giving wrong gradients."""
    monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", 64 if recompute else 1 << 40)
    torch.manual_seed(0)
    layer = NSAAttention(48, 4, 2, 16, NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8),
                         graph_tokens=0)
    x = torch.randn(1, 64, 48, requires_grad=True)
    h = x * 1.0
    h += layer(h)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.square().sum().backward()
