"""A results directory whose runs/ folder cannot be written: one line naming the folder and the
bad-input exit status (the CLI), a usage error (the pytest door), before any point runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.session.session import ExitStatus
from validation.tests.conftest import train_phase, write_runbook


@pytest.fixture
def read_only_runs(tmp_path):
    """results/runs that this process cannot write in: mode 555, or immutable where the tests run
    as root (root writes through the mode bits)."""
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    if os.geteuid() == 0:
        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(runs)], capture_output=True).returncode:
            pytest.skip("running as root without chattr +i on this file system: no folder is read-only to root")
        yield runs
        subprocess.run(["chattr", "-i", str(runs)], check=True)
        return
    runs.chmod(0o555)
    yield runs
    runs.chmod(0o755)


def test_cli_says_the_runs_folder_in_one_line_and_exits_with_the_bad_input_status(tmp_path, read_only_runs, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    status = main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(read_only_runs.parent),
                   "--no-plots"])
    err = capsys.readouterr().err
    assert status == ExitStatus.USAGE, err
    assert "Traceback" not in err, err
    [line] = [ln for ln in err.splitlines() if "error" in ln]
    assert line.startswith(f"nsa-validate: error: results directory {read_only_runs.parent}: cannot write in "
                           f"{read_only_runs} ("), line
    assert not list(read_only_runs.iterdir())  # nothing ran


def test_pytest_door_makes_it_a_usage_error(tmp_path, read_only_runs):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", "--runbook", str(rb),
                          f"--results-dir={read_only_runs.parent}", "-k", "test_phase"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"cannot write in {read_only_runs} (" in out.stderr, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
