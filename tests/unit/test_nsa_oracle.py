"""The NSA module against its float64 oracle (nsa/attention/reference.py).

Each property here would have caught one of the bugs docs/design.md lists for public NSA ports:
outputs and gradients equal to the oracle, causality through every branch and the selection
scores, group-shared selection with forced blocks, single-query and decode == prefill, and q/k
rotated with the same RoPE frequencies.
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsa.attention import NSACache
from nsa.attention.core import nsa_core
from nsa.attention.reference import reference_nsa, reference_rope
from tests.unit.nsa_strategies import cases, make_module, random_inputs

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any() and not torch.isnan(b).any()
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def module_core(m, q, kv, gates):
    """The module's vectorised path on given projections (routes resolved as in forward)."""
    kc, vc = m.compress_k(kv[0]), m.compress_v(kv[1])
    routes = m.resolve_routes(q.device, q.dtype)
    return nsa_core(q, kc, vc, *kv[2:], gates, m.cfg, routes)


def oracle(m, q, kv, gates):
    return reference_nsa(q, *kv, gates, m.cfg, m.compress_k.phi_params(), m.compress_v.phi_params())


@SETTINGS
@given(case=cases())
def test_core_matches_oracle_float64(case):
    m = make_module(case)
    q, kv, gates = random_inputs(case)
    ref = oracle(m, q, kv, gates)
    assert rel_err(module_core(m, q, kv, gates), ref.o) <= 1e-10


@SETTINGS
@given(case=cases())
def test_module_forward_matches_oracle_float32(case):
    m32 = make_module(case, torch.float32)
    m64 = make_module(case, torch.float64)
    x = torch.randn(case.B, case.T, 16, generator=torch.Generator().manual_seed(case.seed), dtype=torch.float64)
    y32 = m32(x.float())
    q, kv, gates = m64.project(x, 0)
    ref = m64.o_proj(oracle(m64, q, kv, gates).o.reshape(case.B, case.T, -1))
    assert rel_err(y32, ref) <= 1e-5


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_T=24))
def test_gradients_match_oracle(case):
    m = make_module(case)
    q, kv, gates = random_inputs(case, requires_grad=True)
    phi = [p for p in m.parameters() if p.requires_grad and p.dim() >= 1 and any(
        p is t for c in (m.compress_k, m.compress_v) for t in c.parameters())]
    leaves = [q, *kv, gates, *phi]
    proj = torch.randn_like(q)
    grads_mod = torch.autograd.grad((module_core(m, q, kv, gates) * proj).sum(), leaves, allow_unused=True)
    grads_ref = torch.autograd.grad((oracle(m, q, kv, gates).o * proj).sum(), leaves, allow_unused=True)
    names = ["q", "k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win", "gates"] + [f"phi{i}" for i in range(len(phi))]
    for name, gm, gr in zip(names, grads_mod, grads_ref):
        if gr is None:  # e.g. compressed keys when no query sees a compressed token
            assert gm is None or gm.abs().max() == 0, name
            continue
        assert gm is not None, f"{name}: module gives no gradient where the oracle does"
        # Some true gradients are exactly zero (a bias shared by all compressed keys shifts
        # every score equally), so the oracle shows rounding noise there: an absolute floor
        # of 1e-12 covers that, far below any real gradient in these tests.
        assert (gm - gr).norm() <= 1e-10 * gr.norm() + 1e-12, name


@SETTINGS
@given(case=cases(), data=st.data())
def test_causality_every_branch(case, data):
    """Changing inputs after t never changes any output at or before t, branch by branch."""
    if case.T < 2:
        return
    t = data.draw(st.integers(0, case.T - 2))
    m = make_module(case)
    q, kv, gates = random_inputs(case)
    q2, kv2, gates2 = random_inputs(case)  # a different future
    cut = lambda a, b: torch.cat([a[:, : t + 1], b[:, t + 1 :]], dim=1)
    q2, kv2, gates2 = cut(q, q2), [cut(a, b) for a, b in zip(kv, kv2)], cut(gates, gates2)
    for branch in range(3):
        one_hot = torch.zeros_like(gates)
        one_hot[..., branch] = 1.0
        o1 = module_core(m, q, kv, one_hot)
        o2 = module_core(m, q2, kv2, one_hot)
        assert torch.equal(o1[:, : t + 1], o2[:, : t + 1]), f"branch {branch} leaks the future"


