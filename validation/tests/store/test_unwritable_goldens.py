"""A goldens folder `nsa-validate bless` cannot write (read-only, a full disk, not there and not
makeable): one line naming the golden file, and the folder or temp file where the system names
one, with the system's reason; exit 2 (nothing blessed); the golden file as it was, no temp file
left. It ended in a traceback and exit 1."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from validation.cli import main
from validation.session.session import ExitStatus
from validation.tests.conftest import error_line, read_only, train_phase, write_runbook


@pytest.fixture
def blessed(tmp_path, capsys) -> tuple[list[str], Path]:
    """A golden point run and blessed once: (the bless command's arguments, its golden file)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])])
    results = tmp_path / "results"
    main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-report"])
    args = ["bless", "--runbook", str(rb), "--results-dir", str(results)]
    assert main(args) == 0
    capsys.readouterr()
    return args, tmp_path / "goldens" / "fake__cpu.yaml"


def test_a_read_only_goldens_folder_is_named_and_the_golden_stays(blessed, capsys):
    args, golden = blessed
    before, listing = golden.read_bytes(), sorted(golden.parent.iterdir())
    with read_only(golden.parent):
        status = main(args)
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line.startswith(f"nsa-validate: error: cannot write the golden file {golden}: "), line
    assert f" ({golden.parent}/.{golden.name}." in line and line.endswith(".tmp)"), line  # the temp file in it
    assert golden.read_bytes() == before and sorted(golden.parent.iterdir()) == listing


def test_a_full_disk_is_named_and_the_golden_stays_whole(blessed, capsys, monkeypatch):
    args, golden = blessed
    before, listing = golden.read_bytes(), sorted(golden.parent.iterdir())

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # where a full disk shows itself (delayed allocation)
    status = main(args)
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line == f"nsa-validate: error: cannot write the golden file {golden}: No space left on device", line
    assert golden.read_bytes() == before and sorted(golden.parent.iterdir()) == listing


def test_a_goldens_folder_that_cannot_be_made_is_named(blessed, capsys):
    args, golden = blessed
    folder = golden.parent
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    with read_only(folder.parent):
        status = main(args)
    line = error_line(capsys.readouterr().err)
    assert status == ExitStatus.USAGE, line
    assert line.startswith(f"nsa-validate: error: cannot write the golden file {golden}: "), line
    assert line.endswith(f" ({folder})"), line
    assert not folder.exists()


def test_a_lock_file_that_cannot_be_written_still_locks_and_the_bless_goes_on(blessed, capsys):
    """The golden's lock file of another user (made under their umask), or immutable: bless ended
    in a traceback opening it to write. It is opened to read, which flock locks as well."""
    args, golden = blessed
    before = golden.stat().st_ino
    with read_only(golden.with_name(f".{golden.name}.lock")):
        assert main(args) == 0, capsys.readouterr().err
    assert "blessed long_run/default on cpu" in capsys.readouterr().out
    assert golden.stat().st_ino != before  # written again (a new file renamed over it)
