"""The acceptance session through both doors: the same selection, the same store safety, the
same exit statuses; a report's Reproduce lines re-run their points as printed.

Each test here was a defect found by using the harness as a user would (issue "Verdicts you can
trust for any trainer", cases 10, 12 and 13)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.record import Status
from validation.report.build import build_context
from validation.runbook.load import load_profile, load_runbook
from validation.store.results import ResultStore

NATIVE: dict[str, Any] = {
    "name": "native_test", "root": "tests/trainers", "script": "native_train.py",
    "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "params": {"optim.lr": {"flag": "--lr"}}}
GATES = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, "window": "last 4 steps"},
         {"metric": "loss_finite", "op": "==", "threshold": 1}]


def _runbook(path: Path, phases: list[dict[str, Any]], trainer: dict[str, Any] | None = None, name: str = "mine"
             ) -> Path:
    data = {"name": name, "profiles": ["cpu"], "trainer": trainer or NATIVE,
            "defaults": {"steps": 8, "timeout_s": 60}, "phases": phases}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _phase(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "train", "gates": GATES, **extra}


def _pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180, env=env)


def test_a_phase_name_of_ones_own_runbook_is_a_marker_for_pytest(tmp_path):
    """`pytest -m single --runbook /elsewhere/my.yaml` failed at collection ("'single' not found in
    `markers`", rc 4) for any phase name not built into pytest.ini."""
    (tmp_path / "elsewhere").mkdir()
    rb = _runbook(tmp_path / "elsewhere" / "my.yaml", [_phase("single"), _phase("other_one")])
    res = tmp_path / "res"
    out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "-m", "single", "--runbook", str(rb),
                  "--profile", "cpu", f"--results-dir={res}")
    # the point passed; the report is INCOMPLETE (other_one not run), so the acceptance run exits 1
    assert out.returncode == 1 and "the report is INCOMPLETE" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
    assert {r.key.phase for r in ResultStore(res).records()} == {"single"}