@SETTINGS
@given(case=cases(max_T=80))
def test_selection_matches_oracle_group_shared_with_forced_blocks(case):
    m = make_module(case)
    q, kv, gates = random_inputs(case)
    ref = oracle(m, q, kv, gates)
    kc = m.compress_k(kv[0])
    routes = m.resolve_routes(q.device, q.dtype)
    from nsa.attention.backends import implementation

    _, lse = implementation(routes["cmp"])(q, kc, m.compress_v(kv[1]), m.cfg, 0)
    idx = implementation(routes["select"])(q, kc, lse, m.cfg, 0)
    cfg = m.cfg
    assert idx.shape == (case.B, case.T, case.H, cfg.n_selected)  # one selection per KV group
    for b in range(case.B):
        for t in range(case.T):
            jt = t // cfg.sel_block
            for h in range(case.H):
                got = [j for j in idx[b, t, h].tolist() if j >= 0]
                assert got == ref.selected[b][t][h], (b, t, h)
                assert len(got) == min(cfg.n_selected, jt + 1)
                assert {0, jt, max(jt - 1, 0)} <= set(got)


@SETTINGS
@given(case=cases(max_T=30))
def test_decode_equals_prefill(case):
    """Token-by-token decode (and a chunked prefill followed by decode) equals full prefill."""
    m = make_module(case)
    x = torch.randn(case.B, case.T, 16, generator=torch.Generator().manual_seed(case.seed), dtype=torch.float64)
    full = m(x)
    cache = NSACache()
    steps = torch.cat([m(x[:, t : t + 1], cache) for t in range(case.T)], dim=1)
    assert rel_err(steps, full) <= 1e-10
    split = max(1, case.T // 2)
    cache = NSACache()
    mixed = torch.cat([m(x[:, :split], cache)] + [m(x[:, t : t + 1], cache) for t in range(split, case.T)], dim=1)
    assert rel_err(mixed, full) <= 1e-10


@settings(max_examples=10, deadline=None)
@given(case=cases(max_T=1))
def test_single_query(case):
    """S=1: the query sees only itself in the selected and window branches, and a compressed
    token only when l = 1 (then exactly one)."""
    m = make_module(case)
    q, kv, gates = random_inputs(case)
    o = module_core(m, q, kv, gates)
    expected = (gates[..., 1:2] * kv[3].repeat_interleave(case.G, dim=2)
                + gates[..., 2:3] * kv[5].repeat_interleave(case.G, dim=2))
    if case.cfg.cmp_block == 1:
        expected = expected + gates[..., 0:1] * m.compress_v(kv[1]).repeat_interleave(case.G, dim=2)
    assert rel_err(o, expected) <= 1e-12


def test_rope_same_frequencies_for_q_and_every_k():
    from nsa.attention import NSAConfig
    from tests.unit.nsa_strategies import Case

    m = make_module(Case(NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4), 1, 12, 2, 3, 8, 0))
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    start = 5
    q, kv, _ = m.project(x, start)
    pos = torch.arange(start, start + 12)
    raw_q = m.q_proj(x).view(1, 12, 6, 8)
    raw_kv = m.kv_proj(x).view(1, 12, 6, 2, 8).unbind(2)
    assert torch.allclose(q, reference_rope(raw_q, pos, m.rope_theta), atol=1e-12)
    for i in (0, 2, 4):  # k_cmp, k_sel, k_win
        assert torch.allclose(kv[i], reference_rope(raw_kv[i], pos, m.rope_theta), atol=1e-12)
    for i in (1, 3, 5):  # values are not rotated
        assert torch.equal(kv[i], raw_kv[i])
    # and scores depend only on relative position: shift both by 7, same q.k
    qa, kva, _ = m.project(x, 0)
    qb, kvb, _ = m.project(x, 7)
    sa = torch.einsum("bthk,bshk->bhts", qa[:, :, :2], kva[2])
    sb = torch.einsum("bthk,bshk->bhts", qb[:, :, :2], kvb[2])
    assert torch.allclose(sa, sb, atol=1e-10)


def test_compressed_branch_varies_with_position():
    """A public port once returned the same compressed vector for every position."""
    from nsa.attention import NSAConfig
    from tests.unit.nsa_strategies import Case

    case = Case(NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4), 1, 40, 1, 2, 8, 3)
    m = make_module(case)
    q, kv, gates = random_inputs(case)
    cmp_only = torch.zeros_like(gates)
    cmp_only[..., 0] = 1
    o = module_core(m, q, kv, cmp_only)
    assert torch.all(o[:, :3] == 0)  # positions 0..2 see no compressed token: zero, not NaN
    assert (o[:, 11:] - o[:, 10:11]).abs().amax(dim=(0, 2, 3)).min() > 1e-6
