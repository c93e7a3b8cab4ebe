"""A hardware profile given as a YAML path is the one that decides the gates, through both doors,
even where it shares its name with a profile under runbooks/profiles/; its marker works in -m."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from validation import REPO_ROOT
from validation.runbook.load import PROFILE_DIR, load_profile
from validation.session.session import AcceptanceSession, SessionOptions
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook

UNREACHABLE = 1.0e12  # tokens/s no trainer reaches: a gate against it can only fail


def _copy_of_cpu(path: Path, **changes) -> Path:
    """runbooks/profiles/cpu.yaml with its tokens/s floor raised to UNREACHABLE, written with
    ``1.0e12`` as a person types it (YAML 1.1 would read that as a string)."""
    data = yaml.safe_load((PROFILE_DIR / "cpu.yaml").read_text())
    data.update(changes)
    data["thresholds"]["min_toks_per_s"] = "FLOOR"
    path.write_text(yaml.safe_dump(data, sort_keys=False).replace("FLOOR", "1.0e12"))
    return path


def test_a_profile_path_of_a_project_profiles_name_decides_the_thresholds(tmp_path):
    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    session = AcceptanceSession(SessionOptions(tmp_path / "r", runbooks=(str(rb),), profiles=(str(mine),)))
    [(_, prof)] = session.pairs()
    assert prof.path == mine and prof.thresholds["min_toks_per_s"] == UNREACHABLE
    assert load_profile("cpu").thresholds["min_toks_per_s"] < UNREACHABLE  # the project's own stays as it is


def test_two_files_of_one_profile_name_are_refused(tmp_path):
    a, b = _copy_of_cpu(tmp_path / "a.yaml"), _copy_of_cpu(tmp_path / "b.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    session = AcceptanceSession(SessionOptions(tmp_path / "r", runbooks=(str(rb),), profiles=(str(a), str(b))))
    try:
        session.pairs()
    except Exception as exc:  # noqa: BLE001 - the message is what a user reads
        assert "two files of one profile name" in str(exc)
    else:
        raise AssertionError("two profiles named cpu were both accepted")


def test_the_cli_fails_a_gate_the_users_profile_path_sets(tmp_path):
    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    out = subprocess.run([sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--profile", str(mine),
                          "--results-dir", str(tmp_path / "r"), "--no-plots"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr  # NO-GO
    [record] = ResultStore(tmp_path / "r").records()
    [floor] = [g for g in record.gates if g.metric == "toks_per_s_mean"]
    assert (floor.threshold, floor.threshold_ref, floor.verdict.name) == (UNREACHABLE, "min_toks_per_s", "FAIL")
    assert record.status.name == "FAIL"


def test_pytest_knows_the_marker_of_a_profile_outside_the_checkout(tmp_path):
    mine = _copy_of_cpu(tmp_path / "mine.yaml", name="mine", marker="mine_profile")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")], profiles=["mine"])
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(REPO_ROOT),
                          "-m", "mine_profile", "--runbook", str(rb), "--profile", str(mine),
                          "--results-dir", str(tmp_path / "r")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert "not found in `markers`" not in out.stdout + out.stderr
    assert out.returncode == 1, out.stdout + out.stderr  # the point ran, and the user's floor failed it
    assert "1 failed" in out.stdout
    [record] = ResultStore(tmp_path / "r").records()
    assert record.key.profile == "mine" and record.status.name == "FAIL"


def test_report_judges_by_the_profile_path_given_without_a_runbook(tmp_path, capsys):
    """`nsa-validate report --results-dir R --profile PATH` (no --runbook) rendered GO against the
    stored records' own profile, the file given ignored: its floor of 1e9 tokens/s never read."""
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    res = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    assert main(["report", "--results-dir", str(res), "--profile", str(mine), "--no-plots"]) == 1  # NO-GO
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert f"- **Profile**: cpu ({mine})" in text
    assert f"1 point(s) ran with another profile file than this report judges by ({mine})" in text
    assert "   - ran with cpu: baseline_ddp [default]" in text
    assert main(["report", "--results-dir", str(res), "--no-plots"]) == 0  # by the file the records ran with
    assert "another profile file" not in (res / "reports" / "fake__cpu.md").read_text()


def test_a_phase_re_run_without_the_profile_path_is_judged_by_the_file_the_store_ran_with(tmp_path, capsys):
    """A phase run with a strict profile file, another re-run without --profile: the re-run takes
    the store's profile file and the report stays NO-GO (judging both by the built-in profile of
    that name read GO, the strict floor gone with a warning). `--profile cpu` asks for the built-in."""
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("strict"), train_phase("plain")])
    res = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--profile", str(mine), "--phase", "strict", "--results-dir", str(res),
                 "--no-plots"]) == 1
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--phase", "plain", "--results-dir", str(res), "--no-plots"]) == 1
    assert (f"note: fake/cpu is judged by {mine}, the profile file its stored points ran with (--profile cpu: by "
            "the built-in profile)") in capsys.readouterr().err
    by_phase = {r.phase: r for r in ResultStore(res).records()}
    assert by_phase["plain"].profile_arg == str(mine) and by_phase["plain"].status.name == "FAIL"
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert f"- **Profile**: cpu ({mine})" in text and "another profile file" not in text
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--phase", "plain", "--results-dir", str(res),
                 "--no-plots"]) == 0
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert "1 point(s) ran with another profile file than this report judges by (cpu)" in text
    assert f"   - ran with {mine}: strict [default]" in text


