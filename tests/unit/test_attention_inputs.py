"""What an attention layer refuses, naming it, before it would fail deep inside or compute
silently wrong values: bad constructor arguments, an NSAConfig of wrong types (and frozen once
made, so that no layer runs on fields changed after its checks), inputs of the wrong shape, a
cache of another kind or batch or of compressed tokens its length does not make, RoPE tables of
other positions' count. And a layer built on the
meta device, materialised with ``to_empty`` and reset is the layer (and the model) built directly, and runs
forward and backward on meta tensors (shapes only, as tools that trace a model's shapes run it)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nsa.attention import NSAAttention, NSACache, NSAConfig
from nsa.attention.dense import DenseAttention

CFG = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=16)


@pytest.mark.parametrize("change, error, match", [
    (dict(dim=0), ValueError, "dim must be an integer >= 1"),
    (dict(n_heads=0), ValueError, "n_heads must be an integer >= 1"),
    (dict(n_kv_groups=0), ValueError, "n_kv_groups must be an integer >= 1"),
    (dict(head_dim=2.0), ValueError, "head_dim must be an integer >= 1"),
    (dict(head_dim=15), ValueError, "head_dim=15 must be even"),
    (dict(n_kv_groups=3), ValueError, "n_heads=4 must be divisible by n_kv_groups=3"),
    (dict(cfg=None), TypeError, "cfg must be an nsa.attention.NSAConfig, got NoneType"),
    (dict(rope_theta=0.0), ValueError, "rope_theta must be a finite number > 0"),
    (dict(rope_theta=-1.0), ValueError, "rope_theta must be a finite number > 0"),
    (dict(rope_theta=math.nan), ValueError, "rope_theta must be a finite number > 0"),
])
@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_bad_constructor_arguments_are_refused_by_name(kind, change, error, match):
    args = dict(dim=64, n_heads=4, n_kv_groups=2, head_dim=16, cfg=CFG, rope_theta=10000.0) | change
    with pytest.raises(error, match=match):
        kind(**args)


@pytest.mark.parametrize("field, value", [("window", 16.5), ("cmp_block", "8"), ("n_selected", True)])
def test_an_nsa_config_takes_integers_and_is_frozen(field, value):
    with pytest.raises(ValueError, match=f"attn.{field} must be an integer"):
        dataclasses.replace(CFG, **{field: value})
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.window = 0  # type: ignore[misc]


def test_an_nsa_config_takes_any_integer_as_a_python_int():
    """numpy's integers (a sweep's np.arange) were refused as "attn.window must be an integer, got
    np.int64(64)", which they are; a layer's sizes took them."""
    np = pytest.importorskip("numpy")
    cfg = dataclasses.replace(CFG, window=np.int64(64), n_selected=np.int32(4))
    assert (cfg.window, cfg.n_selected) == (64, 4) and type(cfg.window) is int and type(cfg.n_selected) is int
    assert cfg == dataclasses.replace(CFG, window=64, n_selected=4)


