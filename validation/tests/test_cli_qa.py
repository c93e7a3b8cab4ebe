"""The CLI as a user types it: defects found by using it (a baseline of another runbook or the
results directory itself, --profile without --runbook, a closed pipe, bless commands for a runbook
given by path). Stores are built from SKIP records, so nothing here launches a trainer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from validation import REPO_ROOT
from validation.cli import main
from validation.hardware import Machine
from validation.plan import expand
from validation.record import PhaseRecord, Status
from validation.runbook import load_profile, load_runbook
from validation.store import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _store(results: Path, runbook: Path) -> None:
    """A store holding a SKIP record of every point of ``runbook`` on the cpu profile."""
    rb, prof = load_runbook(runbook), load_profile("cpu")
    ResultStore(results).put_many([PhaseRecord.for_point(p, Status.SKIP, "staged", hardware=Machine())
                                   for p in expand(rb, prof)])


def test_a_baseline_of_another_runbook_is_an_error_naming_what_it_holds(tmp_path, capsys):
    """It once rendered 'No point is stored on both sides', commit 'not recorded', date 'no runs':
    a comparison that compared nothing, and a regression gate that could not fire."""
    cur, base = tmp_path / "cur", tmp_path / "base"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    _store(base, write_runbook(tmp_path / "b.yaml", [train_phase()], name="other"))
    assert main(["report", "--results-dir", str(cur), "--baseline", str(base), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"--baseline {base}: no records of runbook fake, profile cpu (it holds: other/cpu)" in err
    assert not (cur / "reports").exists()


def test_the_results_dir_itself_as_baseline_is_an_error(tmp_path, capsys):
    """Every point compared with itself: +0.0% everywhere, a regression gate that always passes."""
    cur = tmp_path / "cur"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    assert main(["report", f"--results-dir={cur}", f"--baseline={cur}/.", "--no-plots"]) == 2
    assert "is the results directory itself" in capsys.readouterr().err
