"""Triton compressed attention (o and lse, forward and backward) against the PyTorch branch in
float64: interpreted on CPU (float32), natively on a GPU box."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import torch_cmp_attention
from nsa.kernels.tuning import BandTiles
from tests.kernels._util import INTERP_SETTINGS, KCase, assert_close, kcases, rnd

pytestmark = pytest.mark.triton_interp


def _tol(dev):
    return 2e-5 if dev.type == "cpu" else 5e-3  # fp32 dots are tf32 on the GPU


def _check(kdev, case: KCase, tuning=None):
    from nsa.attention.kernel_branches import triton_cmp_attention

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Nc = case.B, case.T, case.H, case.G, case.K, case.Nc
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    kc = rnd(gen, B, Nc, H, K, device=kdev).requires_grad_()
    vc = rnd(gen, B, Nc, H, K, device=kdev).requires_grad_()
    do = rnd(gen, B, T, H * G, K, device=kdev)
    o, lse = triton_cmp_attention(q, kc, vc, case.cfg, case.q_start,
                                  **({} if tuning is None else dict(tuning=tuning)))
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, kc, vc)]
    o_ref, lse_ref = torch_cmp_attention(*refs, case.cfg, case.q_start)
    tol = _tol(kdev)
    assert lse.dtype == torch.float32 and not lse.requires_grad
    none = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse).cpu(), none), "rows with no visible compressed token differ"
    assert (lse.cpu()[none] < 0).all()
    assert (o.detach().cpu()[none.unsqueeze(-1).expand_as(o)] == 0).all(), "empty rows must be zero"
    if o_ref.abs().sum() > 0:
        assert_close(o, o_ref, tol, "o")
        assert_close(lse[~none.to(lse.device)], lse_ref[~none], tol, "lse")
    grads = torch.autograd.grad(o, (q, kc, vc), do, allow_unused=True)
    grads_ref = torch.autograd.grad(o_ref, refs, do.double().cpu(), allow_unused=True)
    for name, g, gr in zip(("dq", "dkc", "dvc"), grads, grads_ref):
        if gr is not None and gr.abs().sum() > 0:
            assert_close(g, gr, tol, name)


@INTERP_SETTINGS
@given(case=kcases())
def test_cmp_matches_torch(kdev, case):
    _check(kdev, case)


@pytest.mark.parametrize("T,q_start", [(5, 0), (40, 0), (1, 37)], ids=["no-visible", "prefill", "decode"])
def test_cmp_edge_cases(kdev, T, q_start):
    """Queries before the first full block get zero and lse=-inf; a single decode query."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=8)
    _check(kdev, KCase(cfg, B=1, T=T, H=2, G=3, K=16, q_start=q_start, seed=T))


def test_cmp_with_whole_tiles(kdev):
    """Enough compressed keys (65 per query at the end) that the kernels skip the visibility
    mask on the tiles every row of a block sees whole, next to masked edge tiles."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=8)
    _check(kdev, KCase(cfg, B=1, T=260, H=2, G=3, K=16, q_start=5, seed=3))


@pytest.mark.parametrize("tiles", [BandTiles(dkv_waves=1), BandTiles(dkv_waves=64)], ids=["one-wave", "many-splits"])
def test_cmp_dkv_splits_agree(kdev, tiles):
    """The dk/dv pass with one program a key tile and with its rows split over many: the same
    attention and gradients."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=8)
    _check(kdev, KCase(cfg, B=2, T=130, H=2, G=3, K=16, q_start=0, seed=4), tiles)