def _layer(kind):
    torch.manual_seed(0)
    return kind(64, 4, 2, 16, CFG)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_inputs_of_the_wrong_shape_are_refused_by_name(kind):
    layer = _layer(kind)
    for x in (torch.randn(2, 10, 32), torch.randn(10, 64), torch.randn(64)):
        with pytest.raises(ValueError, match=r"x must be \[batch, tokens, 64\]"):
            layer(x)
    for x in (torch.randn(2, 0, 64), torch.randn(0, 10, 64)):
        with pytest.raises(ValueError, match="x holds no tokens"):
            layer(x)
    with pytest.raises(TypeError, match="cache must be an nsa.attention.NSACache or None, got dict"):
        layer(torch.randn(2, 10, 64), {})
    cache = NSACache()
    layer(torch.randn(2, 10, 64), cache)
    with pytest.raises(ValueError, match="x's batch of 3 continues a cache of batch 2"):
        layer(torch.randn(3, 1, 64), cache)
    with pytest.raises(ValueError, match=r"rope must be the \(cos, sin\) tables of x's positions, each a "
                                         r"floating-point \[10, 8\]"):
        layer(torch.randn(2, 10, 64), None, layer.rope(0, 9, torch.device("cpu"), torch.float32))
    rope = layer.rope(0, 10, torch.device("cpu"), torch.float32)
    assert layer(torch.randn(2, 10, 64), None, rope).shape == (2, 10, 64)
    # a third table, and integer tables (accepted: they rotated by wrong angles), named with what came
    with pytest.raises(ValueError, match=r"got \['\[10, 8\] torch.float32', '\[10, 8\] torch.float32', 'NoneType'\]"):
        layer(torch.randn(2, 10, 64), None, (*rope, None))
    with pytest.raises(ValueError, match=r"got \['\[10, 8\] torch.int64', '\[10, 8\] torch.int64'\]"):
        layer(torch.randn(2, 10, 64), None, tuple(t.long() for t in rope))
    # x of another dtype than the parameters (outside autocast), or not floating point, named
    for x in (torch.randn(2, 10, 64, dtype=torch.float64), torch.ones(2, 10, 64, dtype=torch.int64)):
        with pytest.raises(TypeError, match=f"x is {x.dtype}, the layer's parameters torch.float32"):
            layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts x as it casts the weights
        assert layer(torch.randn(2, 10, 64, dtype=torch.float64)).dtype == torch.bfloat16


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_inputs_on_another_device_or_not_tensors_are_refused_by_name(kind):
    """x on another device than the layer failed in the projection's matmul as "Tensor on device
    cpu is not on the expected device meta!" (and RoPE tables on another device likewise), naming
    neither x nor the tables; a list for x failed as "'list' object has no attribute 'dim'"."""
    layer = _layer(kind)
    with pytest.raises(ValueError, match="x is on meta, the layer's parameters on cpu: move x or the layer to one "
                                         "device"):
        layer(torch.randn(2, 10, 64, device="meta"))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor \[batch, tokens, 64\], got list"):
        layer([[0.0] * 64])
    rope = layer.rope(0, 10, torch.device("meta"), torch.float32)
    with pytest.raises(ValueError, match=r"on x's device \(cpu\) .*got \['\[10, 8\] torch.float32 on meta', "
                                         r"'\[10, 8\] torch.float32 on meta'\]"):
        layer(torch.randn(2, 10, 64), None, rope)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_a_mask_where_the_cache_goes_is_told_there_is_no_mask(kind):
    """An attention mask passed as the second argument, where other attention layers take it,
    was refused as "cache must be an nsa.attention.NSACache or None, got Tensor" alone: the user
    was left to guess that the layer takes no mask at all."""
    with pytest.raises(TypeError, match=r"cache must be an nsa.attention.NSACache or None, got Tensor \(the layer "
                                        r"takes no attention mask or position ids"):
        _layer(kind)(torch.randn(2, 10, 64), torch.ones(2, 10, dtype=torch.bool))


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_a_cache_of_a_layer_of_another_shape_is_refused_by_name(kind):
    """Another layer's cache (other KV heads or head dim) failed in the cache's concatenation:
    'Sizes of tensors must match except in dimension 1', which names neither the cache nor the shapes."""
    cache = NSACache()
    _layer(kind)(torch.randn(2, 10, 64), cache)
    for n_kv, head_dim in ((1, 16), (2, 8)):
        with pytest.raises(ValueError, match=f"the cache holds 2 KV heads of head dim 16, this layer {n_kv} of "
                                             f"{head_dim}: give each layer its own cache"):
            kind(64, 4, n_kv, head_dim, CFG)(torch.randn(2, 1, 64), cache)


@pytest.mark.parametrize("second", [NSAAttention, DenseAttention])
@pytest.mark.parametrize("first", [NSAAttention, DenseAttention])
def test_one_cache_shared_by_two_layers_of_one_shape_is_refused(first, second):
    """Two layers of the same shape took one cache without a word: the second attended the first's
    keys and values as its own (and a dense layer an NSA layer's streams), a wrong result."""
    torch.manual_seed(0)
    a, b = first(64, 4, 2, 16, CFG), second(64, 4, 2, 16, CFG)
    cache = NSACache()
    a(torch.randn(2, 10, 64), cache)
    with pytest.raises(ValueError, match="the cache holds the keys and values of another layer .*give each layer its "
                                         "own cache"):
        b(torch.randn(2, 1, 64), cache)
    a(torch.randn(2, 1, 64), cache)  # its own layer goes on with it
    assert cache.length == 11


