"""Shared shapes, strategies and comparisons for the Triton kernel tests (float32 on the CPU
interpreter; small shapes, so the whole interpreted suite stays within a few minutes)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import visible_compressed

INTERP_SETTINGS = settings(max_examples=4, deadline=None, derandomize=True,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass
class KCase:
    cfg: NSAConfig
    B: int
    T: int
    H: int
    G: int
    K: int
    q_start: int
    seed: int

    @property
    def Tk(self) -> int:
        return self.q_start + self.T

    @property
    def Nc(self) -> int:
        return int(visible_compressed(torch.tensor([self.Tk - 1]), self.cfg).item())


@st.composite
def kcases(draw, max_T=48):
    d = draw(st.sampled_from([1, 2, 4]))
    l = d * draw(st.sampled_from([1, 2, 3]))
    ls = d * draw(st.integers(min_value=-(-l // d), max_value=4))
    cfg = NSAConfig(cmp_block=l, cmp_stride=d, sel_block=ls, n_selected=draw(st.integers(3, 5)),
                    window=draw(st.integers(1, 24)))
    G = draw(st.sampled_from([1, 2, 3, 6, 16]))
    return KCase(cfg, B=draw(st.integers(1, 2)), T=draw(st.integers(1, max_T)),
                 H=draw(st.integers(1, 2)) if G < 6 else 1, G=G, K=draw(st.sampled_from([8, 16, 32])),
                 q_start=draw(st.sampled_from([0, 0, 5])), seed=draw(st.integers(0, 2**31 - 1)))


def rnd(gen, *shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64, after asserting neither side has NaNs."""
    assert not torch.isnan(a).any(), "kernel output has NaN"
    assert not torch.isnan(b).any(), "reference has NaN"
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_close(a, b, tol, what):
    a, b = a.detach().cpu(), b.detach().cpu()
    if b.double().norm() <= 1e-12:  # e.g. dq of a query that attends to one key: zero
        # absolute, on unit-scale inputs: 1e-5 in exact float32 (the interpreter); `tol` on a
        # GPU, whose float32 tl.dot rounds through TF32
        limit = 1e-5 if tol <= 1e-4 else tol
        err = a.double().abs().max().item() if a.numel() else 0.0
        assert err <= limit, f"{what}: reference is zero, kernel max |x| = {err:.3e} > {limit:.1e}"
        return err
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    return err


def check_against_reference(kernel, reference, leaves, do, names=("dq", "dk", "dv")):
    """o = kernel(*leaves) against reference(*float64 CPU copies of the leaves), then the
    gradient of each leaf for the upstream gradient ``do``; 2e-5 on the interpreter (float32),
    5e-3 on a GPU (TF32 dots)."""
    o = kernel(*leaves)
    refs = [t.detach().double().cpu().requires_grad_() for t in leaves]
    o_ref = reference(*refs)
    tol = 2e-5 if o.device.type == "cpu" else 5e-3
    assert_close(o, o_ref, tol, "o")
    grads = torch.autograd.grad(o, leaves, do)
    grads_ref = torch.autograd.grad(o_ref, refs, do.double().cpu())
    for name, g, gr in zip(names, grads, grads_ref):
        assert_close(g, gr, tol, name)
