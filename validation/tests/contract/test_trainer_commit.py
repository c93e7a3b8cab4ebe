"""Provenance (issue 24, case 5): the trainer's own git_sha in env.json names its commit (the report
once said "at an unknown commit"); baselines and bless record the trainer's commit beside this
repository's, and the regression advice bisects the trainer's commits, this repository's only
when the trainer is this project's own."""
from __future__ import annotations

import dataclasses
import subprocess

import yaml

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.findings import Severity, find
from validation.judge.findings.advice import recommendations
from validation.judge.provenance import trainer_commit
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.machine import Machine
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions
from validation.store.baseline import compare
from validation.store.bless import bless
from validation.store.goldens import GoldenFile
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def test_the_trainers_own_git_sha_comes_first():
    assert trainer_commit({"git_sha": "abc123"}, "def456", "git describe") == ("abc123", "env.json git_sha")
    assert trainer_commit({"git_sha": "abc123", "git_sha_source": "SOURCE_SHA"}, None, None) == (
        "abc123", "env.json git_sha (SOURCE_SHA)")
    # words are no commit: what the harness found at the trainer's root, else nothing
    unknown = {"git_sha": "unknown (git unavailable or not a repository, and no SOURCE_SHA stamp)"}
    assert trainer_commit(unknown, "def456", "git describe") == ("def456", "git describe")
    assert trainer_commit({}, None, "git describe") == (None, None)


def test_a_trainer_writing_git_sha_is_reported_at_that_commit(tmp_path):
    """tests/trainers/native_train.py writes git_sha 'test' into its env.json."""
    path = tmp_path / "native.yaml"
    path.write_text(yaml.safe_dump({
        "name": "native", "profiles": ["cpu"],
        "trainer": {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
                    "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]},
        "defaults": {"steps": 4, "timeout_s": 60}, "phases": [{"name": "single", "kind": "train"}]}))
    rb, prof = load_runbook(path), load_profile("cpu")
    (point,) = expand(rb, prof)
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.PASS, rec.reason
    assert (rec.trainer, rec.trainer_sha, rec.trainer_sha_source) == ("native_test", "test", "env.json git_sha")
    text = render_text({**build_context(tmp_path / "res", rb.name, prof.name, runbook=rb, profile=prof),
                        "results_prefix": ".."})
    assert "- **Trainer**: native_test (the runbook's `trainer:`), at test (from env.json git_sha)\n" in text


def _rec(trainer: str, trainer_sha: str | None, toks: float, git_sha: str = "harness0") -> PhaseRecord:
    return PhaseRecord(PointKey("rb", "cpu", "long_run"), "rb/cpu/long_run/default", "train", Status.PASS, "",
                       exit_code=0, metrics=Summary(toks_per_s_mean=toks), trainer=trainer, trainer_sha=trainer_sha,
                       git_sha=git_sha, started="2026-01-01T00:00:00.000+00:00")


def test_a_baseline_regression_names_and_bisects_the_trainers_commits(tmp_path):
    comparison = compare([_rec("seed", "trainer2", 40.0)], [_rec("seed", "trainer1", 100.0)], tmp_path, 0.05)
    [finding] = comparison.findings()
    assert "below baseline seed at trainer1 in long_run [default]" in finding.title
    assert finding.detail[0].endswith("this repository at harness0")
    [advice] = recommendations([finding])
    assert "bisect the trainer's commits between the baseline's and this one" in advice
    own = compare([_rec("nsa.train", "h2", 40.0, "h2")], [_rec("nsa.train", "h1", 100.0, "h1")], tmp_path, 0.05)
    [finding] = own.findings()
    assert "below baseline h1 in long_run [default]" in finding.title
    assert "bisect this repository's commits" in recommendations([finding])[0]


def test_bless_records_the_trainers_commit_beside_this_repositorys(tmp_path):
    rb_path = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=2, steps=2, gates=[])])
    rb, prof = load_runbook(rb_path), load_profile("cpu")
    (point,) = expand(rb, prof)
    out = tmp_path / "res" / "runs" / "x"
    out.mkdir(parents=True)
    (out / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                      "1,5.0,1e-4,1,1,1,1,1\n2,4.5,1e-4,1,1,1,1,1\n")
    rec = PhaseRecord.for_point(point, Status.PASS, "", exit_code=0, hardware=Machine(), out_dir="runs/x",
                                trainer="seed", trainer_sha="trainer1", git_sha="harness0")
    ResultStore(tmp_path / "res").put(rec)
    (blessed,) = bless(tmp_path / "res", rb, prof, [point])
    assert (blessed.trainer, blessed.commit, blessed.harness_commit) == ("seed", "trainer1", "harness0")
    curve = GoldenFile.for_pair(rb.path, rb.name, prof.name).get("long_run/default", "cpu")
    assert (curve.trainer, curve.commit, curve.harness_commit, curve.loss) == ("seed", "trainer1", "harness0", (5.0, 4.5))
    saved = yaml.safe_load((tmp_path / "goldens" / "fake__cpu.yaml").read_text())["points"]["long_run/default"]["cpu"]
    assert (saved["trainer"], saved["commit"], saved["harness_commit"]) == ("seed", "trainer1", "harness0")


