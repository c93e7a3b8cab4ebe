"""The cuDNN compressed branch (nsa.kernels.cudnn_compressed) against the PyTorch branch: the fold
of d-query runs into a batch of causal attentions, the zero head, the band-kernel tail and
the hand-off below CUDNN_MIN_QUERIES. On a GPU the real cuDNN kernel runs in bf16; on the CPU
(Triton interpreter for the band tail) a float32 math stand-in replaces only the fused call, so
the index arithmetic around it is tested in CI."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import torch_cmp_attention, visible_compressed
from tests.kernels._util import assert_close, rnd

pytestmark = pytest.mark.triton_interp


def _math_scores(q, k, scale):
    """Top-left causal attention scores, -inf above the diagonal, [batch, heads, R, R]."""
    s = torch.einsum("bhqk,bhnk->bhqn", q, k) * scale
    R = s.shape[-1]
    mask = torch.ones(R, R, dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~mask, float("-inf"))


def _math_causal(q, k, v, scale):
    """What cuDNN computes, in plain torch: top-left causal attention and its lse."""
    s = _math_scores(q, k, scale)
    return torch.einsum("bhqn,bhnk->bhqk", torch.softmax(s, -1), v), torch.logsumexp(s, -1).unsqueeze(-1)


def _math_causal_backward(do, q, k, v, o, state, scale):
    """Its gradients in closed form (the op's backward runs below autograd, so not through it),
    from the o the fold saved and cuDNN's lse made again from the fold's (state[0])."""
    s = _math_scores(q, k, scale)
    torch.testing.assert_close(torch.logsumexp(s, -1).unsqueeze(-1), state[0])
    p = torch.softmax(s, -1)
    torch.testing.assert_close(torch.einsum("bhqn,bhnk->bhqk", p, v), o)
    dp = torch.einsum("bhqk,bhnk->bhqn", do, v)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    return (torch.einsum("bhqn,bhnk->bhqk", ds, k) * scale, torch.einsum("bhqn,bhqk->bhnk", ds, q) * scale,
            torch.einsum("bhqn,bhqk->bhnk", p, do))


def fold_every_length(kdev, monkeypatch) -> None:
    """The cuDNN compressed branch folds even tiny sequences; on the CPU the math stand-in
    replaces the fused call."""
    import nsa.kernels
    from nsa.kernels import cudnn_compressed

    monkeypatch.setattr(nsa.kernels, "CUDNN_MIN_QUERIES", 1)
    monkeypatch.setattr(nsa.kernels, "CUDNN_MIN_ELEMENTS", 1)
    if kdev.type == "cpu":
        monkeypatch.setattr(cudnn_compressed, "_fused_causal", _math_causal)
        monkeypatch.setattr(cudnn_compressed, "_fused_causal_backward", _math_causal_backward)


@pytest.fixture
def cudnn_cmp(kdev, monkeypatch):
    fold_every_length(kdev, monkeypatch)
    from nsa.attention.kernel_branches import cudnn_cmp_attention

    return cudnn_cmp_attention


CASES = {  # id: (cfg, B, T, HQ, H, K, q_start)
    "paper-cfg-tail1": (NSAConfig(), 1, 2 * 16 + 32, 4, 2, 16, 0),
    "whole-runs": (NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4), 1, 7 + 4 * 9, 6, 2, 16, 0),
    "B2-G3-tail": (NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4), 2, 61, 6, 2, 16, 0),
    "l-equals-d": (NSAConfig(cmp_block=4, cmp_stride=4, sel_block=8, n_selected=4), 1, 30, 2, 1, 8, 0),
    "too-short": (NSAConfig(), 1, 20, 4, 2, 16, 0),
    "decode": (NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4), 1, 3, 6, 2, 16, 41),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_cudnn_cmp_matches_torch(kdev, cudnn_cmp, case):
    cfg, B, T, HQ, H, K, q_start = case
    gpu = kdev.type == "cuda"
    if gpu and not torch.backends.cudnn.is_available():
        pytest.skip("cuDNN is not available")
    dtype = torch.bfloat16 if gpu else torch.float32
    Nc = int(visible_compressed(torch.tensor([q_start + T - 1]), cfg).item())
    gen = torch.Generator().manual_seed(T * 31 + HQ)
    q = rnd(gen, B, T, HQ, K, device=kdev, dtype=dtype).requires_grad_()
    kc = rnd(gen, B, max(Nc, 1), H, K, device=kdev, dtype=dtype).requires_grad_()
    vc = rnd(gen, B, max(Nc, 1), H, K, device=kdev, dtype=dtype).requires_grad_()
    do = rnd(gen, B, T, HQ, K, device=kdev, dtype=dtype)
    o, lse = cudnn_cmp(q, kc, vc, cfg, q_start)
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, kc, vc)]
    o_ref, lse_ref = torch_cmp_attention(*refs, cfg, q_start)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
    assert lse.dtype == torch.float32 and not lse.requires_grad
    none = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse).cpu(), none), "rows with no visible compressed token differ"
    assert (o.detach().cpu()[none.unsqueeze(-1).expand_as(o)] == 0).all(), "empty rows must be zero"
    tol = 5e-3 if gpu else 2e-5
    assert_close(o, o_ref, tol, "o")
    assert_close(lse[~none.to(lse.device)], lse_ref[~none], tol, "lse")
    grads = torch.autograd.grad(o, (q, kc, vc), do)
    grads_ref = torch.autograd.grad(o_ref, refs, do.double().cpu())
    for name, g, gr in zip(("dq", "dkc", "dvc"), grads, grads_ref):
        assert_close(g, gr, tol, name)


def test_the_fold_keeps_q_only_as_a_saved_tensor(kdev, cudnn_cmp):
    """A layer may keep q as how to make it again (nsa.attention.remade): the fold then holds no
    view of q past the forward (its band-kernel tail included), and the gradients are the same."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    from nsa.attention.remade import Remaking

    cfg, B, T, HQ, H, K, q_start = CASES["paper-cfg-tail1"]
    dtype = torch.bfloat16 if kdev.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(5)
    leaves = [rnd(gen, B, n, h, K, device=kdev, dtype=dtype).requires_grad_() for n, h in ((T, HQ), (2, H), (2, H))]
    do = rnd(gen, B, T, HQ, K, device=kdev, dtype=dtype)
    want = torch.autograd.grad(cudnn_cmp(leaves[0] * 1, *leaves[1:], cfg, q_start)[0], leaves, do)
    with Remaking() as remaking:
        q = leaves[0] * 1  # a tensor of the layer's own, as its projection makes q
        remaking.add(lambda: [leaves[0].detach() * 1], [q])
        o, _ = cudnn_cmp(q, *leaves[1:], cfg, q_start)
    ref = StorageWeakRef(q.untyped_storage())
    del q
    gc.collect()
    assert ref.expired(), "the fold holds q's memory"
    for g, w in zip(torch.autograd.grad(o, leaves, do), want):
        assert torch.equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("S", [8192, 32768 + 5])
def test_cudnn_cmp_long_bf16_parity(S):
    """The real fold at the sizes 'auto' sends to cuDNN (64 query heads, 4 KV heads, head dim
    128), bf16 against the float32 PyTorch path: relative RMS error <= 5e-3 on o, lse and the
    gradients. The float32 reference runs in query chunks (its memory stays linear in S)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nsa.attention.kernel_branches import cudnn_cmp_attention

    cfg = NSAConfig()
    B, HQ, H, K = 1, 64, 4, 128
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    gen = torch.Generator(device="cuda").manual_seed(S)
    x = {n: torch.randn(*shape, generator=gen, device="cuda").bfloat16()
         for n, shape in dict(q=(B, S, HQ, K), kc=(B, Nc, H, K), vc=(B, Nc, H, K), do=(B, S, HQ, K)).items()}
    leaves = [x[n].clone().requires_grad_() for n in ("q", "kc", "vc")]
    o, lse = cudnn_cmp_attention(*leaves, cfg)
    grads = torch.autograd.grad(o, leaves, x["do"])
    refs = [x[n].float().requires_grad_() for n in ("q", "kc", "vc")]
    chunk = 4096
    o_ref, lse_ref = [], []
    for a in range(0, S, chunk):
        oc, lc = torch_cmp_attention(refs[0][:, a:a + chunk], refs[1], refs[2], cfg, a)
        oc.backward(x["do"][:, a:a + chunk].float())
        o_ref.append(oc.detach())
        lse_ref.append(lc)
    o_ref, lse_ref = torch.cat(o_ref, 1), torch.cat(lse_ref, 1)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_close(o, o_ref, 5e-3, "o")
    assert_close(lse[finite], lse_ref[finite], 5e-3, "lse")
    for name, g, ref in zip(("dq", "dkc", "dvc"), grads, refs):
        assert_close(g, ref.grad, 5e-3, name)


def test_cudnn_cmp_under_torch_compile(kdev, cudnn_cmp):
    """torch.compile(fullgraph=True) keeps the fold as its custom op nsa::cmp_fold_fwd (decode
    takes the band kernel): output and gradients are those of the eager call bit for bit."""
    import torch._dynamo
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4)
    gen = torch.Generator().manual_seed(5)
    dtype = torch.bfloat16 if kdev.type == "cuda" else torch.float32
    q, kc, vc = (rnd(gen, 1, n, h, 16, device=kdev, dtype=dtype) for n, h in ((61, 6), (14, 2), (14, 2)))
    for q_start, qq, op in ((0, q, "cmp_fold_fwd"), (45, q[:, 45:], "band_fwd")):  # folded prefill, decode
        leaves = [t.clone().requires_grad_() for t in (qq, kc, vc)]
        torch._dynamo.reset()
        graphs = AotEagerAndRecordGraphs()
        compiled = torch.compile(lambda a, b, c: cudnn_cmp(a, b, c, cfg, q_start)[0], backend=graphs,
                                 fullgraph=True)
        o = compiled(*leaves)
        assert f"torch.ops.nsa.{op}.default" in graphs.fw_graphs[0].code
        eager_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        o_eager = cudnn_cmp(*eager_leaves, cfg, q_start)[0]
        assert torch.equal(o.detach(), o_eager.detach())
        grads = torch.autograd.grad(o.float().square().sum(), leaves)
        for name, g, g_eager in zip(("dq", "dkc", "dvc"), grads,
                                    torch.autograd.grad(o_eager.float().square().sum(), eager_leaves)):
            assert torch.equal(g, g_eager), name
