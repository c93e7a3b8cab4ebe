"""Probe: the whole top-n (topk._select_blocks) at 2, 3 and 4 pipeline stages of its score
kernel (rows 128, 4 warps), S=64k and 16k (B=1, HQ=64, H=4, K=128), random inputs, indices
checked against the first run's; 2 stages is timed again last, for the drift.

    python3 bench/gpu/topk_stages.py

First run: commit e7a4ac0, one H100 (sent to the device as a heredoc of this text;
docs/measurements/2026-11-23-e/topk_stages_e7a4ac0.log): 2 stages stayed the best.
"""
import sys

import torch
import triton

sys.path.insert(0, ".")
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention  # noqa: E402
from nsa.kernels import topk as T  # noqa: E402

cfg = NSAConfig(); L, D, LS, n = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected
for S in (65536, 16384):
    g = torch.Generator(device="cuda").manual_seed(0); Nc = (S - L) // D + 1
    q = torch.randn(1, S, 64, 128, generator=g, device="cuda").bfloat16()
    kc, vc = (torch.randn(1, Nc, 4, 128, generator=g, device="cuda").bfloat16() for _ in range(2))
    with torch.no_grad(): lse = triton_cmp_attention(q, kc, vc, cfg)[1]
    ref = None
    for st in (2, 3, 4, 2):
        T.TUNE["stages"] = st
        t = triton.testing.do_bench(lambda: T._select_blocks(q, kc, lse, 0, L, D, LS, n), warmup=50, rep=300, return_mode="median")
        idx = T._select_blocks(q, kc, lse, 0, L, D, LS, n); ref = idx if ref is None else ref
        print(f"S={S} top-n rows=128 warps=4 stages={st}: {t:.3f} ms, same indices: {torch.equal(idx, ref)}", flush=True)
