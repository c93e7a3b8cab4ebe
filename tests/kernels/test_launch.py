"""nsa.kernels._launch: the float32 products' precision follows PyTorch's setting; a launch
configuration that does not fit the GPU falls back to the next smaller one, remembered and
recorded with its reason (the GPU test matrix, test_shape_matrix.py, runs the real kernels)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

# without the triton extra the module skips; a plain import failed collection, and with it every
# pytest command of the repository (an acceptance run `pytest -m cpu_profile` included)
OutOfResources = pytest.importorskip("triton.runtime.errors", reason="triton is not installed").OutOfResources

from nsa.kernels import _launch  # noqa: E402  (imports triton)


class FakeKernel:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kw) 'compiles' only when the
    shared memory its tiles would take, BM * 1024 * num_stages bytes (four times that with
    tf32x3 products, whose split operands stage through shared memory), is within the limit."""

    fn = SimpleNamespace(__name__="_fake_kernel")

    def __init__(self, limit: int):
        self.limit, self.launched, self.tried = limit, [], 0

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.tried += 1
            need = kw["BM"] * 1024 * kw["num_stages"] * (4 if kw.get("DOT") == "tf32x3" else 1)
            if need > self.limit:
                raise OutOfResources(need, self.limit, "shared memory")
            self.launched.append((grid, {k: kw[k] for k in ("BM", "num_stages", "DOT") if k in kw}))
        return run


@pytest.fixture(autouse=True)
def _fresh_records(monkeypatch):
    monkeypatch.setattr(_launch, "_FITTED", {})
    monkeypatch.setattr(_launch, "_FALLBACKS", {})


def test_ladder_lowers_stages_then_halves_the_largest_tile():
    got = [(c["BM"], c["BN"], c["num_stages"]) for c in _launch.ladder(dict(BM=64, BN=32, num_warps=4, num_stages=2),
                                                                      ("BM", "BN"), floor=16)]
    assert got == [(64, 32, 2), (64, 32, 1), (32, 32, 2), (32, 32, 1), (16, 32, 2), (16, 32, 1),
                   (16, 16, 2), (16, 16, 1)]


