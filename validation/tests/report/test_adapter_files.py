"""The report of a runbook's trainer read through an adapter says which files the adapter built.
Of a Hugging Face Trainer's run it linked "training.csv" in the gates table and listed training.csv
and env.json among the point's files as if the Trainer had written them (it writes neither: the
hf_trainer adapter built them from trainer_state.json), and said "its env.json names no git_sha".
The adapter's ``Converted.files`` is kept in the record (``Evidence.written_by``)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from validation.cli import main

HF_LIKE = {"name": "hf_like", "root": "validation/tests", "script": "hf_like_trainer.py", "format": "hf_trainer",
           "steps": {"flag": "--max_steps"}, "out_dir": {"flag": "--output_dir"}, "phases": ["train"]}


def _hf_run(tmp_path: Path) -> tuple[dict, str]:
    """A train point of a Hugging Face Trainer-like script (hf_like_trainer.py) through ``nsa-validate
    run``: its stored record and the report."""
    rb = tmp_path / "rb.yaml"
    rb.write_text(yaml.safe_dump({"name": "mine", "profiles": ["cpu"], "trainer": HF_LIKE,
                                  "defaults": {"steps": 4, "timeout_s": 60},
                                  "phases": [{"name": "smoke", "kind": "train",
                                              "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}]},
                                 sort_keys=False))
    results = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 0
    [rec] = json.loads((results / "results.json").read_text())["records"].values()
    [report] = (results / "reports").glob("*.md")
    return rec, report.read_text()


def test_the_files_an_adapter_built_are_not_the_trainers_in_the_report(tmp_path):
    rec, report = _hf_run(tmp_path)
    assert rec["evidence"]["written_by"]["adapter"] == "hf_trainer", rec["evidence"]
    assert f"[training.csv (derived by the hf_trainer adapter)](../{rec['out_dir']}/training.csv)" in report, report
    [files] = [line for line in report.splitlines() if line.startswith(f"- [{rec['out_dir']}/]")]
    assert files.endswith("trainer_out/, training.csv; not written by the trainer: `env.json`, derived by the "
                          "hf_trainer adapter from what the harness gave it and what it read (a Trainer writes no "
                          "env.json); `training.csv`, derived by the hf_trainer adapter from trainer_state.json's "
                          "log_history"), files
    assert ("at no recorded commit (the env.json derived by the hf_trainer adapter names no git_sha, and its root is "
            "not a git repository of its own)") in report, report