def test_every_reproduce_line_of_a_report_reruns_its_point_as_printed(tmp_path):
    """The report's Reproduce lines are for people to paste: each, run as printed from another
    directory, runs its point again (a new run id in the store)."""
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single"), _phase("sweep", sweep={"optim.lr": [0.001, 0.002]})])
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
    before = {r.test_id: r.run_id for r in ResultStore(res).records()}
    ctx = build_context(res, "mine", "cpu", runbook=load_runbook(rb), profile=load_profile("cpu"))
    lines = [r["rerun"] for r in ctx["reproduce"]]
    assert len(lines) == 3
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "pytest"
        out = subprocess.run([sys.executable, "-m", *argv, "-p", "no:cacheprovider", "-q"], cwd=elsewhere,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0 and "1 passed" in out.stdout, line + "\n" + out.stdout[-3000:] + out.stderr[-2000:]
    after = {r.test_id: r.run_id for r in ResultStore(res).records()}
    assert set(after) == set(before) and all(after[t] != before[t] for t in before)


def test_a_reproduce_line_of_a_trainer_rooted_by_a_variable_sets_it(tmp_path, monkeypatch):
    """A user's trainer named `root: {env: MY_TRAINER_ROOT}` (docs/artifact_contract.md's own
    example): the report's Reproduce line, pasted into a shell without the variable, skipped its
    point ('the trainer's root is not set: export MY_TRAINER_ROOT=...', nothing run). The line now
    starts with the root the point ran in."""
    trainer = {**NATIVE, "root": {"env": "MY_TRAINER_ROOT"}}
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")], trainer=trainer)
    res = tmp_path / "res"
    monkeypatch.setenv("MY_TRAINER_ROOT", str(REPO_ROOT / "tests" / "trainers"))
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
    (before,) = ResultStore(res).records()
    monkeypatch.delenv("MY_TRAINER_ROOT")
    ctx = build_context(res, "mine", "cpu", runbook=load_runbook(rb), profile=load_profile("cpu"))
    (line,) = [r["rerun"] for r in ctx["reproduce"]]
    assert line.startswith(f"MY_TRAINER_ROOT={REPO_ROOT / 'tests' / 'trainers'} pytest "), line
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # as a user pastes it: through a shell whose environment lacks the variable
    env = {k: v for k, v in os.environ.items() if k != "MY_TRAINER_ROOT"}
    out = subprocess.run(["bash", "-c", line.replace("pytest ", f"{shlex.quote(sys.executable)} -m pytest ", 1)
                          + " -p no:cacheprovider -q"], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0 and "1 passed" in out.stdout, line + "\n" + out.stdout[-3000:] + out.stderr[-2000:]
    (after,) = ResultStore(res).records()
    assert after.run_id != before.run_id


def test_a_point_that_cannot_launch_leaves_the_stored_record_and_its_run_directory(tmp_path, monkeypatch, capsys):
    """Re-running a phase with the trainer root's variable unset turned the stored PASS into SKIP
    and deleted its run directory. Both doors stop as for bad input before anything runs: the
    pytest door skipped the point and exited 1, the NO-GO status, where the CLI exits 2 (and
    pytest 4, under -n as without)."""
    trainer = {**NATIVE, "root": {"env": "MY_TRAINER_ROOT"}}
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")], trainer=trainer)
    res = tmp_path / "res"
    monkeypatch.setenv("MY_TRAINER_ROOT", str(REPO_ROOT / "tests" / "trainers"))
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
    (stored,) = ResultStore(res).records()
    assert stored.status == Status.PASS and (res / stored.out_dir).is_dir()
    monkeypatch.delenv("MY_TRAINER_ROOT")
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "cannot launch here, nothing was run" in err and "export MY_TRAINER_ROOT=" in err
    for xdist in ([], ["-n", "2"]):
        out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "--runbook", str(rb), f"--results-dir={res}",
                      *xdist, env={k: v for k, v in os.environ.items() if k != "MY_TRAINER_ROOT"})
        assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout[-3000:] + out.stderr[-3000:]
        assert ("ERROR: nsa-validate: cannot launch here, nothing was run: mine/cpu/single/default: "
                in out.stderr) and "export MY_TRAINER_ROOT=" in out.stderr, out.stderr[-3000:]
    (kept,) = ResultStore(res).records()
    assert kept.run_id == stored.run_id and kept.status == Status.PASS and (res / kept.out_dir).is_dir()


def test_a_point_of_a_runbook_not_asked_for_that_cannot_launch_skips(tmp_path):
    """A run that does not name seed_trainer_cpu with --runbook (a plain test run, `pytest -m
    cpu_profile`) selects its points among every runbook's: without NSA_SEED_ROOT they skip, saying
    why, and the rest of the run goes on."""
    out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "-k", "seed_trainer_cpu/cpu/single_process",
                  f"--results-dir={tmp_path / 'res'}", env={k: v for k, v in os.environ.items() if k != "NSA_SEED_ROOT"})
    assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout[-3000:]
    assert "export NSA_SEED_ROOT=" in out.stdout and "(nothing run or stored)" in out.stdout, out.stdout[-3000:]
    assert not ResultStore(tmp_path / "res").records()


def test_a_harness_defect_on_one_point_is_its_error_and_the_session_goes_on(tmp_path, monkeypatch, capsys):
    """A NaN in training.csv's step column raised pandas' IntCastingNaNError while judging (a
    user pass, 2026-11-27; since read as malformed): the whole session ended in a traceback, no
    record and no report. An unexpected error of the harness on a point is now that point's ERROR,
    with its traceback beside the run's files, and the next point runs."""
    from validation.session import runs

    real = runs.judge

    def judge(point, done, hw, extra=None):
        if point.phase.name == "first":
            raise ValueError("cannot convert float NaN to integer")
        return real(point, done, hw, extra)

    monkeypatch.setattr(runs, "judge", judge)
    rb = _runbook(tmp_path / "rb.yaml", [_phase("first"), _phase("second")])
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 1  # NO-GO
    err = capsys.readouterr().err
    assert "the harness failed on mine/cpu/first/default: ValueError: cannot convert float NaN to integer" in err
    first, second = sorted(ResultStore(res).records(), key=lambda r: r.phase)
    assert first.status == Status.ERROR and "a defect of the harness: ValueError" in first.reason, first.reason
    assert "ValueError: cannot convert float NaN to integer" in (res / first.out_dir / "harness_error.txt").read_text()
    assert second.status == Status.PASS
    assert (res / "reports" / "mine__cpu.md").is_file()


