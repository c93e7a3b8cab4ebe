"""Preflight names the code it judged: from git, or, in a copy of the tree without .git (as
shipped to a GPU box), from the SOURCE_SHA stamp; with neither, preflight fails and says why.
When both answer and disagree, the newer commit wins: a stale .git beside a freshly stamped
tree (seen on a GPU box) must not name an old commit."""
from __future__ import annotations

import subprocess

from validation.judge.metrics import RunData
from validation.launch import kinds
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand


def _preflight_in(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(kinds, "REPO_ROOT", tree)
    point = expand(load_runbook("cpu_smoke"), load_profile("cpu"), ["preflight"])[0]
    out = tmp_path / "out"
    out.mkdir()
    run, errors = RunData(out_dir=out), []
    kinds.preflight(point, out, run, errors, None)
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
    assert any("git describe" in e and "SOURCE_SHA" in e for e in errors), errors


def _git(tree, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tree, check=True,
                          capture_output=True, text=True).stdout.strip()


def _repo_with_two_commits(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    _git(tree, "init", "-q")
    for n in (1, 2):
        (tree / "f.txt").write_text(str(n))
        _git(tree, "add", "f.txt")
        _git(tree, "commit", "-qm", f"c{n}")
    (tree / ".gitignore").write_text("SOURCE_SHA\n.gitignore\n")
    return tree, _git(tree, "rev-parse", "HEAD~1"), _git(tree, "rev-parse", "HEAD")


def test_git_answers_when_the_stamp_is_an_older_commit(tmp_path, monkeypatch):
    tree, old, head = _repo_with_two_commits(tmp_path)
    (tree / "SOURCE_SHA").write_text(old + "\n")  # left over from an earlier copy
    run, errors = _preflight_in(tree, tmp_path, monkeypatch)
    assert run.info["git_sha"] == head, errors
    assert "older commit" in run.info["git_sha_source"]


def test_a_stamp_newer_than_a_stale_git_wins(tmp_path, monkeypatch):
    tree, _, head = _repo_with_two_commits(tmp_path)
    newer = "cd" * 20  # a commit this repository has never seen
    (tree / "SOURCE_SHA").write_text(newer + "-dirty\n")
    (tree / "f.txt").write_text("changed after the stale .git")
    run, errors = _preflight_in(tree, tmp_path, monkeypatch)
    assert run.info["git_sha"] == newer + "-dirty", errors
    assert f"git here says {head}-dirty" in run.info["git_sha_source"]
    assert run.counts["preflight_missing"] == 0, errors


def test_git_alone_names_a_dirty_tree(tmp_path, monkeypatch):
    tree, _, head = _repo_with_two_commits(tmp_path)
    (tree / "f.txt").write_text("edited")
    run, _ = _preflight_in(tree, tmp_path, monkeypatch)
    assert run.info["git_sha"] == head + "-dirty"
    assert run.info["git_sha_source"] == "git describe"
