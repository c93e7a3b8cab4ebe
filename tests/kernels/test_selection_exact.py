"""Selection in float32 as the NSA core runs it (the compressed-branch kernel's lse, then the top-n
kernel) chooses the exact top-n blocks at every group size, up to near-ties of 1e-5 of a row's top
score (nsa.attention.torch_branches.near_tie_violations), with TF32 off: whole sequences of 2,100
tokens (4,200 query-token x KV-head rows at two KV heads). A GPU test: the interpreter computes
float32 exactly, and tests/kernels/test_triton_topk.py holds it to the same near-ties.
bench/selection_exactness.py prints the counts, TF32 on and off."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import near_tie_violations, torch_cmp_attention, visible_compressed

pytestmark = pytest.mark.gpu

S = 2100


@pytest.fixture
def tf32_off():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("G", [1, 2, 3, 4, 6, 8, 12, 16])
def test_float32_selection_is_the_exact_top_n_up_to_near_ties(tf32_off, G):
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks

    cfg = NSAConfig()
    H, K = (2 if G < 12 else 1), 64
    gen = torch.Generator().manual_seed(G)
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    q = torch.randn(1, S, H * G, K, generator=gen, dtype=torch.float64)
    kc = torch.randn(1, Nc, H, K, generator=gen, dtype=torch.float64)
    qd, kd = q.float().cuda(), kc.float().cuda()
    _, lse = triton_cmp_attention(qd, kd, kd, cfg)
    idx = triton_select_blocks(qd, kd, lse, cfg).cpu()
    _, exact_lse = torch_cmp_attention(q, kc, kc, cfg)
    wrong = near_tie_violations(q, kc, exact_lse, idx, cfg)
    assert not wrong.any(), f"{int(wrong.sum())} of {wrong.numel()} rows, first at (b, t, h) {wrong.nonzero()[0].tolist()}"
