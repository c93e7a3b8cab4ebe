"""NSAAttention with every NSA stage on the Triton kernels (and so the RoPE/split kernel and the
compressors' MLP kernel) against the same layer in float64 on the PyTorch path, which
tests/unit/test_nsa_oracle.py holds to the float64 oracle: the output and the gradients of the
input and of every parameter, a prefill; and a decode that continues a cache (a prefix, then a
chunk of several queries at q_start > 0, then one query at a time), whose outputs are the
prefill's. Lengths that are no multiple of any block, head dims and group sizes that are no
powers of two, a batch of three different sequences."""
from __future__ import annotations

import pytest
import torch

from nsa.attention import NSAAttention, NSACache
from nsa.attention.config import NSAConfig
from tests.kernels._util import assert_close

pytestmark = pytest.mark.triton_interp

ROUTES = ("backend_cmp", "backend_sel", "backend_win")


def _layers(kdev, cfg: NSAConfig, dim: int, HQ: int, H: int, K: int, seed: int):
    """The float64 layer on the PyTorch path (random position embeddings and gate biases, so
    that every parameter matters) and a float32 copy of it on the Triton routes."""
    torch.manual_seed(seed)
    ref = NSAAttention(dim, HQ, H, K, NSAConfig(**{**cfg.__dict__, **dict.fromkeys(ROUTES, "torch")}),
                       graph_tokens=0)
    with torch.no_grad():
        for c in ref.compressors:
            if c.kind == "mlp":
                c.pos.normal_()
        ref.gate_proj.bias.normal_()
    ref = ref.double()
    layer = NSAAttention(dim, HQ, H, K, NSAConfig(**{**cfg.__dict__, **dict.fromkeys(ROUTES, "triton")}),
                         graph_tokens=0).to(kdev)
    layer.load_state_dict({name: t.float() for name, t in ref.state_dict().items()})
    return ref, layer


def _tol(kdev) -> float:
    return 2e-5 if kdev.type == "cpu" else 5e-3


# id: (config, B, T, query heads, KV heads, head dim, deterministic)
PREFILL = {
    "mlp-G5-K48-B3": (NSAConfig(cmp_block=4, cmp_stride=2, sel_block=6, n_selected=3, window=5), 3, 23, 5, 1, 48,
                      False),
    "mean-G3-H2-blocks-deterministic": (NSAConfig(cmp_block=6, cmp_stride=3, sel_block=6, n_selected=4, window=9,
                                                  phi="mean", sel_form="blocks"), 2, 29, 6, 2, 16, True),
    # the seeds' heads at the paper's blocks: the selected branch's token tiles hold 64 rows (8 tokens of
    # 6 heads padded to 8) at head dim 64, the tile Triton 3.6 compiled at 8 warps (seen at G=5) into a
    # kernel reading past its shared memory
    "m7c-heads-G6-K64": (NSAConfig(), 1, 128, 12, 2, 64, False),
}
#: cases run on the GPU only (about 50 s each under the CPU interpreter, which compiles no sm_90 code)
GPU_ONLY = {"m7c-heads-G6-K64"}


@pytest.mark.parametrize("case", [pytest.param(case, id=name, marks=pytest.mark.gpu if name in GPU_ONLY else ())
                                  for name, case in PREFILL.items()])
def test_layer_on_the_kernels_matches_the_float64_layer(kdev, case):
    cfg, B, T, HQ, H, K, deterministic = case
    ref, layer = _layers(kdev, cfg, 24, HQ, H, K, seed=T)
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(B, T, 24, generator=gen, dtype=torch.float64)  # each sequence its own content
    do = torch.randn(B, T, 24, generator=gen, dtype=torch.float64)
    x_ref, x32 = x.clone().requires_grad_(), x.float().to(kdev).requires_grad_()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        y = layer(x32)
        names = [n for n, _ in ref.named_parameters()]
        params = dict(layer.named_parameters())
        grads = torch.autograd.grad(y, [x32, *(params[n] for n in names)], do.float().to(kdev))
    finally:
        torch.use_deterministic_algorithms(before)
    y_ref = ref(x_ref)
    grads_ref = torch.autograd.grad(y_ref, [x_ref, *ref.parameters()], do)
    tol = _tol(kdev)
    assert_close(y, y_ref, tol, "y")
    for name, g, g_ref in zip(["x", *names], grads, grads_ref):
        assert_close(g, g_ref, tol, f"d{name}")


# id: (config, B, S, query heads, KV heads, head dim, where the calls start)
DECODE = {
    "mlp-G3-H2": (NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=6), 2, 27, 6, 2, 16,
                  (0, 13, 25, 26)),
    "mean-G7-K40-blocks": (NSAConfig(cmp_block=3, cmp_stride=3, sel_block=6, n_selected=3, window=4, phi="mean",
                                     sel_form="blocks"), 1, 31, 7, 1, 40, (0, 11, 12, 30)),
}


@pytest.mark.parametrize("case", list(DECODE.values()), ids=list(DECODE))
def test_decode_on_the_kernels_gives_the_float64_prefill(kdev, case):
    """A prefix, then a chunk of queries at q_start > 0, then single queries, through one cache:
    the outputs of the float64 layer's prefill of the whole sequence, at every position."""
    cfg, B, S, HQ, H, K, starts = case
    ref, layer = _layers(kdev, cfg, 16, HQ, H, K, seed=S)
    x = torch.randn(B, S, 16, generator=torch.Generator().manual_seed(S), dtype=torch.float64)
    cache = NSACache()
    with torch.no_grad():
        want = ref(x)
        got = torch.cat([layer(x[:, a:b].float().to(kdev), cache=cache)
                         for a, b in zip(starts, [*starts[1:], S])], dim=1)
    assert cache.length == S
    assert_close(got, want, _tol(kdev), "decoded y")
