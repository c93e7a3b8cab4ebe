"""Model FLOPs per token (nsa/model/flops.py) against a count made by hand, matrix product by
matrix product, for one tiny config of each attention kind; the per-position key counts against
the NSA semantics enumerated key by key; and the trainer's env.json carrying the count."""
from __future__ import annotations

import json

import pytest

from nsa.attention.config import NSAConfig
from nsa.model.config import ModelConfig
from nsa.model import flops
from nsa.model.flops import (compressed_tokens, compressed_visible, compressed_visible_total, dense_keys,
                             dense_keys_total, forward_flops_per_token, selected_keys, selected_keys_total,
                             training_flops_per_token, window_keys, window_keys_total)
from nsa.train.cli import run

# dim D=8, 2 layers, HQ=2 query heads, H=1 KV head, head dim K=4, SwiGLU hidden F=12, vocab V=256
# (the byte tokenizer's); NSA l=4, d=2, l'=4, n=3, w=5; sequences of S=16
SHAPE = dict(dim=8, n_layers=2, n_heads=2, n_kv_groups=1, head_dim=4, vocab_size=256, ffn_hidden=12)
NSA = dict(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=5)
S = 16


def tiny(kind: str) -> ModelConfig:
    return ModelConfig(**SHAPE, attn=NSAConfig(kind=kind, **NSA))


# Keys each position t = 0..15 attends, written out from the semantics (not from the code):
# compressed token i covers [2i, 2i+4) and is visible once 2i+3 <= t: none before t=3, then one
# more every 2 positions; 7 tokens fit in 16 positions (i = 0..6)
CMP_VISIBLE = [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7]                           # sum 49
# selection blocks of 4: up to 3 blocks visible (t < 12) every earlier key; from t=12 the 4th
# block is visible and n=3 caps it: 2 full blocks (8 keys) + the current block up to t
SEL_KEYS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 9, 10, 11, 12]                         # sum 120
WIN_KEYS = [1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]                               # sum 70
DENSE_KEYS = list(range(1, 17))                                                            # sum 136


def hand_count_nsa() -> dict[str, float]:
    """Forward FLOPs per token, whole model; 2 FLOPs per multiply-add."""
    layers = 2
    per_key = 2 * 4 * 2 + 2 * 4 * 2           # q.k (2K) and p*v (2K) for each of 2 query heads = 32
    return {
        "q_proj": layers * 2 * 8 * 8,          # [1, 8] x [8, HQ*K=8]: 128 per layer
        "o_proj": layers * 2 * 8 * 8,          # [1, 8] x [8, 8]: 128
        "kv_proj": layers * 2 * 8 * 24,        # six per-branch k/v, H*K=4 each: [1, 8] x [8, 24]: 384
        "gates": layers * 2 * 8 * 6,           # 3 gates per query head: [1, 8] x [8, 6]: 96
        # phi per compressed token and KV head: fc1 [1, l*K=16] x [16, 4] = 128, fc2 [1,4] x [4,4] = 32;
        # for the keys and the values: 320; 7 compressed tokens over 16 positions
        "compress_phi": layers * 320 * 7 / 16,  # 140 per layer
        "attn_cmp": layers * per_key * 49 / 16,  # 98
        "attn_sel": layers * per_key * 120 / 16,  # 240
        "attn_win": layers * per_key * 70 / 16,  # 140
        "ffn": layers * (2 * 8 * 24 + 2 * 12 * 8),  # gate+up [1,8] x [8,24] = 384, down [1,12] x [12,8] = 192
        "lm_head": 2 * 8 * 256,                 # once: [1, 8] x [8, 256] = 4096
    }


def hand_count_dense() -> dict[str, float]:
    layers, per_key = 2, 32
    return {"q_proj": layers * 128, "o_proj": layers * 128,
            "kv_proj": layers * 2 * 8 * 8,      # one k and one v, H*K=4 each: [1, 8] x [8, 8] = 128
            "attn_dense": layers * per_key * 136 / 16,  # 272 per layer
            "ffn": layers * 576, "lm_head": 4096}


def test_the_key_counts_written_out_above_are_what_they_claim():
    assert (sum(CMP_VISIBLE), sum(SEL_KEYS), sum(WIN_KEYS), sum(DENSE_KEYS)) == (49, 120, 70, 136)