def test_launch_falls_back_remembers_and_records():
    kernel = FakeKernel(limit=64 * 1024)
    base = dict(BM=128, num_warps=8, num_stages=3)
    args = (torch.zeros(2, dtype=torch.float32), 7)
    cfg = _launch.launch(kernel, lambda c: (100 // c["BM"],), args, dict(K=128), base, halve=("BM",))
    # 128 x 3, 2, 1 stages and 64 x 3, 2 do not fit; 64 rows, one stage do (64 KiB)
    assert cfg == dict(BM=64, num_warps=8, num_stages=1) and kernel.tried == 6
    assert kernel.launched == [((1,), dict(BM=64, num_stages=1))]  # the grid of the fallback's tiles
    (name, why), = _launch.fallbacks().items()
    assert "_fake_kernel" in name and "K=128" in name and "torch.float32" in name
    assert "BM=128" in why and "shared memory" in why and "launched BM=64" in why and "num_stages=1" in why
    # remembered: the next call launches the fallback at once
    assert _launch.launch(kernel, lambda c: (1,), args, dict(K=128), base, halve=("BM",)) == cfg
    assert kernel.tried == 7
    # another specialisation is tried afresh
    assert _launch.launch(kernel, lambda c: (1,), args, dict(K=64), dict(BM=32, num_warps=4, num_stages=2)) == \
        dict(BM=32, num_warps=4, num_stages=2)
    assert len(_launch.fallbacks()) == 1


def test_strict_float32_products_that_fit_nowhere_fall_back_to_fmas():
    """tf32x3 products at the smallest tiles still need more shared memory than the GPU has (the
    selected branch's dk/dv kernel at head dim 256 asked 393,600 B of an H200's 232,448): the
    ladder runs again with 'ieee' products, which are as accurate, and remembers it."""
    kernel = FakeKernel(limit=32 * 1024)
    base = dict(BM=32, num_warps=8, num_stages=2)
    args = (torch.zeros(2, dtype=torch.float32),)
    cfg = _launch.launch(kernel, lambda c: (1,), args, dict(K=256, DOT="tf32x3"), base, halve=("BM",))
    # tf32x3: 32 x 2, 1 and 16 x 2, 1 stages need 64-256 KiB; ieee at 32 rows, 2 stages: 64 KiB; 1 stage fits
    assert cfg == dict(BM=32, num_warps=8, num_stages=1, DOT="ieee") and kernel.tried == 6
    assert kernel.launched == [((1,), dict(BM=32, num_stages=1, DOT="ieee"))]
    (name, why), = _launch.fallbacks().items()
    assert "DOT=tf32x3" in name and "launched BM=32, num_warps=8, num_stages=1, DOT=ieee" in why
    assert _launch.launch(kernel, lambda c: (1,), args, dict(K=256, DOT="tf32x3"), base, halve=("BM",)) == cfg
    assert kernel.tried == 7
    # other products never change their precision: nothing fits, the first failure is raised
    with pytest.raises(OutOfResources):
        _launch.launch(kernel, lambda c: (1,), args, dict(K=256, DOT="tf32"), dict(BM=64, num_warps=8, num_stages=1))


def test_launch_raises_when_nothing_fits():
    kernel = FakeKernel(limit=1024)
    with pytest.raises(OutOfResources):
        _launch.launch(kernel, lambda c: (1,), (), {}, dict(BM=64, num_warps=4, num_stages=2), halve=("BM",))
    assert kernel.launched == []


def test_float32_products_follow_pytorchs_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # PyTorch's default: no TF32
        assert _launch.dot_precision(torch.float32) == "tf32x3"
        assert _launch.dot_precision(torch.bfloat16) == "tf32"  # ignored by half-precision products
        torch.set_float32_matmul_precision("high")
        assert _launch.dot_precision(torch.float32) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert _launch.dot_precision(torch.float32) == "tf32x3"
    finally:
        torch.set_float32_matmul_precision(before)


def test_float32_launches_that_compile_slowly_start_from_small_tiles():
    """Strict float32 products unroll into FMAs: with the tiles tuned for bf16 a band kernel took
    21-27 s to compile for sm_90 at head dim 64 (over a minute each, spilling, at 256, where most
    did not fit and the ladder compiled the next). Such launches (float32 with TF32 off at any head
    dim; float32 at head dim > 64 either way) start from FP32_SMALL_TILES / 8 warps; bf16, and
    TF32 products at head dim <= 64 (tensor cores, quick to compile), keep theirs."""
    from nsa.kernels import band_attention

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # strict products
        assert all(_launch.fp32_small_tiles(torch.float32, K) for K in (32, 64, 128, 256))
        torch.set_float32_matmul_precision("high")  # TF32
        assert _launch.fp32_small_tiles(torch.float32, 128) and not _launch.fp32_small_tiles(torch.float32, 64)
        assert not any(_launch.fp32_small_tiles(dt, 256) for dt in (torch.bfloat16, torch.float16))
    finally:
        torch.set_float32_matmul_precision(before)
    bm, bn, warps, stages = band_attention.FP32_SMALL_TILES
    small = dict(BM=bm, BN=bn, num_warps=warps, num_stages=stages)
    for window in (False, True):
        assert band_attention._configs(64, False, window, small=True) == (small,) * 3
        assert small not in band_attention._configs(64, False, window)


def test_offsets_are_int64_from_two_to_the_31_elements():
    assert not _launch.wide_offsets(2**31 - 1) and _launch.wide_offsets(2**31)


@pytest.mark.triton_interp
@pytest.mark.parametrize("branch", ["cmp", "win", "sel"])
def test_int64_offsets_address_what_int32_offsets_do(kdev, monkeypatch, branch):
    """The band kernels' key tiles and the selected dk/dv pass's query rows take int32 offsets
    from a batch's base unless a sequence spans 2^31 elements (WIDE, wide_offsets). Forced to
    int64 at a small shape of two batches (the base moves) and a group of 6, the outputs and
    gradients are the same bits (in deterministic mode: the dk/dv passes' float32 atomics would
    add in another order on each run)."""
    from nsa.attention.config import NSAConfig
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_sel_attention, triton_win_attention
    from nsa.attention.torch_branches import torch_cmp_attention, torch_select_blocks
    from nsa.kernels import band_attention, selection

    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=6)
    gen = torch.Generator().manual_seed(3)
    B, T, H, G, K = 2, 23, 1, 6, 16
    q, k, v, do = (torch.randn(B, T, h, K, generator=gen) for h in (H * G, H, H, H * G))
    kc = torch.randn(B, (T - cfg.cmp_block) // cfg.cmp_stride + 1, H, K, generator=gen)
    q64, kc64 = q.double(), kc.double()
    idx = torch_select_blocks(q64, kc64, torch_cmp_attention(q64, kc64, kc64, cfg)[1], cfg)
    run = {"cmp": lambda q, k, v: triton_cmp_attention(q, k, v, cfg)[0],
           "win": lambda q, k, v: triton_win_attention(q, k, v, cfg),
           "sel": lambda q, k, v: triton_sel_attention(q, k, v, idx.to(kdev), cfg)}[branch]
    kv_len = kc.shape[1] if branch == "cmp" else T

    def outputs_and_grads():
        leaves = [t.to(kdev).requires_grad_() for t in (q, k[:, :kv_len], v[:, :kv_len])]
        o = run(*leaves)
        return [o.detach(), *torch.autograd.grad(o, leaves, do.to(kdev))]

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the kernels' switch; torch's ops only warn
    try:
        narrow = outputs_and_grads()
        monkeypatch.setattr(band_attention, "wide_offsets", lambda n: True)
        monkeypatch.setattr(selection, "wide_offsets", lambda n: True)
        wide = outputs_and_grads()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    for name, a, b in zip(("o", "dq", "dk", "dv"), narrow, wide):
        assert torch.equal(a, b), f"{name}: max abs difference {(a - b).abs().max().item():.3g}"
