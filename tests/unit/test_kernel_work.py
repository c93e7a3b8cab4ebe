"""The FLOP and byte counts behind the benchmark's TFLOP/s and GB/s (bench/kernel_work.py),
on a shape small enough to count by hand: B=1, S=14, HQ=2, H=1, K=8, bf16 (2 bytes);
l=4, d=2, l'=4, n=3, w=3."""
from __future__ import annotations

import pytest

from bench import kernel_work as kw
from nsa.attention.config import NSAConfig

CFG = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=3)
X = kw.Shape(B=1, S=14, HQ=2, H=1, K=8)
# tensor sizes in bytes: q-shaped [1, 14, 2, 8] bf16; per-token k or v [1, 14, 1, 8];
# compressed kc or vc [1, 6, 1, 8]; lse/delta [1, 14, 2] float32; idx [1, 14, 1, 3] int64
Q, KV, KC, LSE, IDX = 448, 224, 96, 112, 336


def test_visible_pairs():
    # compressed: query t >= 3 sees (t - 3) // 2 + 1 tokens: 1,1,2,2,3,3,4,4,5,5,6
    assert kw.compressed_tokens(14, CFG) == 6
    assert kw.cmp_pairs(14, CFG) == 36
    # selected: t + 1 keys while the block t // 4 < 3 (1 + ... + 12 = 78), then two whole
    # blocks and the own block up to t: t=12 -> 9, t=13 -> 10
    assert kw.sel_pairs(14, CFG) == 97
    # window 3: 1, 2, then 3 for each of the other 12 queries
    assert kw.win_pairs(14, CFG) == 39
    assert kw.causal_pairs(14) == 105


def test_kernel_work_counted_by_hand():
    # FLOPs: 2 per multiply-add x K=8 x pairs x HQ=2, times the products of each pass
    assert kw.topn(X, CFG) == kw.Work(2 * 8 * 36 * 2, Q + KC + LSE + IDX)
    assert kw.cmp_fwd(X, CFG) == kw.Work(2 * 2 * 8 * 36 * 2, 2 * Q + 2 * KC + LSE)
    assert kw.sel_fwd(X, CFG) == kw.Work(2 * 2 * 8 * 97 * 2, 2 * Q + 2 * KV + LSE + IDX)
    # dq: reads q, o, dO, k, v, lse, idx; writes dq and delta
    assert kw.sel_dq(X, CFG) == kw.Work(2 * 3 * 8 * 97 * 2, 4 * Q + 2 * KV + 2 * LSE + IDX)
    # dk/dv: reads q, dO, k, v, lse, delta, idx; writes dk, dv
    assert kw.sel_dkv(X, CFG) == kw.Work(2 * 4 * 8 * 97 * 2, 2 * Q + 4 * KV + 2 * LSE + IDX)
    # a whole backward: reads q, o, dO, k, v, lse; writes dq, dk, dv
    assert kw.win_bwd(X, CFG) == kw.Work(2 * 7 * 8 * 39 * 2, 4 * Q + 4 * KV + LSE)
    assert kw.sel_bwd(X, CFG) == kw.sel_dq(X, CFG) + kw.sel_dkv(X, CFG)
    # long contexts: dq from what the dk/dv pass keeps per (token, query head, selected block):
    # dS tiles of l' = 4 values (14 * 2 * 3 * 4 * 2 bytes; dq = dS K reads k) or dq partials of
    # K = 8 values (one product more in the dk/dv pass; dq sums them); delta has its own pass
    DS, DQP = 14 * 2 * 3 * 4 * 2, 14 * 2 * 3 * 8 * 2
    assert kw.sel_dq(X, CFG, keep="ds") == kw.Work(2 * 1 * 8 * 97 * 2, Q + KV + DS + IDX)
    assert kw.sel_dkv(X, CFG, keep="ds") == kw.sel_dkv(X, CFG) + kw.Work(0, DS)
    assert kw.sel_bwd(X, CFG, keep="ds") == (kw.sel_dq(X, CFG, "ds") + kw.sel_dkv(X, CFG, "ds")
                                             + kw.Work(0, 2 * Q + LSE))
    assert kw.sel_dq(X, CFG, keep="dq") == kw.Work(0, Q + DQP + IDX)
    assert kw.sel_dkv(X, CFG, keep="dq") == kw.sel_dkv(X, CFG) + kw.Work(2 * 1 * 8 * 97 * 2, DQP)
    assert kw.sel_bwd(X, CFG, keep="dq") == (kw.sel_dq(X, CFG, "dq") + kw.sel_dkv(X, CFG, "dq")
                                             + kw.Work(0, 2 * Q + LSE))


def test_core_is_the_sum_of_its_kernels_and_the_gated_sum():
    gates = 14 * 2 * 3 * 2
    fwd = kw.topn(X, CFG) + kw.cmp_fwd(X, CFG) + kw.sel_fwd(X, CFG) + kw.win_fwd(X, CFG)
    assert kw.core_fwd(X, CFG) == fwd + kw.Work(0, gates + 4 * Q)
    bwd = kw.cmp_bwd(X, CFG) + kw.sel_bwd(X, CFG) + kw.win_bwd(X, CFG)
    assert kw.core_bwd(X, CFG) == bwd + kw.Work(0, 2 * gates + 7 * Q)
    for keep in ("dq", "ds"):
        bwd_kept = kw.cmp_bwd(X, CFG) + kw.sel_bwd(X, CFG, keep) + kw.win_bwd(X, CFG)
        assert kw.core_bwd(X, CFG, keep) == bwd_kept + kw.Work(0, 2 * gates + 7 * Q)


def test_rates():
    w = kw.Work(flops=3e12, bytes=2e9)
    assert w.tflops(1000.0) == pytest.approx(3.0)
    assert w.gbps(500.0) == pytest.approx(4.0)
