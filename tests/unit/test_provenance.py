"""The revision recorded in env.json and by preflight: git's, for a tree that is its repository's
top level only; else, or when the repository beside the tree is stale (its history lacks the
stamp's commit, as it was once on a GPU box), the SOURCE_SHA stamp's; else none. The git runs are
faked in the first tests; the last ones use real repositories, one with a trainer tree exported
into a directory of it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from nsa.provenance import source_revision
from nsa.train import telemetry

HEAD, OLD, NEW = "a" * 40, "b" * 40, "c" * 40


def fake_git(described, ancestors=(), toplevel=None):
    """git answering ``described`` for the repository whose top level is ``toplevel``."""
    def git(*args):
        if args[0] == "describe":
            return described
        if args == ("rev-parse", "--show-toplevel"):
            return None if described is None else str(toplevel)
        if args[:2] == ("merge-base", "--is-ancestor"):
            return "" if args[2] in ancestors else None
        raise AssertionError(f"unexpected git call {args}")
    return git


def test_git_alone(tmp_path):
    assert source_revision(tmp_path, fake_git(HEAD + "-dirty", toplevel=tmp_path)) == (HEAD + "-dirty", "git describe")


def test_stamp_alone(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "\n")
    sha, source = source_revision(tmp_path, fake_git(None))
    assert sha == NEW and source.startswith("SOURCE_SHA")


def test_neither(tmp_path):
    sha, source = source_revision(tmp_path, fake_git(None))
    assert sha is None and "no SOURCE_SHA stamp" in source


def test_a_leftover_stamp_loses_to_git(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(OLD + "-dirty\n")
    sha, source = source_revision(tmp_path, fake_git(HEAD, ancestors=(OLD,), toplevel=tmp_path))
    assert sha == HEAD and "older commit" in source


def test_a_stale_repository_loses_to_the_stamp(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "\n")
    sha, source = source_revision(tmp_path, fake_git(HEAD + "-dirty", toplevel=tmp_path))
    assert sha == NEW and f"git here says {HEAD}-dirty" in source


def test_git_of_an_enclosing_repository_is_not_the_trees(tmp_path):
    tree = tmp_path / "vendor" / "trainer"
    tree.mkdir(parents=True)
    sha, source = source_revision(tree, fake_git(HEAD, toplevel=tmp_path))
    assert sha is None and f"repository at {tmp_path}, which only contains {tree}" in source
    (tree / "SOURCE_SHA").write_text(NEW + "\n")
    assert source_revision(tree, fake_git(HEAD, toplevel=tmp_path))[0] == NEW


def test_env_json_names_the_stamped_commit_beside_a_stale_repository(tmp_path, monkeypatch):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "-dirty\n")
    monkeypatch.setattr(telemetry, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(telemetry, "_git", fake_git(HEAD + "-dirty", toplevel=tmp_path))
    env = telemetry.environment()
    assert env["git_sha"] == NEW + "-dirty" and env["git_dirty"] is True
    assert "stale repository" in env["git_sha_source"]


# --- real repositories ------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _runner(root: Path):
    """The git runner the trainer uses (nsa/train/telemetry.py), pointed at ``root``."""
    def git(*args: str):
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else None
    return git


def _outer_repository_with_an_exported_tree(tmp_path: Path) -> tuple[Path, Path, str]:
    outer = tmp_path / "outer"
    tree = outer / "third_party" / "trainer"  # a trainer exported (no .git of its own) into it
    tree.mkdir(parents=True)
    (outer / "README").write_text("another project\n")
    (tree / "train.py").write_text("print('training')\n")
    _git(outer, "init", "-q")
    _git(outer, "add", "-A")
    _git(outer, "commit", "-qm", "outer project, trainer vendored")
    return outer, tree, _git(outer, "rev-parse", "HEAD")


def test_an_exported_tree_inside_another_repository_never_reports_its_commit(tmp_path, monkeypatch):
    outer, tree, outer_head = _outer_repository_with_an_exported_tree(tmp_path)
    assert source_revision(outer, _runner(outer)) == (outer_head, "git describe")  # the outer tree itself
    sha, source = source_revision(tree, _runner(tree))
    assert sha is None and f"repository at {outer.resolve()}" in source, source
    # the tree's own stamp names its commit
    (tree / "SOURCE_SHA").write_text(NEW + "\n")
    sha, source = source_revision(tree, _runner(tree))
    assert sha == NEW and source.startswith("SOURCE_SHA: git here answers for the repository at"), source
    # and so does env.json, through the trainer's own git runner
    monkeypatch.setattr(telemetry, "REPO_ROOT", tree)
    assert telemetry.environment()["git_sha"] == NEW
    (tree / "SOURCE_SHA").unlink()
    env = telemetry.environment()
    assert env["git_sha"] is None and outer_head not in str(env), env["git_sha_source"]


def test_a_repository_of_its_own_inside_another_one_reports_its_own_commit(tmp_path):
    outer, tree, outer_head = _outer_repository_with_an_exported_tree(tmp_path)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "the trainer's own history")
    own = _git(tree, "rev-parse", "HEAD")
    assert own != outer_head
    assert source_revision(tree, _runner(tree)) == (own, "git describe")
