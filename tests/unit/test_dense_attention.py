"""model.attn.kind=dense: the causal attention of the same shape that NSA is measured against,
built, routed, trained and decoded by the same model and trainer code."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nsa.attention.backends import BackendUnavailable, resolve_route
from nsa.attention.dense import DenseAttention
from nsa.attention.sdpa import causal_attention
from nsa.config import ConfigError
from nsa.model import NSATransformer, backend_report, count_calls, gate_stats
from nsa.model.config import load_model_config
from tests.unit.test_model_train import pattern_batch


def _naive_causal(q, k, v, q_start):
    """Per-query softmax over keys 0..q_start + t, float64, heads grouped by repetition."""
    G = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)
    s = torch.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])
    pos = torch.arange(q_start, q_start + q.shape[1])
    s = s.masked_fill(torch.arange(k.shape[1])[None, :] > pos[:, None], float("-inf"))
    return torch.einsum("bhts,bshk->bthk", s.softmax(-1), v)


@pytest.mark.parametrize("q_start,T", [(0, 13), (9, 4), (12, 1)], ids=["prefill", "chunk", "decode"])
def test_causal_attention_matches_naive(q_start, T):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, T, 6, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, q_start + T, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    got = causal_attention(q, k, v, q_start)
    assert torch.allclose(got, _naive_causal(q, k, v, q_start), atol=1e-12)


def test_dense_kind_builds_the_same_shape_without_nsa_parameters():
    cfg = load_model_config("tiny", "model.attn.kind=dense")
    model = NSATransformer(cfg)
    attn = model.layers[0].attn
    assert isinstance(attn, DenseAttention)
    assert attn.q_proj.weight.shape == (cfg.n_heads * cfg.head_dim, cfg.dim)
    assert attn.kv_proj.weight.shape == (2 * cfg.n_kv_groups * cfg.head_dim, cfg.dim)
    names = {n for n, _ in model.named_parameters()}
    assert not any("compress" in n or "gate_proj" in n for n in names)
    nsa = NSATransformer(load_model_config("tiny"))
    assert model.num_params() < nsa.num_params()  # one k/v pair instead of six, no gates or phi


def test_dense_kind_learns_and_reports_its_route():
    torch.manual_seed(0)
    cfg = load_model_config("tiny", "model.attn.kind=dense")
    model = NSATransformer(cfg)
    count_calls(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(8):
        batch = pattern_batch(2, 48, seed=step)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    report = backend_report(model)
    assert set(report) == {"dense"} and report["dense"]["backend"] == "torch"
    assert report["dense"]["calls"] == 8 * cfg.n_layers
    assert gate_stats(model) == {}


def test_dense_decode_matches_prefill():
    torch.manual_seed(0)
    model = NSATransformer(load_model_config("tiny", "model.attn.kind=dense")).double()
    idx = torch.randint(0, 256, (2, 30))
    full = model(idx)
    caches = model.new_caches()
    prefix = model(idx[:, :11], caches)  # a chunked prefill, then one token at a time
    steps = torch.cat([prefix] + [model(idx[:, t:t + 1], caches) for t in range(11, 30)], dim=1)
    assert (steps - full).abs().max() <= 1e-10 * full.abs().max()


def test_dense_routes():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_route("dense", "auto", cpu, torch.float32).backend == "torch"
    with pytest.raises(BackendUnavailable, match="attn.backend_dense='cudnn' cannot run on cpu"):
        resolve_route("dense", "cudnn", cpu, torch.bfloat16)
    if not torch.cuda.is_available():  # 'auto' on CUDA tries cuDNN first for half precision only
        assert "skipped cudnn (" in resolve_route("dense", "auto", cuda, torch.bfloat16).reason
        assert "cudnn" not in resolve_route("dense", "auto", cuda, torch.float32).reason


def test_bad_kind_names_the_key():
    with pytest.raises(ConfigError, match="attn.kind must be one of"):
        load_model_config("tiny", "model.attn.kind=sparse")


def test_dense_kind_compiles():
    """The trainer compiles each block (train.compile): the dense block traces whole."""
    torch.manual_seed(0)
    model = NSATransformer(load_model_config("tiny", "model.attn.kind=dense"))
    idx = torch.randint(0, 256, (1, 24))
    want = model(idx)
    for block in model.layers:
        block.compile(backend="eager", fullgraph=True)
    assert torch.allclose(model(idx), want, atol=1e-6)


def test_trainer_runs_the_dense_kind_under_the_same_contract(tmp_path):
    """python -m nsa.train --override model.attn.kind=dense: the same outputs, the route in
    env.json and the heartbeats, the SDPA toggles reported as applying to it."""
    import csv
    import json

    from nsa.train.cli import run

    out = tmp_path / "dense"
    assert run("tiny", [f"model.attn.kind=dense model.n_layers=1 train.steps=3 train.out_dir={out}"], env={}) == 0
    with open(out / "training.csv", newline="") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh)] == [1, 2, 3]
    env = json.loads((out / "env.json").read_text())
    assert env["config"]["model"]["attn"]["kind"] == "dense"
    assert env["attention_backends"]["dense"]["backend"] == "torch"
    assert env["sdpa"]["branches_on_sdpa"] == ["dense"] and env["sdpa"]["note"] == ""
    beats = [json.loads(line) for line in (out / "heartbeat_rank0.jsonl").read_text().splitlines()]
    step = [b for b in beats if b["stage"] == "step"][-1]
    assert step["routes"]["dense"]["calls"] > 0 and step["gates"] == {}


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_a_model_counts_its_attention_calls_only_when_asked(kind):
    """The backend audit's call count is a one-element add a forward: a model nobody audits does
    not run it (its report has no count), and count_calls turns it on for every layer."""
    torch.manual_seed(0)
    model = NSATransformer(load_model_config("tiny", f"model.attn.kind={kind}"))
    batch = pattern_batch(2, 48, seed=0)[:, :-1]
    model(batch)
    assert all(int(layer.attn.calls) == 0 for layer in model.layers)
    assert all(entry["calls"] is None for entry in backend_report(model).values())
    count_calls(model)
    model(batch)
    model(batch)
    assert all(entry["calls"] == 2 * len(model.layers) for entry in backend_report(model).values())