@pytest.mark.parametrize("fields, error, match", [
    (dict(length=-1), ValueError, r"NSACache.length \(the positions cached; 0 for a new cache\) must be an integer "
                                  r">= 0, got -1"),
    (dict(length=1.5), ValueError, r"NSACache.length .* must be an integer >= 0, got 1.5"),
    (dict(length=5), ValueError, r"NSACache.length=5, but its tokens hold 0 positions: a new cache is NSACache\(\)"),
    (dict(tokens="k"), TypeError, r"NSACache.tokens must be a dict of name -> \[batch, length, KV heads, head dim\] "
                                  r"tensors \(empty for a new cache\), got str"),
    (dict(kc=torch.zeros(2, 3, 2, 16)), TypeError, "NSACache.kc and NSACache.vc must both be None .* got Tensor and "
                                                   "NoneType"),
    (dict(kc=torch.zeros(2, 3, 2, 16), vc=torch.zeros(2, 3, 2, 16)), ValueError,
     "NSACache.kc and NSACache.vc hold compressed tokens, but the cache holds no keys"),
])
def test_a_cache_of_nonsense_fields_is_refused_by_name(fields, error, match):
    """NSACache(length=-1) was taken, and the layer rotated the next tokens to positions -1.. and
    returned a result; length=5 without keys failed in a broadcast ("The size of tensor a (25)
    must match the size of tensor b (20)"), tokens='k' as "'str' object has no attribute
    'values'", and compressed tokens without the keys they summarise were attended silently."""
    with pytest.raises(error, match=match):
        NSACache(**fields)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_a_cache_whose_length_was_changed_by_hand_is_refused_at_the_call(kind):
    """The cache's fields are checked as the layer finds them at each call: a length reset to 0
    (to reuse a cache) rotated the next token to position 0 against 10 cached keys, silently."""
    layer, cache = _layer(kind), NSACache()
    layer(torch.randn(2, 10, 64), cache)
    cache.length = 0
    with pytest.raises(ValueError, match="NSACache.length=0, but its tokens hold 10 positions"):
        layer(torch.randn(2, 1, 64), cache)


def _hand_built(cache: NSACache, kc: torch.Tensor | None, vc: torch.Tensor | None) -> NSACache:
    """A cache built by hand from another's keys, with the compressed tokens given."""
    return NSACache(tokens={name: t.clone() for name, t in cache.tokens.items()}, kc=kc, vc=vc, length=cache.length)


@pytest.mark.parametrize("phi", ["mlp", "mean"])
def test_compressed_tokens_that_the_cache_s_length_does_not_make_are_refused_by_name(phi):
    """A cache built by hand whose compressed tokens are not the blocks its length makes (l=8
    every d=4 of 19 positions: 3) was taken: the layer compresses only the blocks after those
    held, so one too many was attended as a block of the wrong positions, silently (a result off
    by ~0.03), and compressed tokens of other KV heads, or a vc of another count than kc, failed in
    torch.cat, naming no field."""
    torch.manual_seed(0)
    layer = NSAAttention(64, 4, 2, 16, dataclasses.replace(CFG, phi=phi))
    x = torch.randn(2, 20, 64)
    with torch.no_grad():
        want = layer(x)[:, 19:]
        cache = NSACache()
        layer(x[:, :19], cache)
        kc, vc = cache.kc, cache.vc
        assert kc.shape == vc.shape == (2, 3, 2, 16)
        cases = [
            (kc[:, :2], vc[:, :2], "kc", r"\[2, 2, 2, 16\] \(2 compressed tokens\)"),
            (torch.cat([kc, kc[:, -1:]], 1), torch.cat([vc, vc[:, -1:]], 1), "kc", r"\[2, 4, 2, 16\] \(4 compressed tokens\)"),
            (kc[:, :0], vc[:, :0], "kc", r"\[2, 0, 2, 16\] \(0 compressed tokens\)"),
            (kc, torch.cat([vc, vc[:, -1:]], 1), "vc", r"\[2, 4, 2, 16\] \(4 compressed tokens\)"),
            (kc[:, :, :1], vc[:, :, :1], "kc", r"\[2, 3, 1, 16\] \(3 compressed tokens\)"),
            (kc[0], vc[0], "kc", r"\[3, 2, 16\]"),
        ]
        for bad_kc, bad_vc, name, held in cases:
            with pytest.raises(ValueError, match=rf"NSACache.{name} holds {held}, but NSACache.length=19 and its keys "
                                                 r"\[2, 19, 2, 16\] imply \[2, 3, 2, 16\]: 3 compressed tokens, the "
                                                 r"blocks of attn.cmp_block=8 positions every attn.cmp_stride=4 that "
                                                 r"fit whole in 19"):
                layer(x[:, 19:], _hand_built(cache, bad_kc.clone(), bad_vc.clone()))
        # the compressed tokens the length makes, or none yet (the layer makes them all), go on
        # as the layer's own cache does
        for given in ((kc.clone(), vc.clone()), (None, None)):
            torch.testing.assert_close(layer(x[:, 19:], _hand_built(cache, *given)), want)
        torch.testing.assert_close(layer(x[:, 19:], cache), want)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_rope_tables_of_nonsense_positions_are_refused_by_name(kind):
    """attn.rope(start, T, device, dtype), the tables a model makes once for its layers, took a
    negative or fractional start (tables of positions no token has, which the layer took), and
    an integer dtype (tables the layer refused later, naming the tables, not the call); T=-1 failed
    in torch.arange ("upper bound and lower bound inconsistent with step sign")."""
    layer, cpu = _layer(kind), torch.device("cpu")
    for start in (-5, 1.5, None):
        with pytest.raises(ValueError, match=rf"start \(the first position\) must be an integer >= 0, got {start!r}"):
            layer.rope(start, 10, cpu, torch.float32)
    for T in (-1, 0, True):
        with pytest.raises(ValueError, match=rf"T \(the number of positions\) must be an integer >= 1, got {T!r}"):
            layer.rope(0, T, cpu, torch.float32)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype .* got torch.int64"):
        layer.rope(0, 10, cpu, torch.int64)
    np = pytest.importorskip("numpy")
    cos, sin = layer.rope(np.int64(3), np.int64(10), cpu, torch.float32)  # any integer, as the constructor takes
    assert cos.shape == sin.shape == (10, 8)


