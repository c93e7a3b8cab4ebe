"""Hypothesis strategies and builders shared by the NSA oracle tests."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from nsa.attention import NSAAttention, NSAConfig

GROUP_SIZES = (1, 2, 3, 6, 16)


@st.composite
def nsa_configs(draw, phi=None) -> NSAConfig:
    d = draw(st.sampled_from([1, 2, 4]))
    l = d * draw(st.sampled_from([1, 2, 3]))
    ls = d * draw(st.integers(min_value=-(-l // d), max_value=4))
    return NSAConfig(
        cmp_block=l,
        cmp_stride=d,
        sel_block=ls,
        n_selected=draw(st.integers(3, 5)),
        window=draw(st.integers(1, 24)),
        phi=phi or draw(st.sampled_from(["mlp", "mean"])),
        query_chunk=draw(st.sampled_from([3, 16, 1024])),
    )


@dataclass
class Case:
    cfg: NSAConfig
    B: int
    T: int
    H: int
    G: int
    K: int
    seed: int


@st.composite
def cases(draw, max_T=40, phi=None, group_sizes=GROUP_SIZES) -> Case:
    cfg = draw(nsa_configs(phi=phi))
    G = draw(st.sampled_from(group_sizes))
    H = draw(st.integers(1, 2)) if G < 6 else 1
    return Case(cfg, B=draw(st.integers(1, 2)), T=draw(st.integers(1, max_T)), H=H, G=G,
                K=draw(st.sampled_from([4, 8])), seed=draw(st.integers(0, 2**31 - 1)))


def make_module(case: Case, dtype=torch.float64) -> NSAAttention:
    torch.manual_seed(case.seed)
    m = NSAAttention(dim=16, n_heads=case.H * case.G, n_kv_groups=case.H, head_dim=case.K, cfg=case.cfg)
    # random (not default-zero) position embedding and gate bias so every parameter matters
    with torch.no_grad():
        for c in (m.compress_k, m.compress_v):
            if c.kind == "mlp":
                c.pos.normal_()
        m.gate_proj.bias.normal_()
    return m.to(dtype)


def random_inputs(case: Case, dtype=torch.float64, requires_grad=False):
    """Rotated-looking q, six per-token k/v tensors and gates in (0, 1), all random."""
    g = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K = case.B, case.T, case.H, case.G, case.K

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)

    q = rnd(B, T, H * G, K)
    kv = [rnd(B, T, H, K) for _ in range(6)]
    gates = torch.rand(B, T, H * G, 3, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
    return q, kv, gates
