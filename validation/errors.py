"""The harness's error types; each message names the file and key at fault."""
from __future__ import annotations


class HarnessError(Exception):
    """Base class of harness errors (a bad input, not a failed gate)."""


class RunbookError(HarnessError):
    """A runbook or hardware profile does not validate; the message names the file and key."""


class ArtifactError(HarnessError):
    """A trainer artifact (training.csv, heartbeat, env.json) is missing or unreadable."""


class StoreError(HarnessError):
    """The result store is unreadable or would be written outside its directory."""


class CorruptStore(StoreError):
    """The result store's file is there but is not a store: not JSON, no records, or a record that
    is none. The reports rendered from it can no longer be backed by it."""
