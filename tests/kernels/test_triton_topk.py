"""Triton fused importance scores + top-n against the PyTorch selection (computed in float64):
forced blocks, all-visible short prefixes, ascending -1-padded output, and the same chosen
blocks up to exact near-ties (a differing choice must have the same total score)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (
    _cmp_scores,
    overlap_kernel,
    torch_cmp_attention,
    torch_select_blocks,
)
from tests.kernels._util import INTERP_SETTINGS, KCase, kcases, rnd

pytestmark = pytest.mark.triton_interp


def block_scores(q, kc, lse, cfg: NSAConfig, q_start: int) -> torch.Tensor:
    """Group-summed importance of every selection block [B, Tq, H, NB], float64."""
    B, Tq, HQ, K = q.shape
    H = kc.shape[2]
    ls, d = cfg.sel_block, cfg.cmp_stride
    r, left = ls // d, cfg.cmp_block // d - 1
    w = overlap_kernel(cfg, dtype=torch.float64)
    nb = (q_start + Tq + ls - 1) // ls
    s, visible = _cmp_scores(q, kc, q_start, cfg)
    p = torch.exp(s - lse.view(B, Tq, H, HQ // H).unsqueeze(-1).clamp_min(-1e30))
    p = p.masked_fill(~visible[None, :, None, None, :], 0.0).sum(dim=3)
    need = (nb - 1) * r + len(w)
    p = F.pad(p, (left, max(0, need - left - p.shape[-1])))[..., :need]
    return p.unfold(-1, len(w), r) @ w


def _check(kdev, case: KCase, scale=2.0):
    from nsa.attention.kernel_branches import triton_select_blocks

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Nc, cfg = case.B, case.T, case.H, case.G, case.K, case.Nc, case.cfg
    q = rnd(gen, B, T, H * G, K, device="cpu", dtype=torch.float64)
    kc = rnd(gen, B, Nc, H, K, device="cpu", dtype=torch.float64, scale=scale)
    _, lse = torch_cmp_attention(q, kc, kc, cfg, case.q_start)
    ref = torch_select_blocks(q, kc, lse, cfg, case.q_start)
    got = triton_select_blocks(q.float().to(kdev), kc.float().to(kdev), lse.float().to(kdev), cfg,
                               case.q_start).cpu()
    assert got.shape == ref.shape and got.dtype == torch.int64
    pos = torch.arange(case.q_start, case.Tk)
    jt = (pos // cfg.sel_block).view(1, T, 1, 1)
    valid = got >= 0
    # ascending, -1 padded at the end, only visible blocks
    assert ((got[..., 1:] > got[..., :-1]) | (got[..., 1:] == -1)).all()
    assert (valid.sum(-1) == torch.clamp(jt[..., 0] + 1, max=cfg.n_selected)).all()
    assert (got[valid] <= jt.expand_as(got)[valid]).all()
    for forced in (torch.zeros_like(jt), jt, jt - 1):
        has = (got == forced).any(-1) | (forced[..., 0] < 0)
        assert has.all(), "a forced block (0, t//l', t//l'-1) is missing"
    same = (got == ref).all(-1)
    if not same.all():
        sc = block_scores(q, kc, lse, cfg, case.q_start)
        for b, t, h in (~same).nonzero().tolist():
            a, r = got[b, t, h], ref[b, t, h]
            sa, sr = sc[b, t, h][a[a >= 0]].sum(), sc[b, t, h][r[r >= 0]].sum()
            assert abs(sa - sr) <= 1e-5 * sr, f"t={t}: chose {a.tolist()} over {r.tolist()}"
    return same.float().mean().item()


@INTERP_SETTINGS
@given(case=kcases(max_T=64))
def test_topk_matches_torch(kdev, case):
    _check(kdev, case)


def test_topk_defaults_shape_long_prefix(kdev):
    """Paper defaults (l=32, d=16, l'=64, n=16): several chunks of candidate blocks."""
    cfg = NSAConfig()
    agree = _check(kdev, KCase(cfg, B=1, T=96, H=1, G=2, K=16, q_start=2000, seed=3))
    assert agree >= 0.99


def test_topk_scores_a_query_chunk_at_a_time(kdev, monkeypatch):
    """A score budget smaller than one query tile's scores: the queries are scored and
    selected a tile at a time (two chunks here, the last one short), batch of two."""
    from nsa.kernels import topk

    monkeypatch.setattr(topk, "SCORE_BUDGET", 1)
    cfg = NSAConfig()
    agree = _check(kdev, KCase(cfg, B=2, T=40, H=2, G=2, K=16, q_start=700, seed=5))
    assert agree >= 0.99
