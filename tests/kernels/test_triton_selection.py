"""Triton selected-block attention against the PyTorch branch in float64 with the same
selected indices (forward and backward), any group size."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import torch_cmp_attention, torch_sel_attention, torch_select_blocks
from tests.kernels._util import INTERP_SETTINGS, KCase, assert_close, kcases, rnd

pytestmark = pytest.mark.triton_interp


def _check(kdev, case: KCase):
    from nsa.kernels.selection import triton_sel_attention

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Tk, Nc = case.B, case.T, case.H, case.G, case.K, case.Tk, case.Nc
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    v = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    kc = rnd(gen, B, Nc, H, K, device="cpu", dtype=torch.float64)
    do = rnd(gen, B, T, H * G, K, device=kdev)
    q64 = q.detach().double().cpu()
    _, lse = torch_cmp_attention(q64, kc, kc, case.cfg, case.q_start)
    idx = torch_select_blocks(q64, kc, lse, case.cfg, case.q_start)
    o = triton_sel_attention(q, k, v, idx.to(kdev), case.cfg, case.q_start)
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    o_ref = torch_sel_attention(*refs, idx, case.cfg, case.q_start)
    tol = 2e-5 if kdev.type == "cpu" else 5e-3
    assert_close(o, o_ref, tol, "o")
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, refs, do.double().cpu())
    for name, g, gr in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert_close(g, gr, tol, name)


@INTERP_SETTINGS
@given(case=kcases())
def test_selection_matches_torch(kdev, case):
    _check(kdev, case)


@pytest.mark.parametrize("G", [6, 16], ids=["G6", "G16"])
def test_selection_group_sizes_and_popular_block(kdev, G):
    """Block 0 is chosen by every query: its dk/dv is split over several work items."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=8)
    _check(kdev, KCase(cfg, B=1, T=70 if G == 6 else 30, H=1, G=G, K=16, q_start=0, seed=G))
