"""A finding: one thing the report tells a reader, found automatically in stored records."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from validation.judge.record import PhaseRecord


class Severity(enum.StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    phase: str
    title: str
    detail: list[str] = field(default_factory=list)
    kind: str = ""
    """Which detector found it (recommendations key on this)."""


def point_label(rec: PhaseRecord) -> str:
    """The record's sweep parameters in the runbook's sweep order: 'seq_len=512, batch_size=2'."""
    order = rec.params_order or sorted(rec.key.params)
    return ", ".join(f"{k.split('.')[-1]}={rec.key.params[k]}" for k in order if k in rec.key.params) or "default"


def where(rec: PhaseRecord) -> str:
    """'phase [point]'."""
    return f"{rec.phase} [{point_label(rec)}]"
