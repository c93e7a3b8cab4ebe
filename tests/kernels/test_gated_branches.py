"""The selected and window branches with the gated sum as one op (nsa.kernels.gated_branches)
against the three separate ops it replaces in the NSA core: the same output, and the same
gradients of every input, on the selected backward's paths (dq from the dq partials or dS tiles
the dk/dv pass keeps at one token a tile, the dq kernel at several), with and without the
deterministic dk/dv order, in chunks of query tokens (q_start > 0), and with what the dk/dv pass
keeps taken a chunk of tokens at a time."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.backends import Route
from nsa.attention.config import NSAConfig
from nsa.attention.core import nsa_core
from nsa.kernels.tuning import SELECTION, SelectionTuning
from tests.kernels._util import assert_close, rnd
from tests.kernels.test_triton_selection import _random_idx

pytestmark = pytest.mark.triton_interp

TRITON = {s: Route(s, "triton", "test") for s in ("cmp", "select", "sel", "win")}


def _separate(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg, q_start, deterministic, tune=SELECTION):
    from nsa.kernels.band_attention import band_attention
    from nsa.kernels.combine import gate_combine
    from nsa.kernels.selection import selected_attention

    o_sel = selected_attention(q, k_sel, v_sel, idx, q_start, cfg.sel_block, deterministic, tuning=tune)
    o_win = band_attention(q, k_win, v_win, q_start, 1, 1, cfg.window, True, deterministic)[0]
    return gate_combine(gates, o_cmp, o_sel, o_win)


def _fused(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg, q_start, deterministic, tune=SELECTION):
    from nsa.kernels.gated_branches import gated_branches

    return gated_branches(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, q_start, cfg.sel_block, cfg.window,
                          deterministic, sel_tuning=tune)


DQ_PATHS = {"dq-from-partials": (1, "dq"), "dq-from-dS": (1, "ds"), "dq-kernel": (2, "auto")}
CASES = [("dq-from-partials", False, 0), ("dq-from-partials", True, 6), ("dq-from-dS", False, 6),
         ("dq-from-dS", True, 0), ("dq-kernel", False, 6), ("dq-kernel", True, 0)]


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # the zero gates
@pytest.mark.parametrize("path,deterministic,q_start", CASES,
                         ids=[f"{q}-{'deterministic' if d else 'atomic'}-{p}" for p, d, q in CASES])
def test_gated_branches_match_separate_ops(kdev, path, deterministic, q_start):
    """Each dq path with and without the deterministic dk/dv order, and each of those in a
    prefill (q_start = 0) and a continuation (q_start = 6): every pair of the three choices
    meets in some case (the other six of the full product add no path)."""
    tt, keep = DQ_PATHS[path]
    _match_separate_ops(kdev, SelectionTuning(tt=tt, dq_keep=keep), deterministic, q_start)


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # the zero gates
@pytest.mark.parametrize("keep", ["dq", "ds"])
def test_gated_branches_keep_a_chunk_of_tokens_at_a_time(kdev, keep):
    """The selected backward takes what its dk/dv pass keeps 7 tokens at a time (7, 7 and 1 of
    15; two batches: the chunks are strided slices of q, do and of the window's dq it adds)."""
    B, HQ, n = 2, 3, 4
    per_token = B * HQ * n * (16 if keep == "dq" else 4) * torch.empty(0, device=kdev).element_size()
    _match_separate_ops(kdev, SelectionTuning(tt=1, dq_keep=keep, kept_budget=7 * per_token), False, 0, B=B, H=1)


def _match_separate_ops(kdev, tune: SelectionTuning, deterministic, q_start, B=1, H=2):
    """The one op against the three separate ops, both at the selected branch's ``tune``: 15
    tokens (no multiple of l' = 4 nor of a token tile), G = 3."""
    from nsa.kernels import selection

    tt = tune.tt
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=4, window=5)
    T, G, K = 15, 3, 16
    Tk = q_start + T
    gen = torch.Generator().manual_seed(tt + 2 * q_start + deterministic)
    leaves = [torch.rand(B, T, H * G, 3, generator=gen).to(kdev),  # gates
              rnd(gen, B, T, H * G, K, device=kdev),  # o_cmp
              rnd(gen, B, T, H * G, K, device=kdev),  # q
              *(rnd(gen, B, Tk, H, K, device=kdev) for _ in range(4))]  # k_sel, v_sel, k_win, v_win
    leaves[0][:, 3] = 0.0  # a token whose gates are all zero: its probabilities fold to zero
    leaves = [t.requires_grad_() for t in leaves]
    idx = _random_idx(gen, B, T, H, cfg.n_selected, cfg.sel_block, q_start).to(kdev)
    assert selection._dq_from_pass(leaves[2], leaves[3], cfg.n_selected, cfg.sel_block, tune) == (tt == 1)
    do = rnd(gen, B, T, H * G, K, device=kdev)
    outs = {}
    for name, fn in (("separate", _separate), ("fused", _fused)):
        o = fn(*leaves, idx, cfg, q_start, deterministic, tune)
        outs[name] = (o, *torch.autograd.grad(o, leaves, do))
    tol = 1e-5 if kdev.type == "cpu" else 5e-3
    for what, a, b in zip(("o", "dgates", "do_cmp", "dq", "dk_sel", "dv_sel", "dk_win", "dv_win"),
                          outs["fused"], outs["separate"]):
        assert_close(a, b, tol, what)


