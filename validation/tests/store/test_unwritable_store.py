"""A results directory the harness cannot write: one line naming the file and what failed, and
the bad-input exit status (the CLI), a usage error or a failed test without a traceback (the
pytest door). Before any point runs (a read-only runs/ folder), or once a point has run and its
record, or a report, cannot be written (a full disk, a folder made read-only meanwhile): the store
is left as it was and the point that ran is named as not stored."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.errors import StoreError
from validation.pytest_plugin import AcceptancePlugin
from validation.session import point as point_module
from validation.session.session import ExitStatus
from validation.tests.conftest import error_line, read_only, train_phase, write_runbook


@pytest.fixture
def read_only_runs(tmp_path):
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    with read_only(runs):
        yield runs


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


@pytest.fixture
def stored_once(tmp_path, capsys):
    """A runbook of one point, run once into results/ (GO, its report written): (runbook, results)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == ExitStatus.GO
    capsys.readouterr()
    return rb, results


def _full_disk(path, *args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_full_disk_as_a_record_is_stored_names_the_file_and_the_point_not_stored(stored_once, monkeypatch, capsys):
    """user hC's pass: `OSError: [Errno 28] No space left on device: '.../results.json'`, a traceback
    and exit 1, the NO-GO status, for a point that had passed."""
    rb, results = stored_once
    store = results / "results.json"
    before = store.read_bytes()
    monkeypatch.setattr("validation.store.results.write_atomic", _full_disk)
    status = main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line.startswith(f"nsa-validate: error: cannot write {store}: No space left on device; "
                           "fake/cpu/baseline_ddp/default ran to its end (PASS) but its record was not stored "
                           "(the store holds what it held before); its run is in "), line
    assert store.read_bytes() == before


def test_a_temp_file_that_cannot_be_made_names_the_store_and_the_temp_file(stored_once, monkeypatch, capsys):
    rb, results = stored_once
    temp = results / ".results.json.1.2.tmp"

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(temp))

    monkeypatch.setattr("validation.store.results.write_atomic", denied)
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == ExitStatus.USAGE
    line = error_line(capsys.readouterr().err)
    assert f"cannot write {results / 'results.json'}: Operation not permitted ({temp}); " in line, line


def test_a_reports_folder_made_read_only_while_a_point_runs(stored_once, monkeypatch, capsys):
    """The store's check before the point saw reports/ writable; it was not by the time the point's
    old report was to be removed (a traceback from withdraw())."""
    rb, results = stored_once
    before = (results / "results.json").read_bytes()
    execute = point_module.execute
    with contextlib.ExitStack() as stack:
        monkeypatch.setattr(point_module, "execute", lambda *a, **kw: (
            execute(*a, **kw), stack.enter_context(read_only(results / "reports")))[0])
        status = main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"])
        line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line.startswith(f"nsa-validate: error: cannot remove the report {results / 'reports' / 'fake__cpu.md'}: "
                           ), line
    assert "fake/cpu/baseline_ddp/default ran to its end (PASS) but its record was not stored" in line
    assert (results / "results.json").read_bytes() == before
    assert (results / "reports" / "fake__cpu.md").is_file()


def test_a_report_that_cannot_be_written_is_named_and_the_previous_one_stays(stored_once, monkeypatch, capsys):
    _, results = stored_once
    report = results / "reports" / "fake__cpu.md"
    before = report.read_text()
    monkeypatch.setattr("validation.report.build.write_atomic", _full_disk)
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == ExitStatus.USAGE
    line = error_line(capsys.readouterr().err)
    assert line == f"nsa-validate: error: cannot write the report {report}: No space left on device", line
    assert report.read_text() == before


def test_a_results_json_that_is_a_directory_is_named(tmp_path, capsys):
    results = tmp_path / "results"
    (results / "results.json").mkdir(parents=True)
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == ExitStatus.USAGE
    line = error_line(capsys.readouterr().err)
    assert line == f"nsa-validate: error: cannot read {results / 'results.json'}: Is a directory", line


def test_the_pytest_door_fails_the_point_with_the_message_and_no_traceback():
    class Session:
        def run_point(self, point, progress):
            raise StoreError("cannot write /r/results.json: No space left on device; p ran to its end (PASS) but its "
                             "record was not stored")

    plugin = AcceptancePlugin.__new__(AcceptancePlugin)
    plugin.session, plugin.progress = Session(), None
    with pytest.raises(pytest.fail.Exception) as failed:
        plugin.run(object())
    assert not failed.value.pytrace
    assert str(failed.value.msg).startswith("nsa-validate: cannot write /r/results.json: No space left on device")


@pytest.mark.parametrize("folder", ["reports", "reports/plots"])
def test_a_report_into_a_read_only_reports_folder_names_it_and_the_report_stays(stored_once, folder, capsys):
    _, results = stored_once
    assert main(["report", "--results-dir", str(results)]) == ExitStatus.GO  # with its plots
    report = results / "reports" / "fake__cpu.md"
    before = report.read_text()
    capsys.readouterr()
    with read_only(results / folder):
        status = main(["report", "--results-dir", str(results)])
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert f"{results / folder}" in line and ("Operation not permitted" in line or "Permission denied" in line), line
    assert report.read_text() == before


def test_a_store_lock_file_that_cannot_be_written_still_locks_and_the_report_renders(stored_once, capsys):
    """A report holds the results directory's lock while it reads the store and writes the report;
    a lock file this process may not write (another user's, made under their umask) is opened to
    read, and still excludes every other holder."""
    import fcntl

    from validation.store.results import LOCK_NAME, ResultStore

    _, results = stored_once
    lock = results / LOCK_NAME
    with read_only(lock):
        assert main(["report", "--results-dir", str(results), "--no-plots"]) == ExitStatus.GO, \
            capsys.readouterr().err
        with ResultStore(results).locked(), open(lock, "rb") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
