"""GPU parity of the Triton NSA kernels in bf16 against the float32 PyTorch path on the same
(bf16-rounded) inputs: relative RMS error <= 5e-3 on the output and on dq, dk, dv of every
branch and the gate gradients, S from 1 to 65536. The selected branch is compared with the
same selected indices (the float32 path's), so near-tie flips of bf16 scores cannot decide
the result; how often the Triton selection agrees with the float32 one is reported apart.
The selected and window branches and the gated sum run as the core runs them, one op
(nsa.kernels.gated_branches).

The float32 reference runs query chunk by query chunk (each chunk its own autograd graph,
gradients accumulated), so its memory stays linear in S.
"""
from __future__ import annotations

import pytest
import torch

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (
    torch_cmp_attention,
    torch_sel_attention,
    torch_select_blocks,
    torch_win_attention,
    visible_compressed,
)
from tests.kernels._util import rel_err


def _err(a, ref):
    """Relative RMS error; absolute max where the reference is exactly zero (e.g. dq of a
    query that sees a single key)."""
    if ref.double().norm() == 0:
        return a.double().abs().max().item() if a.numel() else 0.0
    return rel_err(a, ref)

pytestmark = pytest.mark.gpu

TOL = 5e-3
CASES = {  # id: (B, S, HQ, H, K)
    "S1": (1, 1, 16, 1, 128),
    "S333-m7c-G6": (2, 333, 12, 2, 64),
    "S2048-HQ64": (1, 2048, 64, 4, 128),
    "S8192-HQ64": (1, 8192, 64, 4, 128),
    "S65536-G2": (1, 65536, 2, 1, 64),  # few heads: the float32 reference is O(S^2/d) per head
}


def _reference(x, idx, cfg, chunk):
    """float32 forward/backward of the gated branches, query chunk by chunk."""
    ref = {k: v.detach().float().requires_grad_() for k, v in x.items() if k != "do"}
    do = x["do"].float()
    S = ref["q"].shape[1]
    outs = []
    for a in range(0, S, chunk):
        b = min(S, a + chunk)
        q, g = ref["q"][:, a:b], ref["gates"][:, a:b]
        o_cmp, _ = torch_cmp_attention(q, ref["kc"], ref["vc"], cfg, a)
        o_sel = torch_sel_attention(q, ref["k_sel"], ref["v_sel"], idx[:, a:b], cfg, a)
        o_win = torch_win_attention(q, ref["k_win"], ref["v_win"], cfg, a)
        o = g[..., 0:1] * o_cmp + g[..., 1:2] * o_sel + g[..., 2:3] * o_win
        o.backward(do[:, a:b])
        outs.append(o.detach())
    return torch.cat(outs, 1), {k: v.grad for k, v in ref.items()}


@pytest.mark.parametrize("form", ["tiles", "blocks"])
@pytest.mark.parametrize("shape", list(CASES.values()), ids=list(CASES))
def test_bf16_parity_vs_float32(shape, form, record_property):
    """form: the selected forward (attn.sel_form), token-major or key-block-major."""
    from nsa.attention.kernel_branches import (
        triton_cmp_attention,
        triton_gated_branches,
        triton_select_blocks,
    )

    B, S, HQ, H, K = shape
    cfg = NSAConfig(sel_form=form)
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    gen = torch.Generator(device="cuda").manual_seed(S)

    def rnd(*s):
        return torch.randn(*s, generator=gen, device="cuda").bfloat16()

    x = dict(q=rnd(B, S, HQ, K), kc=rnd(B, Nc, H, K), vc=rnd(B, Nc, H, K), k_sel=rnd(B, S, H, K),
             v_sel=rnd(B, S, H, K), k_win=rnd(B, S, H, K), v_win=rnd(B, S, H, K),
             gates=torch.rand(B, S, HQ, 3, generator=gen, device="cuda").bfloat16(), do=rnd(B, S, HQ, K))
    # the float32 path's selection, used by both sides of the selected branch
    with torch.no_grad():
        _, lse32 = torch_cmp_attention(x["q"].float(), x["kc"].float(), x["vc"].float(), cfg)
        idx = torch_select_blocks(x["q"].float(), x["kc"].float(), lse32, cfg)
    chunk = max(64, min(S, (1 << 26) // (HQ * max(Nc, 1) * B)))
    o_ref, g_ref = _reference(x, idx, cfg, chunk)

    leaves = {k: v.clone().requires_grad_() for k, v in x.items() if k != "do"}
    q, gt = leaves["q"], leaves["gates"]
    o_cmp, lse = triton_cmp_attention(q, leaves["kc"], leaves["vc"], cfg)
    idx_tr = triton_select_blocks(q, leaves["kc"], lse, cfg)
    # the selected and window branches and the gated sum as the core runs them: one op
    o = triton_gated_branches(gt, o_cmp, q, leaves["k_sel"], leaves["v_sel"], leaves["k_win"], leaves["v_win"],
                              idx, cfg)
    o.backward(x["do"])

    agree = (idx_tr == idx).all(-1).float().mean().item()
    errs = {"o": _err(o.float(), o_ref)}
    for name in leaves:
        if g_ref[name].numel():
            errs["d" + name] = _err(leaves[name].grad.float(), g_ref[name])
    record_property("selection_row_agreement", agree)
    for k, v in errs.items():
        record_property(f"rel_rms_{k}", v)
    print(f"\n[parity] B={B} S={S} HQ={HQ} H={H} K={K} {form} selection rows equal to fp32: {agree:.4f} | "
          + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative RMS error above {TOL}: {bad}"
    # selection sanity regardless of near-tie flips: shape, forced blocks present
    jt = torch.arange(S, device="cuda") // cfg.sel_block
    assert (idx_tr == 0).any(-1).all() and (idx_tr == jt.view(1, S, 1, 1)).any(-1).all()


def test_core_forward_backward_never_syncs_with_the_host():
    """A host sync in the attention (a .item(), a bincount, a boolean mask) stalls the CPU that
    queues the kernels: with many small launches per layer, the step becomes launch-bound. CUDA's
    sync debug mode turns any synchronising call in the fused Triton core into an error."""
    from nsa.attention.backends import Route
    from nsa.attention.core import nsa_core

    cfg = NSAConfig()
    B, S, HQ, H, K = 2, 1024, 12, 2, 64
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    routes = {s: Route(s, "triton", "test") for s in ("cmp", "select", "sel", "win")}
    leaves = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for shape in [(B, S, HQ, K), (B, Nc, H, K), (B, Nc, H, K)] + [(B, S, H, K)] * 4]
    gates = torch.rand(B, S, HQ, 3, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    nsa_core(*leaves, gates, cfg, routes).sum().backward()  # warm-up: compile the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = nsa_core(*leaves, gates, cfg, routes)
        torch.autograd.grad(o, leaves + [gates], torch.ones_like(o))
    finally:
        torch.cuda.set_sync_debug_mode("default")