#: a small config for the core's routing tests (nsa_core on the inputs of _core_inputs)
CORE_CFG = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=6)


def _core_inputs(gen, T: int, G: int, device, K: int = 16) -> list[torch.Tensor]:
    """nsa_core's tensors for CORE_CFG, batch 1, one KV head: q, kc, vc, k_sel, v_sel, k_win,
    v_win, gates."""
    Nc = (T - CORE_CFG.cmp_block) // CORE_CFG.cmp_stride + 1
    return [rnd(gen, 1, T, G, K, device=device), rnd(gen, 1, Nc, 1, K, device=device),
            rnd(gen, 1, Nc, 1, K, device=device), *(rnd(gen, 1, T, 1, K, device=device) for _ in range(4)),
            torch.rand(1, T, G, 3, generator=gen).to(device)]


def test_core_runs_the_fused_op_on_triton_routes(kdev, monkeypatch):
    """nsa_core takes the one op when the selected and window branches are both on Triton, and
    the three ops otherwise (here the window on the PyTorch path), with the same output and
    gradients."""
    from nsa.kernels import gated_branches

    cfg, T, G = CORE_CFG, 19, 4
    gen = torch.Generator().manual_seed(5)
    leaves = [t.requires_grad_() for t in _core_inputs(gen, T, G, kdev)]
    do = rnd(gen, 1, T, G, 16, device=kdev)
    calls = []
    real = gated_branches.gated_branches_op
    monkeypatch.setattr(gated_branches, "gated_branches_op", lambda *a: calls.append(1) or real(*a))
    runs = {}
    for fuse, routes in ((True, TRITON), (False, dict(TRITON, win=Route("win", "torch", "test")))):
        o = nsa_core(*leaves[:7], leaves[7], cfg, routes)
        runs[fuse] = (o, *torch.autograd.grad(o, leaves, do))
        assert len(calls) == 1, "the fused op ran once, on the Triton routes only"
    for a, b in zip(runs[True], runs[False]):
        assert_close(a, b, 1e-5 if kdev.type == "cpu" else 5e-3, "fused vs separate")


def test_core_takes_the_selection_tuning_of_the_call(kdev, monkeypatch):
    """The fused op launches with nsa.kernels.tuning.SELECTION as it is when the core runs (a
    benchmark's override, `bench/nsa_vs_dense.py --sel`), not as it was at import."""
    from nsa.kernels import gated_branches, tuning

    inputs = _core_inputs(torch.Generator().manual_seed(6), 9, 2, kdev)
    tuned = SelectionTuning(partials_budget=1 << 20, kept_budget=1 << 20)
    monkeypatch.setattr(tuning, "SELECTION", tuned)
    args = []
    real = gated_branches.gated_branches_op
    monkeypatch.setattr(gated_branches, "gated_branches_op", lambda *a: args.append(a[-1]) or real(*a))
    nsa_core(*inputs[:7], inputs[7], CORE_CFG, TRITON)
    assert args == [tuned.as_arg()]


