"""Probe of the cuDNN compressed branch on a GPU (run before trusting it on a new torch/cuDNN):
1. the folded keys/values shared by a zero batch stride give the same o, lse and gradients as
   materialized copies (cuDNN reads the strides it is given);
2. fwd and fwd+bwd medians of the compressed branch, cuDNN fold against the Triton band kernel,
   at the benchmark shapes: the crossing point sets nsa.kernels.CUDNN_MIN_QUERIES.
    python bench/gpu/cudnn_fold_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.torch_branches import visible_compressed  # noqa: E402
from nsa.kernels import cudnn_compressed as cc  # noqa: E402
from nsa.attention.kernel_branches import cudnn_cmp_attention, triton_cmp_attention  # noqa: E402

SHAPES = {"2k": (1, 2048, 64, 4, 128), "m7c_125m": (8, 2048, 12, 2, 64), "8k": (1, 8192, 64, 4, 128),
          "16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128), "64k": (1, 65536, 64, 4, 128)}


def inputs(B, S, HQ, H, K, cfg):
    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    g = torch.Generator(device="cuda").manual_seed(S)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return [r(B, S, HQ, K).requires_grad_(), r(B, Nc, H, K).requires_grad_(), r(B, Nc, H, K).requires_grad_()], r(B, S, HQ, K)


def fwd_bwd(fn, leaves, do):
    def run():
        o, _ = fn(*leaves)
        return torch.autograd.grad(o, leaves, do)
    return run


def main():
    cfg = NSAConfig()
    cc.CUDNN_MIN_QUERIES = 1
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; cuDNN {torch.backends.cudnn.version()}")
    leaves, do = inputs(1, 8192 + 7, 64, 4, 128, cfg)
    res = {}
    for share in (True, False):
        cc.SHARE_KV_BY_STRIDE = share
        o, lse = cudnn_cmp_attention(*leaves, cfg)
        res[share] = (o, lse, *torch.autograd.grad(o, leaves, do))
    diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(res[True], res[False])]
    print("# zero-stride vs materialized max |diff| (o, lse, dq, dk, dv):", " ".join(f"{x:.3e}" for x in diffs))
    cc.SHARE_KV_BY_STRIDE = True
    print("| shape | triton fwd | cudnn fwd | triton fwd+bwd | cudnn fwd+bwd | cudnn copies fwd+bwd |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, shape in SHAPES.items():
        leaves, do = inputs(*shape, cfg)
        tri = lambda q, k, v: triton_cmp_attention(q, k, v, cfg)  # noqa: E731
        cud = lambda q, k, v: cudnn_cmp_attention(q, k, v, cfg)  # noqa: E731
        with torch.no_grad():
            tf = do_bench(lambda: tri(*leaves))
            cf = do_bench(lambda: cud(*leaves))
        tfb = do_bench(fwd_bwd(tri, leaves, do))
        cfb = do_bench(fwd_bwd(cud, leaves, do))
        cc.SHARE_KV_BY_STRIDE = False
        cfb_copy = do_bench(fwd_bwd(cud, leaves, do))
        cc.SHARE_KV_BY_STRIDE = True
        print(f"| {name} | {tf:.3f} | {cf:.3f} | {tfb:.3f} | {cfb:.3f} | {cfb_copy:.3f} |", flush=True)
        leaves = do = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
