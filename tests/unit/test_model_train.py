"""The m7c_125m model builds, reports its size and learns on CPU at a tiny sequence length."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa.model import NSATransformer, backend_report, gate_stats, track_gates
from nsa.model.config import load_model_config


def pattern_batch(batch: int, seq_len: int, period: int = 7, seed: int = 0) -> torch.Tensor:
    """Repeating ramps with a random phase: predictable after one period."""
    g = torch.Generator().manual_seed(seed)
    phase = torch.randint(0, period, (batch, 1), generator=g)
    return (phase + torch.arange(seq_len + 1)) % period + 65


def test_m7c_125m_builds_and_learns_a_pattern():
    """The preset's size, counted on the meta device (no 125M parameters allocated); the learning
    at the preset's layer shape (12 query heads in 2 KV groups, head dim 64, its NSA blocks) in one
    layer, on one sequence a step that reaches the compressed and selected branches."""
    cfg = load_model_config("m7c_125m")
    with torch.device("meta"):
        n = NSATransformer(cfg).num_params()
    print(f"m7c_125m parameters: {n:,}")
    assert 100e6 < n < 130e6
    torch.manual_seed(0)
    cfg = load_model_config("m7c_125m", ["model.n_layers=1"])
    model = NSATransformer(cfg)
    track_gates(model)
    # seq 80 > l=32: compressed tokens exist; 2 selection blocks of 64
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(4):
        batch = pattern_batch(1, 80, seed=step)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0], losses
    stats = gate_stats(model)
    assert set(stats) == {"cmp", "sel", "win"} and all(0 < v < 1 for v in stats.values())
    # untracked (the default), a forward keeps no statistics
    untracked = NSATransformer(load_model_config("tiny"))
    untracked(batch[:, :-1])
    assert gate_stats(untracked) == {}
    assert backend_report(model)["sel"]["backend"] == "torch"


def test_incremental_decode_matches_full_forward_in_the_model():
    torch.manual_seed(0)
    cfg = load_model_config("tiny")
    model = NSATransformer(cfg).double()
    idx = torch.randint(0, 256, (2, 40))
    full = model(idx)
    caches = model.new_caches()
    steps = torch.cat([model(idx[:, t : t + 1], caches) for t in range(idx.shape[1])], dim=1)
    assert (steps - full).abs().max() <= 1e-10 * full.abs().max()
