"""The harness's own files (the result store, golden curves, a report) are written through the one
atomic write the trainer uses too (nsa/atomic.py; tests/unit/test_train_loop.py checks its fsyncs):
renamed into place whole and the directory fsynced, so that a power cut leaves the old file or the
new one, for everyone to read."""
from __future__ import annotations

import os
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
    seen: list[tuple[str, str]] = []
    rename = os.replace
    monkeypatch.setattr(atomic, "_fsync_dir", lambda folder: seen.append(("synced", Path(folder).name)))
    monkeypatch.setattr(atomic.os, "replace", lambda src, dst: (seen.append(("renamed", Path(dst).name)),
                                                                rename(src, dst))[-1])
    path = write(tmp_path / "out")
    assert ("renamed", path.name) in seen, seen
    assert seen[seen.index(("renamed", path.name)) + 1] == ("synced", path.parent.name), seen
    assert path.stat().st_mode & 0o777 == 0o644
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