def test_points_run_at_different_commits_are_a_warning_naming_each(tmp_path):
    """One phase re-run after a commit keeps the other points' records of the earlier commit: the
    report said GO at one Git SHA (the first record's), as if the newest tree had run every point."""
    new = {"NSA_FAKE_GIT_SHA": "1" * 40}  # the fake trainer's env.json git_sha: the tree after the commit
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"

    def run(single_env: dict, *args: str) -> int:
        write_runbook(rb, [train_phase("single_gpu", gates=[], env=single_env), train_phase("long_run", gates=[], env=new)])
        return main(["run", "--runbook", str(rb), "--results-dir", str(res), *args])

    assert run({}) == 0  # single_gpu at commit 0..., long_run at 1...
    records = ResultStore(res).records()
    [finding] = [f for f in find(records) if f.kind == "commits"]
    assert finding.severity == Severity.WARNING and finding.phase == "single_gpu"
    assert finding.title == ("the points ran at 2 commits of the trainer: 1 of them not at the newest, 111111111111, "
                             "so this verdict is not one commit's")
    assert finding.detail == ["commit 111111111111 (the newest): long_run [default]",
                              "commit 000000000000: single_gpu [default]"]
    [advice] = recommendations([finding])
    assert advice.startswith("single_gpu: Points of this report ran at different commits")
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert f"- **Git SHA**: the points ran at 2 commits: {'0' * 40}, {'1' * 40}\n" in text
    # one commit again once the older point is re-run: no warning, one Git SHA
    assert run(new, "--phase", "single_gpu") == 0
    assert not [f for f in find(ResultStore(res).records()) if f.kind == "commits"]
    assert f"- **Git SHA**: {'1' * 40}" in (res / "reports" / "fake__cpu.md").read_text()


def _git_describe() -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty", "--abbrev=40"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_pytest_point_records_the_commit_it_ran_at(fake_run):
    """A sanity or selection_parity point (kind pytest) recorded no commit: the report's Git SHA and
    the mixed-commit warning could not say at which commit its tests passed."""
    run = fake_run([{"name": "sanity", "kind": "pytest", "tests": ["validation/tests/test_layout.py::test_no_import_cycle"],
                     "timeout_s": 120, "gates": [{"metric": "tests_failed", "op": "<=", "threshold": 0}]}])
    rec = run.record
    assert rec.status == Status.PASS, rec.reason
    # the source says 'git describe', with a note where a stale SOURCE_SHA stamp lies in the checkout
    assert rec.git_sha == _git_describe() and rec.git_sha_source.startswith("git describe"), rec.git_sha_source
    assert rec.ran_at == rec.git_sha
    # read back from the store, as the report reads it
    [stored] = ResultStore(run.results).records()
    assert stored.git_sha == rec.git_sha and f"- **Git SHA**: {rec.git_sha} (from {rec.git_sha_source})" in run.report


def _point(phase: str, kind: str, sha: str, trainer: str = "nsa.train", started: str = "00") -> PhaseRecord:
    return PhaseRecord(PointKey("rb", "cpu", phase), f"rb/cpu/{phase}/default", kind, Status.PASS, "", exit_code=0,
                       out_dir=f"runs/{phase}", trainer=trainer, git_sha=sha,
                       trainer_sha=sha if kind not in ("pytest", "preflight") and trainer == "nsa.train" else None,
                       started=f"2026-01-01T00:00:{started}.000+00:00")