def test_project_refuses_what_forward_refuses_by_name():
    """attn.project(x, start), the guide's way to check a layer against the oracle, took x
    unchecked: a wrong last dim failed in the matmul ("mat1 and mat2 shapes cannot be multiplied"),
    a 2-d x as "not enough values to unpack", another dtype as "expected m1 and m2 to have the same
    dtype", another device as "Tensor on device cpu is not on the expected device meta!"; a
    negative start rotated to positions no token has."""
    layer = _layer(NSAAttention)
    for x in (torch.randn(2, 10, 63), torch.randn(10, 64)):
        with pytest.raises(ValueError, match=r"x must be \[batch, tokens, 64\]"):
            layer.project(x, 0)
    with pytest.raises(TypeError, match="x is torch.float64, the layer's parameters torch.float32"):
        layer.project(torch.randn(2, 10, 64, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="x is on meta, the layer's parameters on cpu"):
        layer.project(torch.randn(2, 10, 64, device="meta"), 0)
    with pytest.raises(ValueError, match=r"start \(the position of x's first token\) must be an integer >= 0, got -1"):
        layer.project(torch.randn(2, 10, 64), -1)
    with pytest.raises(ValueError, match=r"rope must be the \(cos, sin\) tables of x's positions"):
        layer.project(torch.randn(2, 10, 64), 0, layer.rope(0, 9, torch.device("cpu"), torch.float32))
    q, kv, gates = layer.project(torch.randn(2, 10, 64), 3)
    assert q.shape == (2, 10, 4, 16) and len(kv) == 6 and gates.shape == (2, 10, 4, 3)


def test_a_cache_saves_and_copies_and_goes_on_with_the_layer_that_loads_it(tmp_path):
    """The layer a cache holds a weak reference to does not pickle: torch.save of a decode cache
    failed. A saved or copied cache is no layer's until one uses it."""
    import copy

    layer = _layer(NSAAttention)
    cache = NSACache()
    with torch.no_grad():
        layer(torch.randn(2, 10, 64), cache)
        torch.save(cache, tmp_path / "cache.pt")
        loaded = torch.load(tmp_path / "cache.pt", weights_only=False)
        copied = copy.deepcopy(cache)
        x = torch.randn(2, 1, 64)
        want = layer(x, cache)
        for other in (loaded, copied):
            assert other.owner is None
            torch.testing.assert_close(layer(x, other), want, rtol=0, atol=0)


def test_an_nsa_layer_refuses_what_only_the_model_or_another_layer_takes():
    """NSAAttention ran a config of kind 'dense' as NSA (no word of it), took any graph_tokens
    (None failed at the first call's comparison, 1.5 was taken), and a head dim the kernels do not
    take on their routes (the model config refused it); NSAConfig(n_selected=0) said '>= 1', and 1
    then '>= 3'."""
    args = dict(dim=64, n_heads=4, n_kv_groups=2, head_dim=16, cfg=CFG)
    with pytest.raises(ValueError, match="cfg.kind='dense': NSAAttention is the NSA layer; the dense baseline"):
        NSAAttention(**args | dict(cfg=dataclasses.replace(CFG, kind="dense")))
    for tokens in (None, "16k", 1.5, -1, True):
        with pytest.raises(ValueError, match=rf"graph_tokens \(the most tokens a layer graphs\) must be an integer >= 0 "
                                             rf"\(0: never\), got {tokens!r}"):
            NSAAttention(**args, graph_tokens=tokens)
    wide = dict(dim=512, n_heads=1, n_kv_groups=1, head_dim=512)
    with pytest.raises(ValueError, match="head_dim=512: the NSA kernels take head dims up to 256"):
        NSAAttention(**args | wide)  # 'auto' routes to them on CUDA
    torch_only = dataclasses.replace(CFG, backend_cmp="torch", backend_sel="torch", backend_win="torch")
    NSAAttention(**args | wide | dict(cfg=torch_only))
    for n in (0, 1):
        with pytest.raises(ValueError, match=f"attn.n_selected={n} must be >= 3"):
            dataclasses.replace(CFG, n_selected=n)


@pytest.mark.parametrize("kind", [NSAAttention, DenseAttention])
def test_a_layer_built_on_the_meta_device_and_reset_is_the_layer_built_directly(kind):
    """The usual way to build a large model: on the meta device, then ``to_empty`` (which leaves
    whatever the memory held: the compressors' position embeddings, the gate bias, the call
    counter) and ``reset_parameters``: the same values, bit for bit, as the layer built directly
    under the same seed, drawn in the constructor's order."""
    torch.manual_seed(5)
    direct = kind(64, 4, 2, 16, CFG)
    torch.manual_seed(5)
    with torch.device("meta"):
        layer = kind(64, 4, 2, 16, CFG)
    layer.to_empty(device="cpu")
    for t in (*layer.parameters(), *layer.buffers()):
        t.data.fill_(123)  # what to_empty may leave
    layer.reset_parameters()
    want = dict(direct.named_parameters()) | dict(direct.named_buffers())
    got = dict(layer.named_parameters()) | dict(layer.named_buffers())
    assert want.keys() == got.keys()
    for name, t in got.items():
        assert torch.equal(t, want[name]), name
    x = torch.randn(1, 40, 64)
    assert torch.equal(layer(x), direct(x))


def test_resetting_every_module_parent_first_keeps_the_gate_bias_at_zero():
    """A meta-device initialisation that resets every module of a model in turn, the parent before
    its children (``for m in model.modules(): m.reset_parameters()``), reset the gates' Linear after
    the layer had zeroed its bias: the gates started at random values instead of 0.5."""
    with torch.device("meta"):
        model = torch.nn.Sequential(NSAAttention(64, 4, 2, 16, CFG))
    model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    assert torch.equal(model[0].gate_proj.bias, torch.zeros(12))


@pytest.mark.parametrize("overrides", [[], ["model.tie_embeddings=false"], ["model.attn.kind=dense"]])
def test_a_model_built_on_the_meta_device_and_reset_is_the_model_built_directly(overrides):
    """NSATransformer.reset_parameters after ``to_empty`` gives the directly built model's values
    under the same seed (the norms' ones, the gate biases' zeros, the depth-scaled output
    projections), ties the embeddings again (``to_empty`` unties them), and a built model reset
    under the seed starts over from the same values."""
    from nsa.model.config import load_model_config
    from nsa.model.model import NSATransformer

    cfg = load_model_config("tiny", overrides)
    torch.manual_seed(11)
    direct = NSATransformer(cfg)
    torch.manual_seed(11)
    with torch.device("meta"):
        model = NSATransformer(cfg)
    model.to_empty(device="cpu")
    model.reset_parameters()
    assert (model.head.weight is model.embed.weight) == cfg.tie_embeddings
    want = direct.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(t, want[name]), name
    torch.manual_seed(11)
    direct.reset_parameters()
    for name, t in direct.state_dict().items():
        assert torch.equal(t, want[name]), name


@pytest.mark.parametrize("recompute", [False, True])
def test_a_model_on_the_meta_device_runs_forward_and_backward(monkeypatch, recompute):
    """Autocast knows no meta device (torch.is_autocast_enabled("meta") raises): a layer asks
    whether autocast applies before it asks whether it is on. Also on the recomputing path."""
    from nsa.attention import compress
    from nsa.model.config import load_model_config
    from nsa.model.model import NSATransformer

    if recompute:
        monkeypatch.setattr(compress, "RECOMPUTE_TOKENS", 64)
    cfg = load_model_config("tiny", [])
    with torch.device("meta"):
        model = NSATransformer(cfg)
    logits = model(torch.randint(0, cfg.vocab_size, (2, 300), device="meta"))
    assert logits.shape == (2, 300, cfg.vocab_size) and logits.is_meta
    logits.float().mean().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
