"""``python -m nsa.train --list-keys``: the config keys the harness checks a runbook's overrides
against, as a JSON list, from a process that never imports torch (nsa/train/keys.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
