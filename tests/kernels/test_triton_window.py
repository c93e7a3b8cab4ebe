"""Triton sliding-window attention (band kernel) against the PyTorch window branch in float64,
forward and backward."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import torch_win_attention
from tests.kernels._util import (
    INTERP_SETTINGS,
    KCase,
    check_against_reference,
    kcases,
    rnd,
)

pytestmark = pytest.mark.triton_interp


def _check(kdev, case: KCase):
    from nsa.attention.kernel_branches import triton_win_attention

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Tk = case.B, case.T, case.H, case.G, case.K, case.Tk
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    v = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    do = rnd(gen, B, T, H * G, K, device=kdev)
    check_against_reference(lambda *x: triton_win_attention(*x, case.cfg, case.q_start),
                            lambda *x: torch_win_attention(*x, case.cfg, case.q_start), [q, k, v], do)


@INTERP_SETTINGS
@given(case=kcases())
def test_window_matches_torch(kdev, case):
    _check(kdev, case)


def test_window_longer_than_sequence_and_width_one(kdev):
    for w in (1, 100):
        cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=w)
        _check(kdev, KCase(cfg, B=1, T=40, H=2, G=3, K=16, q_start=3, seed=w))


def test_window_with_whole_tiles(kdev):
    """Long enough that the kernels skip the visibility mask on the tiles every row of a block
    sees whole (interpreter tiles: 16 keys, and 16 rows in dk/dv), next to masked edge tiles."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, n_selected=4, window=100)
    _check(kdev, KCase(cfg, B=1, T=260, H=2, G=3, K=16, q_start=5, seed=7))
