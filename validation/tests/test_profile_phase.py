"""The profiler phase profiles the trainer a train phase would run: the config's own shape,
dtype and micro-batches (an H100 acceptance once profiled a 64-token fp32 toy because only the
overrides were read), with the phase's overrides on top."""
from __future__ import annotations

import json

import yaml

from nsa.config import resolve_config_path
from validation import profile_phase


def test_profiles_the_configs_own_shape_through_the_trainer(tmp_path):
    cfg = yaml.safe_load(resolve_config_path("tiny").read_text())
    cfg["train"].update(seq_len=40, batch_size=3, grad_accum=2)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert profile_phase.main(["--config", str(path), "--out-dir", str(out), "--steps", "2",
                               "--override", "data.dataset=synthetic train.batch_size=1"]) == 0
    got = json.loads((out / "profile.json").read_text())
    assert (got["seq_len"], got["batch_size"], got["grad_accum"]) == (40, 1, 2)  # override beats the file
    assert got["counts"]["profiled_steps"] == 2
    assert got["counts"]["nsa_ranges_found"] >= 4, got["nsa_ranges"]
    assert 0.0 <= got["counts"]["python_overhead_frac"] <= 1.0
    assert (out / "trainer" / "env.json").is_file()  # the real trainer ran, writing where it was told
    assert "Self CPU" in (out / "profile_top_ops.txt").read_text()
    assert 1 <= len(got["top_ops"]) <= 5 and all(op.endswith("ms/step") for op in got["top_ops"])


def test_compiled_steps_are_attributed_through_the_kernel_ops():
    # torch.compile drops record_function ranges; the Triton kernels' custom ops stay in the graph
    keys = ["aten::mm", "nsa.sel", "nsa::sel_fwd", "nsa::band_bwd", "nsa_other", "validation.step", "nsa::sel_fwd"]
    assert profile_phase.nsa_attribution(keys) == ["nsa.sel", "nsa::band_bwd", "nsa::sel_fwd"]
