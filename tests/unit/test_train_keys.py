"""``python -m nsa.train --list-keys``: the config keys the harness checks a runbook's overrides
against, as a JSON list, and ``--check-config``: the error each run's config would stop it with,
from a process that never imports torch (nsa/train/keys.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.train.cli import main
from nsa.train.config import config_keys

REPO = Path(__file__).resolve().parents[2]


def _list_keys(*python_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, "-m", "nsa.train", "--list-keys"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_list_keys_prints_the_config_keys_as_json_without_importing_torch():
    proc = _list_keys("-X", "importtime")
    assert proc.returncode == 0, proc.stderr
    keys = json.loads(proc.stdout)
    assert keys == sorted(config_keys())  # the same keys as a full import of the trainer's config
    assert {"train.seq_len", "model.attn.window", "dist.ddp_bucket_mb", "data.path"} <= set(keys)
    # -X importtime lists every module imported, one per line: "import time: self | cumulative | name"
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "nsa.train.config" in imported  # (the leaves loaded from their files are not listed)
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "torch was imported"
    assert "nsa.model" not in imported and "nsa.attention" not in imported


def test_the_flag_through_the_full_cli_gives_the_same_list(capsys):
    assert main(["--list-keys"]) == 0
    assert json.loads(capsys.readouterr().out) == sorted(config_keys())



def test_a_reader_that_stops_early_gets_no_traceback():
    """`python -m nsa.train --list-keys | head -c 50` (a reader gone before the keys are written)
    ended with a BrokenPipeError traceback. Here the read end is closed before the child writes."""
    proc = subprocess.Popen([sys.executable, "-m", "nsa.train", "--list-keys"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _check_config(request: str, *python_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, "-m", "nsa.train", "--check-config"], cwd=REPO, input=request,
                          capture_output=True, text=True, timeout=120)


def test_check_config_answers_what_each_run_would_stop_with_without_importing_torch():
    """`--check-config`: for each run of the JSON list on stdin, the error its config load would
    stop with (the same words a run prints after 'error: '), or null; torch is never imported."""
    runs = [{"config": "tiny", "steps": 3, "overrides": {"train.batch_size": "two"}, "env": {}},
            {"config": "tiny", "steps": 3, "overrides": {"train.seq_len": "64", "train.fused_adamw": "true"},
             "env": {"NSA_DDP_BUCKET_MB": "1"}},
            {"config": "tiny", "steps": 3, "overrides": {}, "env": {"NSA_DDP_BUCKET_MB": "lots"}},
            {"config": "tiny", "steps": 3, "overrides": {"train.steps": "5"}, "env": {}},
            {"config": "tiniest", "steps": 3}]
    proc = _check_config(json.dumps(runs), "-X", "importtime")
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout)
    assert len(answers) == 5 and answers[1] is None, answers
    assert answers[0].endswith("tiny.yaml: train.batch_size: expected an integer, got 'two' (set on the command "
                               "line: train.batch_size=two)"), answers[0]
    assert "dist.ddp_bucket_mb: expected an integer, got 'lots' (set by environment variable" in answers[2]
    assert answers[3] == "--steps 3 and the override train.steps=5 disagree: give one of them"
    assert answers[4].startswith("unknown config preset 'tiniest'")
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, "torch was imported"


def test_check_config_answers_as_the_run_does(tmp_path):
    """The answer is the run's own error line: a run given the same arguments stops with it."""
    [answer] = json.loads(_check_config(json.dumps([{"config": "tiny", "steps": 2,
                                                     "overrides": {"dist.mode": "dpp"}}])).stdout)
    run = subprocess.run([sys.executable, "-m", "nsa.train", "--config", "tiny", "--steps", "2", "--override",
                          "dist.mode=dpp", "--out-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and f"error: {answer}" in run.stderr, (answer, run.stderr)


@pytest.mark.parametrize("request_text", ["{", '{"config": "tiny"}', '[{"config": "tiny", "steps": "3"}]',
                                          '[{"config": "tiny", "overrides": {"train.lr": 0.1}}]', '[{"cfg": "tiny"}]'])
def test_check_config_refuses_a_request_of_another_shape(request_text):
    proc = _check_config(request_text)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("error: --check-config: ") and proc.stderr.count("\n") == 1, proc.stderr
