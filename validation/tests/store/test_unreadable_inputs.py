"""What store, report and bless read and the system will not let them (a folder on the way that
cannot be searched, a file that cannot be read): one line naming the path and the system's reason,
exit 2, never a traceback; or, for a run's evidence a report only draws, the report without it.
The system's refusal is staged (``denied``): the tests may run as root, whom permission bits do
not stop."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from validation.cli import main
from validation.session.session import ExitStatus
from validation.tests.conftest import error_line, train_phase, write_runbook

DENIED = os.strerror(errno.EACCES)


def denied(monkeypatch, inside: Path) -> None:
    """Every path under ``inside`` as the system gives it where ``inside`` cannot be searched (mode
    000): stat (exists, is_file, is_dir) and reading it fail with EACCES."""
    stat, read_bytes = Path.stat, Path.read_bytes

    def refuse(path: Path) -> None:
        if inside in Path(path).parents:
            raise PermissionError(errno.EACCES, DENIED, str(path))

    def stat_of(self, *, follow_symlinks=True):
        refuse(self)
        return stat(self, follow_symlinks=follow_symlinks)

    def read_bytes_of(self):
        refuse(self)
        return read_bytes(self)

    monkeypatch.setattr(Path, "stat", stat_of)
    monkeypatch.setattr(Path, "read_bytes", read_bytes_of)


@pytest.fixture
def blessed(tmp_path, capsys) -> tuple[Path, Path]:
    """A golden point run, blessed, and run again against its golden (GO, its report written):
    (runbook, results)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])])
    results = tmp_path / "results"
    main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-report"])
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(results)]) == 0
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results)]) == ExitStatus.GO
    capsys.readouterr()
    return rb, results


@pytest.mark.parametrize("command", ["run", "report", "bless"])
def test_a_results_directory_that_cannot_be_searched_is_named(blessed, command, monkeypatch, capsys):
    rb, results = blessed
    denied(monkeypatch, results)
    args = {"run": ["run", "--runbook", str(rb), "--no-plots"], "report": ["report", "--no-plots"],
            "bless": ["bless", "--runbook", str(rb)]}[command]
    status = main([*args, "--results-dir", str(results)])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line.startswith(f"nsa-validate: error: cannot read {results}/") and line.endswith(f": {DENIED}"), line


def test_a_baseline_that_cannot_be_searched_is_named(blessed, tmp_path, monkeypatch, capsys):
    _, results = blessed
    base = tmp_path / "base"
    base.mkdir()
    denied(monkeypatch, base)
    status = main(["report", "--results-dir", str(results), "--no-plots", "--baseline", str(base)])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line == f"nsa-validate: error: cannot read {base / 'results.json'}: {DENIED}", line


def test_a_goldens_folder_that_cannot_be_searched_is_named_as_read_not_as_the_report_written(
        blessed, tmp_path, monkeypatch, capsys):
    """It read "cannot write the report <report>: Permission denied (<golden file>)"."""
    _, results = blessed
    golden = tmp_path / "goldens" / "fake__cpu.yaml"
    denied(monkeypatch, golden.parent)
    status = main(["report", "--results-dir", str(results), "--no-plots"])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line == f"nsa-validate: error: cannot read the golden file {golden}: {DENIED}", line


def test_a_training_csv_that_cannot_be_read_is_named_by_bless_and_left_out_of_the_report(blessed, monkeypatch, capsys):
    """bless ended in a traceback; the report in "cannot write the report ... (training.csv)"."""
    rb, results = blessed
    [csv] = results.glob("runs/fake/cpu/long_run/default/*/training.csv")
    golden = (rb.parent / "goldens" / "fake__cpu.yaml").read_bytes()
    denied(monkeypatch, csv.parent)
    status = main(["bless", "--runbook", str(rb), "--results-dir", str(results)])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line == f"nsa-validate: error: {csv}: cannot be read ({DENIED})", line
    assert (rb.parent / "goldens" / "fake__cpu.yaml").read_bytes() == golden
    assert main(["report", "--results-dir", str(results)]) == ExitStatus.GO  # the verdict stored at the run
    err = capsys.readouterr().err
    assert "error" not in err, err
    report = (results / "reports" / "fake__cpu.md").read_text()
    assert f"{csv}: cannot be read ({DENIED}); the gate as stored at the run is shown" in report
