"""The result store: one JSON file (results.json) in the results directory holding one record
per (runbook, profile, phase, parameters).

Writes are read-modify-write under an exclusive ``fcntl`` lock on ``results.json.lock`` (so two
harness runs, or pytest-xdist workers, on the same directory cannot lose each other's records),
and the new file replaces the old one atomically (temp file in the same directory, fsync,
``os.replace``), so a reader never sees half a file. ``put`` replaces only the record with the
same key; every other record is kept as it was.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import StoreError

STORE_NAME = "results.json"
SCHEMA = 1


def record_key(key: dict[str, Any]) -> str:
    """Canonical string of a record's key: runbook/profile/phase/params (params sorted)."""
    return json.dumps([key["runbook"], key["profile"], key["phase"], key.get("params", {})], sort_keys=True)


class ResultStore:
    def __init__(self, results_dir: str | Path):
        self.dir = Path(results_dir)
        self.path = self.dir / STORE_NAME

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / (STORE_NAME + ".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"schema": SCHEMA, "records": {}}
        try:
            data = json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self.path}: not valid JSON ({exc}); move it aside to start a new store") from None
        if not isinstance(data, dict) or not isinstance(data.get("records"), dict):
            raise StoreError(f"{self.path}: key 'records' missing or not an object")
        if data.get("schema") != SCHEMA:
            raise StoreError(f"{self.path}: schema {data.get('schema')!r}, this harness reads schema {SCHEMA}")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".results.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=1, sort_keys=True, default=str)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put(self, record: dict[str, Any]) -> None:
        """Insert or replace the one record with this record's key."""
        with self._locked():
            data = self._read()
            data["records"][record_key(record["key"])] = record
            self._write(data)

    def put_many(self, records: list[dict[str, Any]]) -> None:
        with self._locked():
            data = self._read()
            for r in records:
                data["records"][record_key(r["key"])] = r
            self._write(data)

    def records(self, runbook: str | None = None, profile: str | None = None) -> list[dict[str, Any]]:
        with self._locked():
            recs = list(self._read()["records"].values())
        return [r for r in recs
                if (runbook is None or r["key"]["runbook"] == runbook)
                and (profile is None or r["key"]["profile"] == profile)]

    def pairs(self) -> list[tuple[str, str]]:
        """(runbook, profile) pairs that have records, sorted."""
        return sorted({(r["key"]["runbook"], r["key"]["profile"]) for r in self.records()})
