"""selection_regret, the yardstick of the kernels' selection tests: zero for the oracle's own
top-n, the exact score gap for a block swapped for a worse one, +inf for a row that chose too few."""
from __future__ import annotations

import torch

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (
    _block_scores,
    near_tie_violations,
    selection_regret,
    torch_cmp_attention,
    torch_select_blocks,
)

CFG = NSAConfig(n_selected=4)


def _inputs(T=1200, H=2, G=3, K=16):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, T, H * G, K, generator=g, dtype=torch.float64)
    kc = torch.randn(1, (T - CFG.cmp_block) // CFG.cmp_stride + 1, H, K, generator=g, dtype=torch.float64)
    _, lse = torch_cmp_attention(q, kc, kc, CFG)
    return q, kc, lse, torch_select_blocks(q, kc, lse, CFG)


def test_the_exact_top_n_has_no_regret():
    q, kc, lse, idx = _inputs()
    regret = selection_regret(q, kc, lse, idx, CFG)
    assert regret.shape == idx.shape[:3] and (regret <= 0).all()
    assert not near_tie_violations(q, kc, lse, idx, CFG).any()


def test_a_block_swapped_for_a_worse_one_is_regretted_by_the_exact_gap():
    q, kc, lse, idx = _inputs()
    t, h = 1199, 1
    row = idx[0, t, h]
    jt = t // CFG.sel_block
    scores = _block_scores(q, kc, lse, CFG, 0, jt + 1)[0, t, h]
    free = [j for j in range(jt + 1) if j not in (0, jt, jt - 1)]
    chosen = [j for j in row.tolist() if j in free]
    passed = sorted((j for j in free if j not in chosen), key=lambda j: scores[j])
    worse = passed[0]  # the lowest-scoring block passed over
    swapped = row.clone()
    best = max(chosen, key=lambda j: scores[j])
    swapped[swapped == best] = worse
    bad = idx.clone()
    bad[0, t, h] = swapped.sort().values
    top = scores[free].max()
    want = (scores[best] - scores[worse]) / top
    assert torch.isclose(selection_regret(q, kc, lse, bad, CFG)[0, t, h], want)
    assert near_tie_violations(q, kc, lse, bad, CFG).sum() == 1


def test_a_row_that_chose_too_few_blocks_is_infinitely_wrong():
    q, kc, lse, idx = _inputs()
    t, jt = 1199, 1199 // CFG.sel_block
    row = idx[0, t, 0]
    dropped = next(j for j in row.tolist() if j not in (0, jt, jt - 1))
    keep = row[(row >= 0) & (row != dropped)]
    bad = idx.clone()
    bad[0, t, 0] = torch.cat([keep, keep.new_full((len(row) - len(keep),), -1)])
    assert selection_regret(q, kc, lse, bad, CFG)[0, t, 0] == float("inf")
