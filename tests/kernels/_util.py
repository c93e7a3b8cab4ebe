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
