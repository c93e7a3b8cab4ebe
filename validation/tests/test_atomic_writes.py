"""The harness's own files (the result store, golden curves, a report) are written through the one
atomic write the trainer uses too (nsa/atomic.py): the file fsynced, renamed into place, and its
directory fsynced, so that a power cut leaves the old file or the new one, for everyone to read."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nsa import atomic
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.report.build import render
from validation.store.goldens import GoldenFile
from validation.store.results import ResultStore


def _store(folder: Path) -> Path:
    ResultStore(folder).put(PhaseRecord(PointKey("rb", "cpu", "p", {}), "rb/cpu/p/default", "train", Status.PASS, ""))
    return folder / "results.json"


def _goldens(folder: Path) -> Path:
    golden = GoldenFile(folder / "rb__cpu.yaml", "rb", "cpu")
    golden.save()
    return golden.path


def _report(folder: Path) -> Path:
    _store(folder)
    return render(folder, "rb", "cpu", plots=False).path


@pytest.mark.parametrize("write", [_store, _goldens, _report], ids=["store", "goldens", "report"])
def test_the_harness_writes_its_files_durably_and_for_everyone(tmp_path, monkeypatch, write):
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        return real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    path = write(tmp_path / "out")
    at = calls.index(("replace", path.name))
    assert calls[at - 1:at + 2] == [("fsync", "file"), ("replace", path.name), ("fsync", "dir")], calls
    assert path.stat().st_mode & 0o777 == 0o644
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