def test_a_store_whose_profile_file_is_gone_asks_for_one(tmp_path, capsys):
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("strict"), train_phase("plain")])
    res = tmp_path / "r"
    main(["run", "--runbook", str(rb), "--profile", str(mine), "--phase", "strict", "--results-dir", str(res),
          "--no-report"])
    mine.unlink()
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--phase", "plain", "--results-dir", str(res), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"fake/cpu: the stored points in {res} ran with the profile file {mine}, which cannot be loaded now" in err
    assert "give --profile: that file again, or cpu for the built-in profile" in err
    assert [r.phase for r in ResultStore(res).records()] == ["strict"]


def test_a_profile_file_of_no_built_in_name_judges_a_re_run_and_a_report_without_profile(tmp_path, capsys):
    """A runbook of `profiles: [mine]`, mine only a file given with --profile at the first run: a
    re-run of one phase without --profile, and `report --runbook` without it, exited 2 ("no profile
    'mine' under runbooks/profiles"): the built-in profile was looked up before the store's file."""
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "mine.yaml", name="mine", marker="mine_profile")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("strict"), train_phase("plain")], profiles=["mine"])
    res = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--profile", str(mine), "--phase", "strict", "--results-dir", str(res),
                 "--no-report"]) == 0
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--phase", "plain", "--results-dir", str(res), "--no-plots"]) == 1
    assert f"note: fake/mine is judged by {mine}, the profile file its stored points ran with\n" in capsys.readouterr().err
    by_phase = {r.phase: r for r in ResultStore(res).records()}
    assert by_phase["plain"].profile_arg == str(mine) and by_phase["plain"].status.name == "FAIL"
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 1  # NO-GO, by mine
    assert f"- **Profile**: mine ({mine})" in (res / "reports" / "fake__mine.md").read_text()
    mine.unlink()
    capsys.readouterr()
    assert main(["run", "--runbook", str(rb), "--phase", "plain", "--results-dir", str(res), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"fake/mine: the stored points in {res} ran with the profile file {mine}, which cannot be loaded now" in err
    assert "give --profile: that file again or another file of profile mine" in err and "built-in" not in err, err


def test_pytest_re_runs_a_phase_without_the_profile_file_the_store_ran_with(tmp_path):
    """The pytest door's re-run of one phase without --profile, into a store whose points ran with
    a profile file of no built-in name, failed at collection (exit 2: "'mine_profile' not found in
    `markers`"): the points carry the marker of the store's file, which no runbook or --profile named."""
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "mine.yaml", name="mine", marker="mine_profile")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("strict"), train_phase("plain")], profiles=["mine"])
    res = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--profile", str(mine), "--phase", "strict", "--results-dir", str(res),
                 "--no-report"]) == 0
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(REPO_ROOT),
                          "-m", "plain", "--runbook", str(rb), "--results-dir", str(res)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert "not found in `markers`" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert out.returncode == 1 and "1 failed" in out.stdout, out.stdout + out.stderr  # mine's floor failed it
    by_phase = {r.phase: r for r in ResultStore(res).records()}
    assert by_phase["plain"].profile_arg == str(mine) and by_phase["plain"].status.name == "FAIL"


def test_report_without_profile_says_which_profile_file_judges_as_run_does(tmp_path, capsys):
    """`nsa-validate report` without --profile, of a store whose points ran with a profile file,
    judged by that file (NO-GO by its floor) and said nothing of it, where `run` notes it: the
    report's verdict came from thresholds the command line never named."""
    from validation.cli import main

    mine = _copy_of_cpu(tmp_path / "cpu.yaml")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("strict")])
    res = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--profile", str(mine), "--results-dir", str(res), "--no-report"]) == 0
    note = (f"nsa-validate: note: fake/cpu is judged by {mine}, the profile file its stored points ran with "
            "(--profile cpu: by the built-in profile)\n")
    for runbook in ([], ["--runbook", str(rb)]):
        capsys.readouterr()
        assert main(["report", *runbook, "--results-dir", str(res), "--no-plots"]) == 1  # NO-GO, by mine's floor
        err = capsys.readouterr().err
        assert err.count(note) == 1, (runbook, err)
    # given on the command line, or the built-in profile's own records: no note
    capsys.readouterr()
    assert main(["report", "--results-dir", str(res), "--profile", str(mine), "--no-plots"]) == 1
    assert "is judged by" not in capsys.readouterr().err
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(res), "--no-report"]) == 0
    capsys.readouterr()
    assert main(["report", "--results-dir", str(res), "--no-plots"]) == 0
    assert "is judged by" not in capsys.readouterr().err