@pytest.mark.filterwarnings("ignore:invalid value encountered in log:RuntimeWarning")
def test_negative_gate_gives_nan_not_a_wrong_gradient(kdev):
    """The one op folds each gate into a log-sum-exp (ln g): gates are sigmoid outputs. A
    negative gate must not pass silently: the gradients it touches come out NaN."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=4)
    B, T, H, G, K = 1, 12, 1, 2, 16
    gen = torch.Generator().manual_seed(3)
    gates = torch.rand(B, T, H * G, 3, generator=gen)
    gates[0, 5, 1, 2] = -0.5  # token 5, head 1, window branch
    leaves = [gates.to(kdev), *(rnd(gen, B, T, H * G, K, device=kdev) for _ in range(2)),
              *(rnd(gen, B, T, H, K, device=kdev) for _ in range(4))]
    leaves = [t.requires_grad_() for t in leaves]
    idx = _random_idx(gen, B, T, H, cfg.n_selected, cfg.sel_block, 0).to(kdev)
    o = _fused(*leaves, idx, cfg, 0, False)
    assert torch.isfinite(o).all(), "the forward does not fold the gate"
    dq = torch.autograd.grad(o, leaves[2], torch.ones_like(o))[0]
    assert torch.isnan(dq[0, 5, 1]).all() and torch.isfinite(dq[0, 4]).all()


@pytest.mark.parametrize("op", ["gated", "selected"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_takes_the_forwards_inverse_selection(kdev, monkeypatch, op, deterministic):
    """A key-block-major forward over all tokens in one pass hands its inverse selection to the
    backward, whose dk/dv pass then sorts nothing: one inverse selection a step (both ops that
    run the selected branch). A deterministic backward takes work items of whole blocks and
    builds its own."""
    from nsa.kernels import selection, selection_blocks
    from nsa.kernels.selection import selected_attention

    calls = []
    real = selection.inverse_selection

    def counted(*args):
        calls.append(args[-1])  # qc
        return real(*args)

    monkeypatch.setattr(selection, "inverse_selection", counted)
    monkeypatch.setattr(selection_blocks, "inverse_selection", counted)
    tune = SelectionTuning(tt=1)
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=4, window=5)
    B, T, H, G, K = 1, 13, 2, 3, 16
    gen = torch.Generator().manual_seed(11)
    leaves = [torch.rand(B, T, H * G, 3, generator=gen).to(kdev), rnd(gen, B, T, H * G, K, device=kdev),
              rnd(gen, B, T, H * G, K, device=kdev), *(rnd(gen, B, T, H, K, device=kdev) for _ in range(4))]
    leaves = [t.requires_grad_() for t in leaves]
    idx = _random_idx(gen, B, T, H, cfg.n_selected, cfg.sel_block, 0).to(kdev)
    if op == "gated":
        o = _fused(*leaves, idx, cfg, 0, deterministic, tune)
    else:
        o = selected_attention(leaves[2], leaves[3], leaves[4], idx, 0, cfg.sel_block, deterministic, "blocks", tune)
    assert len(calls) == 1, "the forward builds one inverse selection"
    o.backward(rnd(gen, *o.shape, device=kdev))
    assert calls[1:] == ([T] if deterministic else []), "the backward sorts again only when deterministic"


@pytest.mark.parametrize("backend_cmp", ["triton", "cudnn"])
def test_the_layer_remakes_its_projections_branches_and_gated_sum(kdev, monkeypatch, backend_cmp):
    """Every stage on the kernels (the window branch and the gated sum inside the one op; the
    compressed branch on the band kernel or folded for cuDNN): from RECOMPUTE_TOKENS tokens q,
    the key/value streams, the compressed and window branches' outputs and lse and the gated sum
    are freed after the forward and made again in the backward, and the layer computes the same
    (bit for bit interpreted; on a GPU the backward's atomics reorder sums)."""
    from nsa.attention import backends
    from tests.unit.test_saved_activations import REMADE, assert_layer_remakes

    if backend_cmp == "cudnn":
        from tests.kernels.test_cudnn_compressed import fold_every_length

        fold_every_length(kdev, monkeypatch)
        if kdev.type == "cpu":  # the fold with its stand-in for cuDNN (test_cudnn_compressed)
            for stage, fn in (("cmp", backends.kb.cudnn_cmp_attention), ("select", backends.kb.triton_select_blocks)):
                stand_in = backends.Backend(fn, lambda d, t: (True, "the stand-in for cuDNN"),
                                            runs=backends.BACKENDS[stage]["cudnn"].runs)
                monkeypatch.setitem(backends.BACKENDS[stage], "cudnn", stand_in)
    routes = {"backend_cmp": backend_cmp, "backend_sel": "triton", "backend_win": "triton"}
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8, **routes)
    # the fold keeps cuDNN's own lse of each run, not lse_cmp
    # the compressed branch's key/value streams are their own tensors, which nothing keeps: the
    # compressors' node keeps their chunks (its fc1 input, made again from 32k) instead
    never = {"k_cmp", "v_cmp"}
    remade = (REMADE - never) | {"o_win", "lse_win"} | ({"lse_cmp"} if backend_cmp == "triton" else set())
    assert_layer_remakes(cfg, kdev, monkeypatch, exact=kdev.type == "cpu", remade=remade, never_kept=never)
