"""train.deterministic (env NSA_DETERMINISTIC): PyTorch's deterministic switches are set before
the run, env.json records them with what stays non-deterministic, and two runs give the same
per-step loss."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nsa.train import determinism
from nsa.train.config import load_run_config
from tests.unit.test_train_loop import csv_rows, train


@pytest.fixture
def restore_torch_flags(monkeypatch):
    """The switches are process-wide: put them back for the tests that run after."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


def test_key_and_env_toggle():
    assert load_run_config("tiny", env={})[0].train.deterministic is False
    cfg, resolved = load_run_config("tiny", env={"NSA_DETERMINISTIC": "1"})
    assert cfg.train.deterministic is True
    assert resolved.env_applied["NSA_DETERMINISTIC"] == {"key": "train.deterministic", "value": "1"}


def test_apply_sets_the_switches_and_off_sets_nothing(restore_torch_flags):
    assert determinism.apply(False) == {"enabled": False}
    assert not torch.are_deterministic_algorithms_enabled()
    got = determinism.apply(True)
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert got["cublas_workspace_config"] == ":4096:8" and got["non_deterministic"] == list(determinism.NON_DETERMINISTIC)


def test_two_deterministic_runs_have_the_same_loss_and_env_json_says_so(tmp_path: Path, restore_torch_flags):
    env = {"NSA_DETERMINISTIC": "1"}
    assert train(tmp_path / "a", env=env) == 0 and train(tmp_path / "b", env=env) == 0
    assert [r["loss"] for r in csv_rows(tmp_path / "a")] == [r["loss"] for r in csv_rows(tmp_path / "b")]
    envj = json.loads((tmp_path / "a" / "env.json").read_text())
    assert envj["config"]["train"]["deterministic"] is True
    assert envj["determinism"]["enabled"] and envj["determinism"]["algorithms"]
    assert envj["env_toggles"]["NSA_DETERMINISTIC"]["key"] == "train.deterministic"