def test_nsa_forward_and_training_flops_match_the_hand_count():
    got = forward_flops_per_token(tiny("nsa"), S)
    assert got == pytest.approx(hand_count_nsa())
    forward = 256 + 256 + 768 + 192 + 280 + 196 + 480 + 280 + 1152 + 4096
    assert sum(hand_count_nsa().values()) == forward == 7956
    assert training_flops_per_token(tiny("nsa"), S) == 3 * 7956 == 23868


def test_dense_forward_and_training_flops_match_the_hand_count():
    got = forward_flops_per_token(tiny("dense"), S)
    assert got == pytest.approx(hand_count_dense())
    assert sum(hand_count_dense().values()) == 256 + 256 + 256 + 544 + 1152 + 4096 == 6560
    assert training_flops_per_token(tiny("dense"), S) == 3 * 6560 == 19680


def test_mean_pooling_has_no_matrix_product():
    cfg = ModelConfig(**SHAPE, attn=NSAConfig(phi="mean", **NSA))
    assert forward_flops_per_token(cfg, S)["compress_phi"] == 0


def test_per_position_counts_written_out_by_hand():
    assert [compressed_visible(t, 4, 2) for t in range(S)] == CMP_VISIBLE
    assert compressed_tokens(S, 4, 2) == 7 and compressed_tokens(3, 4, 2) == 0
    assert [selected_keys(t, 4, 3) for t in range(S)] == SEL_KEYS
    assert [window_keys(t, 5) for t in range(S)] == WIN_KEYS


@pytest.mark.parametrize("l,d,lp,n,w", [(32, 16, 64, 16, 512), (8, 4, 8, 4, 16), (4, 4, 12, 3, 7)])
def test_per_position_counts_agree_with_the_semantics_enumerated(l, d, lp, n, w):
    """Key by key: compressed token i visible when i*d + l - 1 <= t; the selected keys are those
    <= t of min(n, visible) blocks, the one holding t among them."""
    for t in range(0, 3000, 7):
        assert compressed_visible(t, l, d) == sum(1 for i in range(t + 1) if i * d + l - 1 <= t)
        visible = list(range(t // lp + 1))
        # the block holding t and min(n, visible) - 1 earlier ones (which ones: every earlier block is full)
        chosen = [visible[-1]] + visible[:-1][:min(n, len(visible)) - 1]
        assert selected_keys(t, lp, n) == sum(1 for j in chosen for k in range(j * lp, (j + 1) * lp) if k <= t)
        assert window_keys(t, w) == sum(1 for k in range(t + 1) if k > t - w)


@pytest.mark.parametrize("l,d,lp,n,w", [(32, 16, 64, 16, 512), (8, 4, 8, 4, 16), (4, 4, 12, 3, 7), (5, 3, 1, 1, 1)])
def test_the_closed_form_totals_are_the_sums_over_the_positions(l, d, lp, n, w):
    for seq_len in [*range(1, 80), 511, 512, 513, 4099]:
        positions = range(seq_len)
        assert compressed_visible_total(seq_len, l, d) == sum(compressed_visible(t, l, d) for t in positions)
        assert selected_keys_total(seq_len, lp, n) == sum(selected_keys(t, lp, n) for t in positions)
        assert window_keys_total(seq_len, w) == sum(window_keys(t, w) for t in positions)
        assert dense_keys_total(seq_len) == sum(dense_keys(t) for t in positions)


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_the_count_does_not_visit_every_position(kind, monkeypatch):
    """`train.seq_len=1000000000000` hung the trainer's set-up: the count summed each branch's keys
    position by position (minutes at 10**9, hours at 2**31, the longest sequence allowed). It is
    closed-form now: the per-position counts are called a handful of times, whatever the length."""
    calls = []
    for name in ("compressed_visible", "selected_keys", "window_keys", "dense_keys"):
        per_position = getattr(flops, name)
        monkeypatch.setattr(flops, name, lambda *a, f=per_position: calls.append(a) or f(*a))
    count = training_flops_per_token(tiny(kind), 10**6)
    assert len(calls) < 10
    assert count == training_flops_per_token(tiny(kind), 10**6)  # and a number, the same each time


def test_the_trainer_writes_the_count_into_env_json(tmp_path):
    shape = " ".join(f"model.{k}={v}" for k, v in SHAPE.items()) + " " + " ".join(
        f"model.attn.{k}={v}" for k, v in NSA.items())
    assert run("tiny", [f"{shape} train.seq_len={S} train.steps=1 train.save_final=false "
                        f"train.out_dir={tmp_path}"], env={}) == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["model_flops_per_token"] == 23868
    assert env["model_flops"]["forward_per_token"] == pytest.approx(hand_count_nsa())
