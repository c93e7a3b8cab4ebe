"""Preflight names the code it judged: from git, or, in a copy of the tree without .git (as
shipped to a GPU box), from the SOURCE_SHA stamp; with neither, preflight fails and says why."""
from __future__ import annotations

from validation import phases
from validation.metrics import RunData
from validation.plan import expand
from validation.runbook import load_profile, load_runbook


def _preflight_in(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(phases, "REPO_ROOT", tree)
    point = expand(load_runbook("cpu_smoke"), load_profile("cpu"), ["preflight"])[0]
    out = tmp_path / "out"
    out.mkdir()
    run, errors = RunData(out_dir=out), []
    phases._preflight(point, out, run, errors, None)
    return run, errors


def test_stamp_names_the_commit_without_git(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "SOURCE_SHA").write_text("ab" * 20 + "-dirty\n")
    run, errors = _preflight_in(tree, tmp_path, monkeypatch)
    assert run.info["git_sha"] == "ab" * 20 + "-dirty"
    assert "SOURCE_SHA" in run.info["git_sha_source"]
    assert run.counts["preflight_missing"] == 0, errors


def test_no_git_and_no_stamp_fails_preflight(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    tree.mkdir()
    run, errors = _preflight_in(tree, tmp_path, monkeypatch)
    assert run.info["git_sha"] is None
    assert run.counts["preflight_missing"] == 1
    assert any("git rev-parse" in e for e in errors), errors
