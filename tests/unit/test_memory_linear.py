"""The selected and window branches never build an S x S tensor: their largest intermediate is
bounded by the query chunk, so it stays flat as S grows (memory linear in S overall)."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nsa.attention import NSAConfig
from nsa.attention.torch_branches import (
    torch_cmp_attention,
    torch_sel_attention,
    torch_select_blocks,
    torch_win_attention,
)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_intermediate(S: int, branch: str) -> int:
    cfg = NSAConfig(query_chunk=256)
    torch.manual_seed(0)
    q = torch.randn(1, S, 1, 8)
    k, v = torch.randn(1, S, 1, 8), torch.randn(1, S, 1, 8)
    if branch == "sel":
        kc = torch.randn(1, (S - cfg.cmp_block) // cfg.cmp_stride + 1, 1, 8)
        _, lse = torch_cmp_attention(q, kc, kc, cfg)
        idx = torch_select_blocks(q, kc, lse, cfg)
    with LargestTensor() as probe:
        if branch == "sel":
            torch_sel_attention(q, k, v, idx, cfg)
        else:
            torch_win_attention(q, k, v, cfg)
    return probe.largest


def test_selected_and_window_intermediates_do_not_grow_with_s():
    for branch in ("sel", "win"):
        small, large = largest_intermediate(2048, branch), largest_intermediate(8192, branch)
        # inputs/outputs of S*K elements grow 4x; an S x S intermediate would grow 16x and
        # exceed 8192^2 / 4 elements
        assert large <= 4 * small, (branch, small, large)
        assert large < 8192 * 8192 // 4, (branch, large)
