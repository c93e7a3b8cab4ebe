"""Fixed-order backward passes: with torch.use_deterministic_algorithms(True) the kernels that
otherwise add partial dk/dv sums with float atomics (the compressed branch's band kernel with
its rows split, the selected branch's dk/dv work items) take a path with one writer per dk/dv
row. It is chosen by nsa.attention (kernel_branches) from the flag, and gives the default
path's results within rounding, the same bits on every run."""
from __future__ import annotations

import pytest
import torch

from nsa.attention import kernel_branches as kb
from nsa.attention.config import NSAConfig
from tests.kernels._util import assert_close, rnd

pytestmark = pytest.mark.triton_interp

CFG = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=4, window=8)
B, T, H, G, K = 1, 24, 1, 2, 16
NC = (T - CFG.cmp_block) // CFG.cmp_stride + 1  # compressed tokens of T positions


@pytest.fixture
def deterministic_flag():
    """Sets torch's deterministic-algorithms flag for a test and restores it."""
    before = torch.are_deterministic_algorithms_enabled()
    yield lambda on: torch.use_deterministic_algorithms(on)
    torch.use_deterministic_algorithms(before)


def _record(monkeypatch, module, name):
    """Wrap module.name so that each call's return value is appended to the list returned."""
    seen, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(module, name, spy)
    return seen


def _grads(branch, leaves, do):
    return torch.autograd.grad(branch(*leaves), leaves, do)


def _cmp(q, kc, vc):
    return kb.triton_cmp_attention(q, kc, vc, CFG)[0]


def _sel(idx, tune=None):
    return lambda q, k, v: kb.triton_sel_attention(q, k, v, idx, CFG, tuning=tune)


def _inputs(kdev, n_keys):
    gen = torch.Generator().manual_seed(3)
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k, v = (rnd(gen, B, n_keys, H, K, device=kdev).requires_grad_() for _ in range(2))
    return [q, k, v], rnd(gen, B, T, H * G, K, device=kdev)


def test_compressed_branch_backward_is_fixed_order_when_deterministic(kdev, monkeypatch, deterministic_flag):
    from nsa.kernels import band_attention

    splits = _record(monkeypatch, band_attention, "_dkv_splits")
    leaves, do = _inputs(kdev, NC)
    deterministic_flag(False)
    default = _grads(_cmp, leaves, do)
    assert splits[-1] > 1, "the default path should split the rows here (atomic partial sums)"
    deterministic_flag(True)
    fixed = [_grads(_cmp, leaves, do) for _ in range(2)]
    assert splits[-1] == 1
    for name, a, b, again in zip(("dq", "dkc", "dvc"), fixed[0], default, fixed[1]):
        assert_close(a, b, 1e-5, name)
        assert torch.equal(a, again), f"{name} differs between two deterministic runs"


def test_selected_branch_backward_is_fixed_order_when_deterministic(kdev, monkeypatch, deterministic_flag):
    from nsa.kernels import selection
    from nsa.kernels.tuning import SelectionTuning

    tune = SelectionTuning(qc=8, qc_interpret=8)  # below T: block 0's tokens in several work items
    qc = _record(monkeypatch, selection, "_dkv_qc")
    leaves, do = _inputs(kdev, T)
    with torch.no_grad():  # a real selection, scored on the first NC keys as compressed keys
        kc, vc = (x[:, :NC].contiguous() for x in leaves[1:])
        idx = kb.triton_select_blocks(leaves[0], kc, kb.triton_cmp_attention(leaves[0], kc, vc, CFG)[1], CFG)
    deterministic_flag(False)
    default = _grads(_sel(idx, tune), leaves, do)
    assert qc[-1] < T, "the default path should cut block 0's tokens into several work items"
    deterministic_flag(True)
    fixed = [_grads(_sel(idx, tune), leaves, do) for _ in range(2)]
    assert qc[-1] == T
    for name, a, b, again in zip(("dq", "dk", "dv"), fixed[0], default, fixed[1]):
        assert_close(a, b, 1e-5, name)
        assert torch.equal(a, again), f"{name} differs between two deterministic runs"
