"""The shapes users train, on a GPU: dtype x head dim x group size x odd S, the whole NSA core
on the Triton kernels (compressed branch, top-n, the selected and window branches with the
gated sum as one op) against the PyTorch path in float64 with the same selected blocks; output
and every gradient by relative RMS error. No launch may fail for want of shared memory
(nsa.kernels._launch falls back where a tuned launch does not fit; fallbacks are printed).

float32 runs strict products (three TF32 products each, float32's accuracy) unless PyTorch allows
TF32 (nsa.kernels._launch.dot_precision): held to 2e-5 against float64 by default, and the TF32 case shows the switch takes effect.
"""
from __future__ import annotations

import pytest
import torch

from nsa.attention.backends import torch_gate_combine
from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (
    torch_cmp_attention, torch_sel_attention, torch_select_blocks, torch_win_attention, visible_compressed,
)
from tests.kernels._util import rel_err

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {"bf16": 5e-3, "fp16": 5e-3, "fp32": 2e-5}
# (dtype, head dim, G, S): each dtype over the head dims 32..256 and group sizes 1..16, odd S;
# fp32 at head dim 128 with G = 1, 4, 16 is the launch that ran out of shared memory
CASES = [
    ("bf16", 32, 1, 333), ("bf16", 64, 6, 1111), ("bf16", 96, 4, 777), ("bf16", 128, 8, 2049),
    ("bf16", 192, 5, 555), ("bf16", 256, 16, 1025),
    ("fp16", 64, 4, 999), ("fp16", 128, 16, 333), ("fp16", 256, 6, 701),
    ("fp32", 32, 6, 555), ("fp32", 64, 8, 1001), ("fp32", 128, 1, 777), ("fp32", 128, 4, 333),
    ("fp32", 128, 16, 2049), ("fp32", 256, 3, 401),
]
NAMES = ("q", "kc", "vc", "k_sel", "v_sel", "k_win", "v_win", "gates")


def _kernels(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, idx, cfg):
    """The core as it runs on the Triton routes, with the selected blocks given."""
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_gated_branches

    o_cmp, _ = triton_cmp_attention(q, kc, vc, cfg)
    return triton_gated_branches(gates, o_cmp, q, k_sel, v_sel, k_win, v_win, idx, cfg)


def _reference(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, idx, cfg):
    o_cmp, _ = torch_cmp_attention(q, kc, vc, cfg)
    return torch_gate_combine(gates, o_cmp, torch_sel_attention(q, k_sel, v_sel, idx, cfg),
                              torch_win_attention(q, k_win, v_win, cfg))


def _core_errors(dtype: torch.dtype, K: int, G: int, S: int, H: int = 2) -> tuple[dict[str, float], float]:
    """Relative RMS errors of o and every gradient, kernels in ``dtype`` against float64, both
    with the float64 path's selection (a near tie cannot decide the result); and the share of
    (token, group) rows whose top-n the kernels chose as float64 did."""
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks

    cfg = NSAConfig()
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    gen = torch.Generator(device="cuda").manual_seed(S + K + G)
    shapes = [(1, S, H * G, K), (1, Nc, H, K), (1, Nc, H, K)] + [(1, S, H, K)] * 4
    x = [torch.randn(*s, generator=gen, device="cuda").to(dtype) for s in shapes]
    x.append(torch.rand(1, S, H * G, 3, generator=gen, device="cuda").to(dtype))
    do = torch.randn(1, S, H * G, K, generator=gen, device="cuda").to(dtype)
    ref = [t.double().requires_grad_() for t in x]
    with torch.no_grad():
        _, lse64 = torch_cmp_attention(ref[0], ref[1], ref[2], cfg)
        idx = torch_select_blocks(ref[0], ref[1], lse64, cfg)
        _, lse = triton_cmp_attention(x[0], x[1], x[2], cfg)
        agree = (triton_select_blocks(x[0], x[1], lse, cfg) == idx).all(-1).float().mean().item()
    leaves = [t.clone().requires_grad_() for t in x]
    o = _kernels(*leaves, idx, cfg)
    o_ref = _reference(*ref, idx, cfg)
    grads = torch.autograd.grad(o, leaves, do)
    grads_ref = torch.autograd.grad(o_ref, ref, do.double())
    errs = {"o": rel_err(o.float(), o_ref)}
    errs.update({"d" + n: rel_err(g.float(), gr) for n, g, gr in zip(NAMES, grads, grads_ref) if gr.norm() > 0})
    return errs, agree


@pytest.mark.parametrize("dtype,K,G,S", CASES, ids=[f"{d}-K{k}-G{g}-S{s}" for d, k, g, s in CASES])
def test_core_shape_matrix(dtype, K, G, S, record_property):
    from nsa.kernels._launch import fallbacks

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # PyTorch's default: strict float32 products
    try:
        errs, agree = _core_errors(DTYPES[dtype], K, G, S)
    finally:
        torch.set_float32_matmul_precision(before)
    for k, v in errs.items():
        record_property(f"rel_rms_{k}", v)
    record_property("selection_row_agreement", agree)
    print(f"\n[matrix] {dtype} K={K} G={G} S={S} selection rows equal to float64: {agree:.4f} | "
          + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    for name, why in fallbacks().items():
        print(f"[launch fallback] {name}: {why}")
    bad = {k: v for k, v in errs.items() if not v <= TOL[dtype]}
    assert not bad, f"relative RMS error above {TOL[dtype]}: {bad}"
    if dtype == "fp32":  # strict products: the top-n is float64's but for exact near-ties
        assert agree >= 0.999


def test_float32_with_tf32_allowed_uses_it():
    """torch.set_float32_matmul_precision('high') lets the kernels' float32 products run as TF32:
    the error against float64 rises from strict products' (< 2e-5) to TF32's, within the bf16 bound."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        tf32, _ = _core_errors(torch.float32, 64, 6, 555)
        torch.set_float32_matmul_precision("highest")
        strict, _ = _core_errors(torch.float32, 64, 6, 555)
    finally:
        torch.set_float32_matmul_precision(before)
    print(f"\n[tf32] o {tf32['o']:.2e} (strict {strict['o']:.2e}), dq {tf32['dq']:.2e} (strict {strict['dq']:.2e})")
    assert strict["o"] < 2e-5 < tf32["o"] < 5e-3
