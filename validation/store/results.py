"""The result store: one JSON file (results.json) in the results directory holding one record
per (runbook, profile, phase, parameters). Records are validation.judge.record.PhaseRecord; JSON lives
only here. The file says its schema: 2 is written, 1 (the same fields, some missing) is still
read, anything else (or a file that is no store at all) is an error naming the file.

The results directory has one lock, an exclusive ``fcntl`` lock on ``results.json.lock``
(``locked``). Every write of the store is a read-modify-write under it (so two harness runs, or
pytest-xdist workers, on the same directory cannot lose each other's records), and so is every
render of a report, from its first read of the store to the report's write
(validation/report/build.py). A write removes the reports of the (runbook, profile) pairs it
writes before it replaces the file: a report on disk is therefore always of the store as it is
now, whatever runs beside it and wherever a process is killed (no report rather than one the
store contradicts). The new file replaces the old one atomically (nsa/atomic.py), so a reader
never sees half a file and needs no lock: reading writes nothing (a baseline may be someone
else's read-only directory). ``put`` replaces only the record with the same key; every other
record is kept as it was. A file the system cannot read or write (a full disk, a read-only
folder, a directory named results.json, a folder on its way that cannot be searched) is a
StoreError naming it, the file left as it was.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any, Iterator

from nsa.atomic import write_atomic
from validation.errors import CorruptStore, StoreError
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.store.lock import exclusive

STORE_NAME = "results.json"
LOCK_NAME = STORE_NAME + ".lock"
SCHEMA = 2
READABLE_SCHEMAS = (1, 2)


def report_path(results_dir: str | Path, runbook_name: str, profile_name: str) -> Path:
    """<results>/reports/<runbook>__<profile>.md: the report rendered from the pair's records."""
    return Path(results_dir) / "reports" / f"{runbook_name}__{profile_name}.md"


def remove_report(report: Path) -> None:
    """Remove a report (none there is fine); one that cannot be removed is a StoreError naming it."""
    try:
        report.unlink(missing_ok=True)
    except OSError as exc:
        raise StoreError.of_os("cannot remove the report", report, exc) from None


def _exists(path: Path) -> bool:
    """Whether ``path`` exists. A folder on its way that cannot be searched is a StoreError naming
    it: Path.exists raises there (a traceback), where it says False of a file that is not there."""
    try:
        return path.exists()
    except OSError as exc:
        raise StoreError.of_os("cannot read", path, exc) from None


def record_key(key: PointKey) -> str:
    """Canonical string of a record's key: runbook/profile/phase/params (params sorted)."""
    return json.dumps([key.runbook, key.profile, key.phase, key.params], sort_keys=True)


class ResultStore:
    def __init__(self, results_dir: str | Path):
        self.dir = Path(results_dir)
        self.path = self.dir / STORE_NAME

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the results directory's lock: every write of the store holds it, and every render
        of a report from the store from its first read to the report's write; whoever comes
        second waits. Not re-entrant: a holder that takes it again waits for itself."""
        lock = self.dir / LOCK_NAME
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(exclusive(lock))
            except OSError as exc:
                raise StoreError.of_os("cannot lock the result store with", lock, exc) from None
            yield

    def exists(self) -> bool:
        """Whether results.json is there."""
        return _exists(self.path)

    def _read(self) -> dict[str, Any]:
        if not self.exists():
            return {"schema": SCHEMA, "records": {}}
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise StoreError.of_os("cannot read", self.path, exc) from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorruptStore(f"{self.path}: not valid JSON ({exc}); move it aside to start a new store") from None
        if not isinstance(data, dict) or not isinstance(data.get("records"), dict):
            raise CorruptStore(f"{self.path}: not an nsa-validate result store (no 'records' object); "
                             "move it aside or choose another --results-dir")
        if "schema" not in data:  # every harness wrote one: a file without it is none of theirs
            raise CorruptStore(f"{self.path}: not an nsa-validate result store (it has no 'schema' key); "
                               "move it aside or choose another --results-dir")
        if data.get("schema") not in READABLE_SCHEMAS:
            raise StoreError(f"{self.path}: schema {data.get('schema')!r}; this harness reads schemas "
                             f"{', '.join(map(str, READABLE_SCHEMAS))} (a newer harness wrote it?)")
        return data

    def check(self) -> None:
        """Raise StoreError now if the store cannot be read or its directory cannot be made
        (before any point runs)."""
        existing = next(p for p in (self.dir, *self.dir.parents) if _exists(p))
        if not existing.is_dir():
            raise StoreError(f"results directory {self.dir}: {existing} is a file, not a directory")
        # a read-only one (or a read-only runs/ or reports/ in it) would end the run in a traceback
        # once its first point wants a directory
        for folder in (existing, *(d for d in (self.dir / "runs", self.dir / "reports") if _exists(d))):
            if not folder.is_dir():
                raise StoreError(f"results directory {self.dir}: {folder} is a file, not a directory")
            try:
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as exc:
                raise StoreError(f"results directory {self.dir}: cannot write in {folder} "
                                 f"({exc.strerror or exc})") from None
        data = self._read()
        try:
            self._typed(data)
        except StoreError as exc:  # a record that is none
            raise CorruptStore(str(exc)) from None

    def _typed(self, data: dict[str, Any]) -> list[PhaseRecord]:
        return [PhaseRecord.from_json(r, f"{self.path}: record {k}") for k, r in data["records"].items()]

    def _write(self, data: dict[str, Any], written: list[PhaseRecord]) -> None:
        """Replace the file with ``data``, under the lock, after removing the reports of the pairs
        of the ``written`` records: they were rendered from the records this write replaces. A stop
        or a kill between the two leaves no report of the pair, never one the store contradicts."""
        for pair in sorted({(r.key.runbook, r.key.profile) for r in written}):
            remove_report(report_path(self.dir, *pair))
        # like the reports beside it, it is for everyone (a colleague's store serves as a --baseline)
        try:
            write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True, default=str), mode=0o644)
        except OSError as exc:
            raise StoreError.of_os("cannot write", self.path, exc) from None

    def put(self, record: PhaseRecord) -> None:
        """Insert or replace the one record with this record's key."""
        self.put_many([record])

    def put_many(self, records: list[PhaseRecord]) -> None:
        with self.locked():
            # every stored record is read (a malformed store is never silently rewritten) and
            # written back in the current schema
            kept = {record_key(r.key): r.to_json() for r in self._typed(self._read())}
            kept.update({record_key(r.key): r.to_json() for r in records})
            self._write({"schema": SCHEMA, "records": kept}, records)

    def put_skip(self, record: PhaseRecord) -> bool:
        """Store a SKIP record only where no run of its point is stored (a record is replaced
        only by a run of that point that ran); whether it was stored."""
        with self.locked():
            stored = {record_key(r.key): r for r in self._typed(self._read())}
            held = stored.get(record_key(record.key))
            if held is not None and held.status != Status.SKIP:
                return False
            kept = {k: r.to_json() for k, r in stored.items()}
            kept[record_key(record.key)] = record.to_json()
            self._write({"schema": SCHEMA, "records": kept}, [record])
            return True

    def records(self, runbook: str | None = None, profile: str | None = None) -> list[PhaseRecord]:
        recs = self._typed(self._read())
        return [r for r in recs if (runbook is None or r.key.runbook == runbook)
                and (profile is None or r.key.profile == profile)]

    def pairs(self) -> list[tuple[str, str]]:
        """(runbook, profile) pairs that have records, sorted."""
        return sorted({(r.key.runbook, r.key.profile) for r in self.records()})