def test_a_point_the_harness_failed_on_records_how_long_it_ran(monkeypatch, fake_run):
    """A point whose judging raised after its trainer had run its 8 steps was recorded as run for
    0.0 s ('ERROR (0.0s)' in the progress line, wall_s 0.0 in the store), so the timing findings
    could not see it overlap another timed point. Its wall time is the point's own now."""
    from validation.session import runs
    from validation.tests.conftest import train_phase

    def broken(*args, **kwargs):
        raise RuntimeError("judge broke")

    monkeypatch.setattr(runs, "judge", broken)
    run = fake_run([train_phase(env={"NSA_FAKE_STEP_S": "0.1"})])  # 8 steps of 0.1 s
    assert run.record.status == Status.ERROR and "judge broke" in run.record.reason
    assert run.record.wall_s >= 0.8, run.record.wall_s
    [stored] = ResultStore(run.results).records()
    assert stored.wall_s == run.record.wall_s


def test_a_trainer_script_that_is_not_there_leaves_the_stored_record_and_its_run_directory(tmp_path, capsys):
    """A runbook's trainer.script misspelt (or its file gone) replaced the stored PASS with an
    ERROR record, deleted its run directory and exited 1 (NO-GO) instead of 2."""
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")])
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
    (stored,) = ResultStore(res).records()
    _runbook(rb, [_phase("single")], trainer={**NATIVE, "script": "native_trian.py"})
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "cannot launch here, nothing was run" in err and "trainer.script: 'native_trian.py'" in err, err
    assert f"{rb}: trainer.script: 'native_trian.py'" in err, err  # user13: the runbook's file, as for a bad key
    (kept,) = ResultStore(res).records()
    assert kept.run_id == stored.run_id and kept.status == Status.PASS and (res / kept.out_dir).is_dir()


@pytest.mark.parametrize("module, runs", [("native_trian", False), ("native_train", True),
                                          ("json", True), ("nosuchpackage.train", False)])
def test_a_trainer_module_that_is_not_there_cannot_launch(tmp_path, capsys, module, runs):
    """trainer.module misspelt is checked like trainer.script: exit 2, nothing run or stored; a
    module under the root or an installed package launches."""
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")],
                  trainer={**{k: v for k, v in NATIVE.items() if k != "script"}, "module": module})
    res = tmp_path / "res"
    code = main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"])
    err = capsys.readouterr().err
    if runs:
        assert "cannot launch here" not in err, err
    else:
        assert code == 2 and f"trainer.module: {module!r} is neither a module under the trainer's root" in err, err
        assert not (res / "results.json").exists() or not ResultStore(res).records()


@pytest.mark.parametrize("requires, runs", [(["no_such_package_xyz"], False), (["json", "native_train"], True)])
def test_a_package_the_trainer_requires_that_is_not_installed_stops_the_run(tmp_path, capsys, requires, runs):
    """trainer.requires names the packages a trainer imports that a machine may lack: one neither
    under the root nor installed stops `nsa-validate run` before anything runs (exit 2), naming it;
    an installed package or a module under the root launches."""
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")], trainer={**NATIVE, "requires": requires})
    res = tmp_path / "res"
    code = main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"])
    err = capsys.readouterr().err
    if runs:
        assert code == 0 and "cannot launch here" not in err, err
    else:
        assert code == 2 and "cannot launch here, nothing was run" in err, err
        assert "trainer native_test requires 'no_such_package_xyz' (trainer.requires)" in err, err
        assert not ResultStore(res).records()


