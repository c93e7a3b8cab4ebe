"""Triton sliding-window attention (band kernel) against the PyTorch window branch in float64,
forward and backward."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import torch_win_attention
from tests.kernels._util import INTERP_SETTINGS, KCase, assert_close, kcases, rnd

pytestmark = pytest.mark.triton_interp


def _check(kdev, case: KCase):
    from nsa.kernels.window import triton_win_attention

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Tk = case.B, case.T, case.H, case.G, case.K, case.Tk
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    v = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    do = rnd(gen, B, T, H * G, K, device=kdev)
    o = triton_win_attention(q, k, v, case.cfg, case.q_start)
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    o_ref = torch_win_attention(*refs, case.cfg, case.q_start)
    tol = 2e-5 if kdev.type == "cpu" else 5e-3
    assert_close(o, o_ref, tol, "o")
    grads = torch.autograd.grad(o, (q, k, v), do)
    grads_ref = torch.autograd.grad(o_ref, refs, do.double().cpu())
    for name, g, gr in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert_close(g, gr, tol, name)


@INTERP_SETTINGS
@given(case=kcases())
def test_window_matches_torch(kdev, case):
    _check(kdev, case)


def test_window_longer_than_sequence_and_width_one(kdev):
    for w in (1, 100):
        cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=w)
        _check(kdev, KCase(cfg, B=1, T=40, H=2, G=3, K=16, q_start=3, seed=w))