def test_the_mixed_commit_warning_covers_pytest_points_of_this_projects_trainer():
    """sanity passed at an older commit and the train points ran at the newest: the report said GO
    at the newest commit with no word that its tests had not run there."""
    records = [_point("sanity", "pytest", "a" * 40), _point("long_run", "train", "b" * 40, started="10")]
    [finding] = [f for f in find(records) if f.kind == "commits"]
    assert finding.phase == "sanity"
    assert finding.detail == ["commit bbbbbbbbbbbb (the newest): long_run [default]", "commit aaaaaaaaaaaa: sanity [default]"]
    assert not [f for f in find([_point("sanity", "pytest", "b" * 40), records[1]]) if f.kind == "commits"]
    # beside a runbook's own trainer, the tests are of this repository, not of the trainer: not its commit
    foreign = [_point("sanity", "pytest", "a" * 40, trainer="nsa.train"),
               dataclasses.replace(_point("long_run", "train", "h" * 40, trainer="seed", started="10"),
                                   trainer_sha="b" * 40)]
    assert not [f for f in find(foreign) if f.kind == "commits"]


def test_the_mixed_commit_warning_covers_preflight_points_of_this_projects_trainer():
    """preflight recorded the tree at an older commit (git describe, collect_env, nvidia-smi of
    that tree) and the train points ran at the newest: no warning said the preflight described
    another tree than the one judged."""
    records = [_point("preflight", "preflight", "a" * 40), _point("long_run", "train", "b" * 40, started="10")]
    [finding] = [f for f in find(records) if f.kind == "commits"]
    assert finding.phase == "preflight"
    assert finding.detail == ["commit bbbbbbbbbbbb (the newest): long_run [default]",
                              "commit aaaaaaaaaaaa: preflight [default]"]
    assert not [f for f in find([_point("preflight", "preflight", "b" * 40), records[1]]) if f.kind == "commits"]
    # beside a runbook's own trainer, preflight records this repository (the harness), not the trainer
    foreign = [_point("preflight", "preflight", "a" * 40, trainer="seed"),
               dataclasses.replace(_point("long_run", "train", "h" * 40, trainer="seed", started="10"),
                                   trainer_sha="b" * 40)]
    assert not [f for f in find(foreign) if f.kind == "commits"]


def test_a_runbook_trainer_of_no_recorded_commit_did_not_run_at_the_harnesss():
    """A runbook's own trainer crashed before it wrote env.json (no git_sha) from a root that is no
    repository of its own: the mixed-commit warning listed that point at the harness's commit, beside
    the trainer's own commit of the points that wrote one."""
    unknown = _point("preinit", "train", "c" * 40, trainer="mine")  # git_sha: the harness's; no trainer_sha
    assert unknown.ran_at is None
    known = dataclasses.replace(_point("ddp", "train", "c" * 40, trainer="mine", started="10"), trainer_sha="d" * 40)
    assert not [f for f in find([unknown, known]) if f.kind == "commits"]


def test_a_tree_with_uncommitted_changes_is_named_apart_from_its_commit():
    """Points run before and after an edit of the tree ran at '5bb667bb...' and '5bb667bb...-dirty':
    the warning read '12 of them not at the newest, 5bb667bbc52a' and listed 'commit 5bb667bbc52a
    (the newest): ...' above 'commit 5bb667bbc52a: ...', two commits of one name."""
    sha = "5bb667bbc52a6ae707161cb1b511d522a5454efc"
    records = [_point("sanity", "pytest", sha), _point("long_run", "train", sha + "-dirty", started="10")]
    [finding] = [f for f in find(records) if f.kind == "commits"]
    assert finding.title == ("the points ran at 2 commits of the trainer: 1 of them not at the newest, "
                             "5bb667bbc52a-dirty, so this verdict is not one commit's")
    assert finding.detail[:2] == ["commit 5bb667bbc52a-dirty (the newest): long_run [default]",
                                  "commit 5bb667bbc52a: sanity [default]"]
    assert finding.detail[2].startswith("-dirty: the tree had uncommitted changes when the point ran")
    # git describe of a tagged history names the same commit by its hash
    tagged = [_point("sanity", "pytest", "v1.0-3-g" + sha), _point("long_run", "train", "a" * 40, started="10")]
    [finding] = [f for f in find(tagged) if f.kind == "commits"]
    assert finding.detail == ["commit aaaaaaaaaaaa (the newest): long_run [default]", "commit 5bb667bbc52a: sanity [default]"]
