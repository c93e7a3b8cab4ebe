"""The revision recorded in env.json and by preflight: git's, or the SOURCE_SHA stamp's when the
repository beside the tree is stale (its history lacks the stamp's commit), as it was once on a
GPU box. The git runs are faked here; validation/tests/test_preflight.py uses a real repository."""
from __future__ import annotations

from nsa.provenance import source_revision
from nsa.train import telemetry

HEAD, OLD, NEW = "a" * 40, "b" * 40, "c" * 40


def fake_git(described, ancestors=()):
    def git(*args):
        if args[0] == "describe":
            return described
        if args[:2] == ("merge-base", "--is-ancestor"):
            return "" if args[2] in ancestors else None
        raise AssertionError(f"unexpected git call {args}")
    return git


def test_git_alone(tmp_path):
    assert source_revision(tmp_path, fake_git(HEAD + "-dirty")) == (HEAD + "-dirty", "git describe")


def test_stamp_alone(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "\n")
    sha, source = source_revision(tmp_path, fake_git(None))
    assert sha == NEW and source.startswith("SOURCE_SHA")


def test_neither(tmp_path):
    assert source_revision(tmp_path, fake_git(None))[0] is None


def test_a_leftover_stamp_loses_to_git(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(OLD + "-dirty\n")
    sha, source = source_revision(tmp_path, fake_git(HEAD, ancestors=(OLD,)))
    assert sha == HEAD and "older commit" in source


def test_a_stale_repository_loses_to_the_stamp(tmp_path):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "\n")
    sha, source = source_revision(tmp_path, fake_git(HEAD + "-dirty"))
    assert sha == NEW and f"git here says {HEAD}-dirty" in source


def test_env_json_names_the_stamped_commit_beside_a_stale_repository(tmp_path, monkeypatch):
    (tmp_path / "SOURCE_SHA").write_text(NEW + "-dirty\n")
    monkeypatch.setattr(telemetry, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(telemetry, "_git", fake_git(HEAD + "-dirty"))
    env = telemetry.environment()
    assert env["git_sha"] == NEW + "-dirty" and env["git_dirty"] is True
    assert "stale repository" in env["git_sha_source"]