def test_a_runbook_whose_trainer_requires_a_package_not_installed_stops_pytest_before_it_runs(tmp_path):
    """`pytest -m h100` on an H100 without fla ran hf_trainer_fla_nsa's point to a crash ("rank 0
    crashed: ModuleNotFoundError: No module named 'fla'") and a NO-GO report: a verdict on the
    machine's packages, not on a trainer. A runbook whose trainer requires a package not installed
    is not launched: named with --runbook it stops the run before anything runs, naming the
    package (selected by default, its points skip: the plugin's rule for any point that cannot
    launch)."""
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")], trainer={**NATIVE, "requires": ["no_such_package_xyz"]})
    out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "-m", "cpu_profile", "--runbook", str(rb),
                  f"--results-dir={tmp_path / 'res'}")
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout[-3000:] + out.stderr[-3000:]
    assert "requires 'no_such_package_xyz' (trainer.requires)" in out.stderr, out.stderr[-3000:]
    assert not ResultStore(tmp_path / "res").records()


def test_a_trainer_modules_config_template_that_is_not_there_cannot_launch(tmp_path, capsys):
    """A module that is there does not excuse a config template that is not."""
    trainer = {**{k: v for k, v in NATIVE.items() if k != "script"}, "module": "native_train",
               "config": {"template": "no_such.yaml", "pass_as": {"flag": "--config"}}}
    rb = _runbook(tmp_path / "rb.yaml", [_phase("single")], trainer=trainer)
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "res"), "--no-plots"]) == 2
    assert "trainer.config.template: 'no_such.yaml'" in capsys.readouterr().err


def test_a_runbook_whose_trainer_cannot_launch_leaves_no_records_to_spoil_a_later_report(tmp_path):
    """`pytest -m cpu_profile` also selected seed_trainer_cpu (its root unset): its SKIP records made
    a later `nsa-validate report` INCOMPLETE (exit 3) after a GO run. Such a runbook named with
    --runbook stops the run before anything runs (exit 4): nothing is stored either."""
    runs = _runbook(tmp_path / "runs.yaml", [_phase("single")], name="runs")
    blocked = _runbook(tmp_path / "blocked.yaml", [_phase("single")], trainer={**NATIVE, "root": {"env": "UNSET_ROOT"}},
                       name="blocked")
    res = tmp_path / "res"
    env = {k: v for k, v in os.environ.items() if k != "UNSET_ROOT"}
    out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "-m", "cpu_profile", "--runbook", str(runs),
                  f"--results-dir={res}", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    out = _pytest(REPO_ROOT, "validation/tests/test_acceptance.py", "-m", "cpu_profile", "--runbook", str(runs),
                  "--runbook", str(blocked), f"--results-dir={res}", env=env)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR and "blocked/cpu/single/default: " in out.stderr, out.stderr
    assert {r.key.runbook for r in ResultStore(res).records()} == {"runs"}
    assert main(["report", "--results-dir", str(res), "--no-plots"]) == 0


def test_report_of_an_empty_or_missing_results_directory_is_the_same_usage_error(tmp_path, capsys):
    """An empty results directory exited 3 (INCOMPLETE), a missing one 2."""
    (tmp_path / "empty").mkdir()
    assert main(["report", "--results-dir", str(tmp_path / "empty")]) == 2
    assert "no results in" in capsys.readouterr().err
    assert main(["report", "--results-dir", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_sessions_abort_flag_is_its_own_and_reaches_the_points_it_runs_in_worker_threads(tmp_path):
    """The abort flag was a module global of the launch code: the session owns it now and hands it
    to every point it runs, in whatever thread; once set, a point of that session starts nothing
    (KeyboardInterrupt), while another session's points run."""
    from concurrent.futures import ThreadPoolExecutor

    from validation.session.session import AcceptanceSession, SessionOptions

    rb = _runbook(tmp_path / "my.yaml", [_phase("one")])
    stopped = AcceptanceSession(SessionOptions(tmp_path / "a", runbooks=(str(rb),), profiles=("cpu",)))
    other = AcceptanceSession(SessionOptions(tmp_path / "b", runbooks=(str(rb),), profiles=("cpu",)))
    stopped.abort.set()
    assert stopped.stopping() and not other.stopping()
    with ThreadPoolExecutor(max_workers=1) as pool:
        with pytest.raises(KeyboardInterrupt):
            pool.submit(stopped.run_point, stopped.points()[0]).result()
        assert pool.submit(other.run_point, other.points()[0]).result().status == Status.PASS
    assert not (tmp_path / "a" / "results.json").exists()
