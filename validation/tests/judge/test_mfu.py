"""Model FLOPs utilisation: tokens/s x the model's FLOPs per token (env.json) over the hardware
profile's peak x world size; UNMEASURED, never a failure, where the profile names no peak."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from nsa.contract import CSV_COLUMNS
from validation.judge.gates import Gate, GateVerdict, Pending, Window, evaluate
from validation.judge.metrics import RunData, compute
from validation.judge.verdict import gate_verdict
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions

#: training FLOPs per token of the tiny config counted by hand in tests/unit/test_model_flops.py
#: (dim 8, 2 layers, 2 query heads, 1 KV head, head dim 4, FFN 12, vocab 256, l=4 d=2 l'=4 n=3 w=5, S=16)
HAND_NSA = 23868
HAND_DENSE = 19680


def _run(tmp_path, toks, flops, peak, world=1) -> RunData:
    rows = [[s, 2.0, 1e-3, t, 0.1, 1.0, 0.5, 0.5] for s, t in enumerate(toks, start=1)]
    return RunData(tmp_path, world_size=world, csv=pd.DataFrame(rows, columns=list(CSV_COLUMNS)),
                   env={"world_size": world, "model_flops_per_token": flops}, peak_flops=peak)


@pytest.mark.parametrize("flops", [HAND_NSA, HAND_DENSE])
def test_mfu_is_tokens_per_second_times_flops_over_the_peak_of_every_device(tmp_path, flops):
    run = _run(tmp_path, [100.0, 900.0, 300.0, 500.0], flops, peak=1e6, world=2)
    assert compute("mfu", run, None) == pytest.approx(450.0 * flops / 2e6)
    assert compute("mfu", run, 2) == pytest.approx(400.0 * flops / 2e6)  # the window's tokens/s: steps 3-4
    assert compute("model_flops_per_token", run, None) == flops


def test_mfu_is_none_without_the_count_or_the_peak(tmp_path):
    assert compute("mfu", _run(tmp_path, [100.0], None, 1e6), None) is None
    assert compute("mfu", _run(tmp_path, [100.0], HAND_NSA, None), None) is None


def test_a_gate_on_mfu_without_a_peak_is_unmeasured_and_says_why(tmp_path):
    gate = Gate("mfu", ">=", 0.3, Window())
    [res] = evaluate([gate], _run(tmp_path, [100.0], HAND_NSA, None), {})
    assert (res.verdict, res.pending) == (GateVerdict.UNMEASURED, Pending.NO_PEAK)
    status, reason = gate_verdict([res])
    assert status == "UNMEASURED" and "names no peak" in reason and "mfu" in reason
    [res] = evaluate([gate], _run(tmp_path, [1e3], HAND_NSA, 1e9), {})  # with one: judged, 2.4% < 30%
    assert res.verdict == GateVerdict.FAIL and res.value == pytest.approx(1e3 * HAND_NSA / 1e9)


def test_the_profiles_name_the_bf16_peaks():
    assert load_profile("h100").hardware.peak_flops == pytest.approx(989.4e12)
    assert load_profile("h200").hardware.peak_bf16_tflops == 989.4
    assert load_profile("a100").hardware.peak_bf16_tflops == 312
    assert load_profile("cpu").hardware.peak_flops is None


def test_the_real_trainer_of_the_hand_counted_model_gets_its_mfu(tmp_path):
    """End to end: this project's trainer writes the count, the harness divides by a profile's peak."""
    profile = tmp_path / "cpu_peak.yaml"
    data = yaml.safe_load(load_profile("cpu").path.read_text())
    data["name"], data["hardware"]["peak_bf16_tflops"] = "cpu_peak", 1.0
    profile.write_text(yaml.safe_dump(data))
    shape = {"model.dim": 8, "model.n_layers": 2, "model.n_heads": 2, "model.n_kv_groups": 1, "model.head_dim": 4,
             "model.ffn_hidden": 12, "model.attn.cmp_block": 4, "model.attn.cmp_stride": 2,
             "model.attn.sel_block": 4, "model.attn.n_selected": 3, "model.attn.window": 5, "train.seq_len": 16,
             "train.batch_size": 1, "train.save_final": False}
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(yaml.safe_dump({
        "name": "mfu", "profiles": ["cpu_peak"],
        "defaults": {"launcher": {"kind": "python"}, "config": "tiny", "env": {"OMP_NUM_THREADS": 1}, "steps": 3,
                     "timeout_s": 120},
        "phases": [{"name": "long_run", "kind": "train", "overrides": shape,
                    "gates": [{"metric": "mfu", "op": ">", "threshold": 0, "window": "last 2 steps"}]}]}))
    [point] = expand(load_runbook(runbook), load_profile(profile))
    rec = AcceptanceSession(SessionOptions(tmp_path / "results")).run_point(point)
    assert rec.status == "PASS", rec.reason + rec.evidence.stderr_tail
    csv = pd.read_csv(tmp_path / "results" / rec.out_dir / "training.csv")
    toks = csv[csv["step"] > 1]["toks_per_s"].mean()
    assert rec.metrics.model_flops_per_token == HAND_NSA
    assert rec.metrics.mfu == pytest.approx(toks * HAND_NSA / 1e12, rel=1e-5)
    assert rec.gates[0].value == rec.metrics.mfu
