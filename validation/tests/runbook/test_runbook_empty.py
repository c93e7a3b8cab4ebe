"""An empty key of a runbook or profile (``launcher:`` with nothing under it: YAML's null) is an
error naming the file, the key path and what was expected, not the key's default; a key indented
out of its section names the section it belongs to. Before: ``env:``, ``overrides:``, ``sweep:``
empty meant none (a sweep's points silently became one), ``kind:``, ``name:``, ``min_gpus:``
empty loaded as None, ``steps:``, ``timeout_s:``, ``config:`` empty crashed with a TypeError
(a traceback from ``nsa-validate phases`` and from pytest), the rest said 'got NoneType'."""
from __future__ import annotations

import subprocess
import sys

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.errors import RunbookError
from validation.runbook.load import load_profile, load_runbook

BASE = """\
name: probe
profiles: [cpu]
description: empty keys
defaults:
  launcher: {kind: python}
  steps: 4
  timeout_s: 60
phases:
  - name: one
    kind: train
    gates:
      - {metric: loss_finite, op: "==", threshold: 1}
  - name: two
    kind: train
    sweep:
      train.seq_len: [32, 64]
"""
GATE = '      - {metric: loss_finite, op: "==", threshold: 1}\n'
SWEEP = "    sweep:\n      train.seq_len: [32, 64]\n"


def _in_one(extra: str) -> str:
    """BASE with ``extra`` lines added to phase one (after its kind)."""
    return BASE.replace("    kind: train\n    gates", f"    kind: train\n{extra}    gates", 1)


# (runbook text, the key path named, what it says)
CASES = {
    "defaults": (BASE.replace("  launcher: {kind: python}\n  steps: 4\n  timeout_s: 60\n", ""), "defaults",
                 "expected a value for it (defaults: values every phase takes"),
    "defaults.env": (BASE.replace("  steps: 4\n", "  steps: 4\n  env:\n"), "defaults.env", "environment variables"),
    "defaults.min_gpus": (BASE.replace("  steps: 4\n", "  steps: 4\n  min_gpus:\n"), "defaults.min_gpus", "GPUs"),
    "launcher": (_in_one("    launcher:\n"), "phases[0].launcher", "how the trainer starts"),
    # its keys not indented: the empty section is named, not one of its keys as unknown in the phase
    "launcher-keys-not-indented": (_in_one("    launcher:\n    nproc: 2\n"), "phases[0].launcher", "indented under it"),
    "gates": (BASE.replace("    gates:\n" + GATE, "    gates:\n"), "phases[0].gates", "checks of the point's metrics"),
    "gates[0]": (BASE.replace(GATE, "      -\n"), "phases[0].gates[0]", "empty list item"),
    "env": (_in_one("    env:\n"), "phases[0].env", "environment variables"),
    "env-keys-not-indented": (_in_one("    env:\n    NSA_TB_DISABLE: 1\n"), "phases[0].env", "YAML reads as null"),
    "overrides": (_in_one("    overrides:\n"), "phases[0].overrides", "dotted config keys"),
    "override-value": (_in_one("    overrides:\n      train.lr:\n"), "phases[0].overrides.train.lr", "empty value"),
    "phases[0]": (BASE.replace("phases:\n", "phases:\n  -\n"), "phases[0]", "empty list item"),
    "sweep": (BASE.replace(SWEEP, "    sweep:\n"), "phases[1].sweep", "parameters to sweep"),
    "sweep-keys-not-indented": (BASE.replace(SWEEP, "    sweep:\n    train.seq_len: [32, 64]\n"), "phases[1].sweep",
                                "YAML reads as null"),
    "steps": (_in_one("    steps:\n"), "phases[0].steps", "optimizer steps"),
    "timeout_s": (_in_one("    timeout_s:\n"), "phases[0].timeout_s", "hard limit"),
    "config": (_in_one("    config:\n"), "phases[0].config", "a preset name"),
    "name": (BASE.replace("  - name: one", "  - name:"), "phases[0].name", "it is required"),
    "kind": (BASE.replace("    kind: train\n    gates", "    kind:\n    gates"), "phases[0].kind", "it is required"),
    "markers": (_in_one("    markers:\n"), "phases[0].markers", "pytest markers"),
    "window": (BASE.replace("threshold: 1}", "threshold: 1, window: }"), "phases[0].gates[0].window", "last N steps"),
    "rdzv": (_in_one("    launcher:\n      kind: torchrun\n      nnodes: 2\n      rdzv:\n"), "phases[0].launcher.rdzv",
             "YAML reads as null"),
    "profiles": (BASE.replace("profiles: [cpu]", "profiles:"), "profiles", "it is required"),
    "trainer": (BASE + "trainer:\n", "trainer", "the trainer its train phases launch"),
}


