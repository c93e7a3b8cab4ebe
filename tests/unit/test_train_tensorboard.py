"""The trainer's own TensorBoard events (telemetry.tensorboard, nsa/train/tensorboard.py): written
into out_dir/tensorboard and readable back; NSA_TB_DISABLE=1 turns them off; without the
package the run goes on and env.json says why."""
from __future__ import annotations

import csv
import importlib.util
import json
import sys

import pytest

from nsa.train.cli import run

TINY = "model.n_layers=1 train.seq_len=32 train.print_every=100 train.save_final=false"
needs_tb = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                              reason="the tensorboard package is not installed (pip install -e '.[tensorboard]')")


def train(out, extra="", env=None, steps=3) -> int:
    return run("tiny", [f"{TINY} train.steps={steps} train.out_dir={out} {extra}"], env=env or {})


def tb_note(out) -> dict:
    return json.loads((out / "env.json").read_text())["tensorboard"]


@needs_tb
def test_the_trainer_writes_its_logged_steps_as_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert train(tmp_path, "telemetry.tensorboard=true") == 0
    assert tb_note(tmp_path)["writing"] is True
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_reserved_gb", "gate_cmp", "gate_sel",
            "gate_win", "achieved_tflops"} <= tags
    with open(tmp_path / "training.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {e.step: e.value for e in acc.Scalars("loss")} == pytest.approx(
        {int(r["step"]): float(r["loss"]) for r in rows}, rel=1e-5)
    flops = json.loads((tmp_path / "env.json").read_text())["model_flops_per_token"]
    assert [e.value for e in acc.Scalars("achieved_tflops")] == pytest.approx(
        [float(r["toks_per_s"]) * flops / 1e12 for r in rows], rel=1e-4)


def test_nsa_tb_disable_turns_the_writer_off(tmp_path):
    assert train(tmp_path, "telemetry.tensorboard=true", env={"NSA_TB_DISABLE": "1"}) == 0
    assert not (tmp_path / "tensorboard").exists()
    note = tb_note(tmp_path)
    assert note["writing"] is False and "NSA_TB_DISABLE" in note["note"]
    assert "NSA_TB_DISABLE" not in json.loads((tmp_path / "env.json").read_text())["noop_toggles"]


def test_off_by_default_and_the_toggle_is_then_a_reported_noop(tmp_path):
    assert train(tmp_path, env={"NSA_TB_DISABLE": "1"}) == 0
    assert not (tmp_path / "tensorboard").exists() and tb_note(tmp_path)["writing"] is False
    assert "no TensorBoard writer" in json.loads((tmp_path / "env.json").read_text())["noop_toggles"]["NSA_TB_DISABLE"]


def test_without_the_package_the_run_goes_on_and_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if tensorboard were absent
    assert train(tmp_path, "telemetry.tensorboard=true") == 0
    note = tb_note(tmp_path)
    assert note["writing"] is False and "pip install -e '.[tensorboard]'" in note["note"]


@needs_tb
def test_a_resumed_run_continues_its_events_and_a_fresh_run_replaces_them(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def loss_steps() -> list[int]:
        acc = EventAccumulator(str(tmp_path / "tensorboard"))
        acc.Reload()
        return [e.step for e in acc.Scalars("loss")]

    assert train(tmp_path, "telemetry.tensorboard=true train.run_steps=2", steps=4) == 0  # stops and saves at 2
    assert train(tmp_path, "telemetry.tensorboard=true train.resume=auto", steps=4) == 0
    assert loss_steps() == [1, 2, 3, 4]
    assert train(tmp_path, "telemetry.tensorboard=true", steps=2) == 0  # afresh over it
    assert loss_steps() == [1, 2] and len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
