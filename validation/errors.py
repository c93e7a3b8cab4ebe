"""The harness's error types; each message names the file and key at fault."""
from __future__ import annotations

from pathlib import Path
from typing import Self


class HarnessError(Exception):
    """Base class of harness errors (a bad input, not a failed gate)."""

    @classmethod
    def of_os(cls, what: str, path: Path, exc: OSError) -> Self:
        """'cannot write /r/results.json: No space left on device': ``what`` failed on ``path``
        (the file meant, not the temp file, lock or folder beside it that the system may name:
        that one is added in brackets)."""
        other = f" ({exc.filename})" if exc.filename and Path(exc.filename) != Path(path) else ""
        return cls(f"{what} {path}: {exc.strerror or exc}{other}")


class RunbookError(HarnessError):
    """A runbook or hardware profile does not validate; the message names the file and key."""


class ArtifactError(HarnessError):
    """A trainer artifact (training.csv, heartbeat, env.json) is missing or unreadable."""


class StoreError(HarnessError):
    """The result store is unreadable or would be written outside its directory; or a file of the
    results directory (the store, a report) cannot be written or removed."""


class CorruptStore(StoreError):
    """The result store's file is there but is not a store: not JSON, no records, or a record that
    is none. The reports rendered from it can no longer be backed by it."""
