"""The NSA core with every stage on the Triton backends against the float64 oracle, and the
routing rules: 'auto' keeps torch on CPU, a named Triton backend that cannot run is an error."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.backends import BackendUnavailable, Route, resolve_route
from nsa.attention.config import NSAConfig
from nsa.attention.core import nsa_core
from nsa.attention.reference import reference_compress, reference_nsa
from tests.kernels._util import INTERP_SETTINGS, assert_close, kcases, rnd

pytestmark = pytest.mark.triton_interp

TRITON = {s: Route(s, "triton", "test") for s in ("cmp", "select", "sel", "win")}
TORCH = {s: Route(s, "torch", "test") for s in ("cmp", "select", "sel", "win")}


@INTERP_SETTINGS
@given(case=kcases(max_T=40))
def test_core_matches_oracle(kdev, case):
    cfg = NSAConfig(**{**case.cfg.__dict__, "phi": "mean"})
    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K = case.B, case.T, case.H, case.G, case.K
    q = rnd(gen, B, T, H * G, K, device="cpu", dtype=torch.float64)
    kv = [rnd(gen, B, T, H, K, device="cpu", dtype=torch.float64) for _ in range(6)]
    gates = torch.rand(B, T, H * G, 3, generator=gen, dtype=torch.float64)
    ref = reference_nsa(q, *kv, gates, cfg)
    kc, vc = reference_compress(kv[0], None, cfg), reference_compress(kv[1], None, cfg)
    args = [t.float().to(kdev).requires_grad_() for t in (q, kc, vc, *kv[2:], gates)]
    o = nsa_core(*args[:7], args[7], cfg, TRITON)
    tol = 2e-5 if kdev.type == "cpu" else 5e-3
    assert_close(o, ref.o, tol, "o vs oracle")
    # gradients (q, compressed k/v, per-token k/v, gates) against the torch routes in float64
    do = torch.randn(o.shape, generator=gen).to(kdev)
    refs = [a.detach().double().cpu().requires_grad_() for a in args]
    o_t = nsa_core(*refs[:7], refs[7], cfg, TORCH)
    g = torch.autograd.grad(o, args, do, allow_unused=True)
    gr = torch.autograd.grad(o_t, refs, do.double().cpu(), allow_unused=True)
    for name, a, b in zip(("dq", "dkc", "dvc", "dk_sel", "dv_sel", "dk_win", "dv_win", "dgates"), g, gr):
        if b is not None and b.abs().sum() > 0:
            assert_close(a, b, tol, name)


def test_auto_keeps_torch_on_cpu(kdev, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for stage in ("cmp", "select", "sel", "win"):
        assert resolve_route(stage, "auto", torch.device("cpu"), torch.float32).backend == "torch"
        assert resolve_route(stage, "triton", torch.device("cpu"), torch.float32).backend == "triton"
    with pytest.raises(BackendUnavailable, match="bfloat16"):
        resolve_route("cmp", "triton", torch.device("cpu"), torch.bfloat16)


def test_named_triton_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the Triton backends are available here")
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET"):
        resolve_route("sel", "triton", torch.device("cpu"), torch.float32)
    assert resolve_route("sel", "auto", torch.device("cpu"), torch.float32).backend == "torch"


def test_gate_combine_matches_torch(kdev):
    from nsa.attention.backends import torch_gate_combine
    from nsa.attention.kernel_branches import triton_gate_combine

    gen = torch.Generator().manual_seed(0)
    shape = (2, 7, 6, 24)
    xs = [rnd(gen, *shape, device=kdev).requires_grad_() for _ in range(3)]
    gates = torch.rand(*shape[:3], 3, generator=gen).to(kdev).requires_grad_()
    do = rnd(gen, *shape, device=kdev)
    o = triton_gate_combine(gates, *xs)
    refs = [t.detach().double().cpu().requires_grad_() for t in (gates, *xs)]
    o_ref = torch_gate_combine(*refs)
    assert_close(o, o_ref, 1e-6, "o")
    for name, a, b in zip(("dgates", "do_cmp", "do_sel", "do_win"),
                          torch.autograd.grad(o, (gates, *xs), do),
                          torch.autograd.grad(o_ref, refs, do.double().cpu())):
        assert_close(a, b, 1e-6, name)