@pytest.mark.parametrize("text, key, words", CASES.values(), ids=CASES.keys())
def test_an_empty_key_names_the_file_the_key_and_what_was_expected(tmp_path, text, key, words):
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    with pytest.raises(RunbookError) as exc:
        load_runbook(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: {key}: empty"), msg
    assert words in msg, msg


@pytest.mark.parametrize("extra, named, home", [
    ("    nproc: 2\n", "phases[0].nproc", "a key of phases[].launcher"),
    ("    NSA_TB_DISABLE: 1\n", "phases[0].NSA_TB_DISABLE", "an environment variable: indent it under env:"),
    ("    train.lr: 0.1\n", "phases[0].train.lr", "a dotted config key: indent it under overrides:"),
])
def test_a_key_out_of_its_section_names_the_section_it_belongs_to(tmp_path, extra, named, home):
    path = tmp_path / "rb.yaml"
    path.write_text(_in_one(extra))
    with pytest.raises(RunbookError, match="unknown key") as exc:
        load_runbook(path)
    assert f"{path}: {named}: unknown key ({home}" in str(exc.value)


def test_every_unknown_key_is_named_with_its_section(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(BASE + "steps: 3\nnproc: 2\n")
    with pytest.raises(RunbookError) as exc:
        load_runbook(path)
    msg = str(exc.value)
    assert f"{path}: steps: unknown key (a key of defaults or phases[] or trainer" in msg
    assert "also unknown here: nproc (a key of phases[].launcher" in msg


def test_an_empty_text_for_people_means_no_text(tmp_path):
    """description, source, notes: nothing the harness does depends on them (docs/runbook_format.md)."""
    path = tmp_path / "rb.yaml"
    path.write_text(_in_one("    description:\n").replace("description: empty keys", "description:\nsource:"))
    rb = load_runbook(path)
    assert (rb.description, rb.source, rb.phases[0].description) == ("", "", "")
    prof = tmp_path / "p.yaml"
    prof.write_text("name: x\nmarker: x\nhardware: {accelerator: cpu}\nthresholds: {a: 1, b: null}\nnotes:\n")
    assert load_profile(prof).thresholds == {"a": 1.0, "b": None}  # null: to be measured


@pytest.mark.parametrize("text, key", [
    ("hardware:\nthresholds: {a: 1}\n", "hardware"),
    ("hardware: {accelerator: cpu}\nthresholds:\n", "thresholds"),
])
def test_an_empty_profile_section_names_the_file_and_key(tmp_path, text, key):
    prof = tmp_path / "p.yaml"
    prof.write_text("name: x\nmarker: x\n" + text)
    with pytest.raises(RunbookError) as exc:
        load_profile(prof)
    assert str(exc.value).startswith(f"{prof}: {key}: empty"), exc.value


@pytest.mark.parametrize("text, key", [
    ("  params:\n", "trainer.params"),
    ("  params:\n    train.lr:\n", "trainer.params.train.lr"),
    ("  env:\n", "trainer.env"),
    ("  env:\n    MY_X:\n", "trainer.env.MY_X"),
])
def test_an_empty_trainer_section_names_the_file_and_key(tmp_path, text, key):
    path = tmp_path / "rb.yaml"
    path.write_text("name: t\nprofiles: [cpu]\nphases: [{name: p, kind: train}]\ntrainer:\n  name: mine\n"
                    "  root: tests/trainers\n  script: native_train.py\n  args: [--steps, '{steps}', --out, '{out_dir}']\n"
                    + text)
    with pytest.raises(RunbookError) as exc:
        load_runbook(path)
    assert str(exc.value).startswith(f"{path}: {key}: empty"), exc.value


def test_phases_and_pytest_print_the_error_not_a_traceback(tmp_path, capsys):
    """``steps:`` empty crashed both doors with a TypeError traceback."""
    path = tmp_path / "rb.yaml"
    path.write_text(CASES["steps"][0])
    assert main(["phases", "--runbook", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"nsa-validate: error: {path}: phases[0].steps: empty" in err and "Traceback" not in err
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--co", "-m", "one",
                           "--runbook", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"{path}: phases[0].steps: empty" in out and "Traceback" not in out, out
