"""The artifact contract (docs/artifact_contract.md), checked in this one place.

``read(out_dir)`` reads a run directory with the readers of artifacts.py and says, file by file,
what is present, missing or malformed. The harness reads every train point through it (a
required file missing or malformed is the point's ERROR) and ``nsa-validate check-artifacts``
prints it for trainer authors.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from nsa.contract import ENV_JSON, HALT, TRAINING_CSV
from validation.contract.files import (
    halted,
    read_env_json,
    read_heartbeats,
    read_training_csv,
    stackdumps,
)
from validation.errors import ArtifactError

HEARTBEAT_GLOB = "heartbeat_rank{R}.jsonl"
#: fields every heartbeat record carries (the harness reads them for progress, stalls, imbalance)
HEARTBEAT_FIELDS = ("time", "step")
#: fields env.json must carry, and the recommended ones with what their absence costs
ENV_REQUIRED = ("world_size",)
ENV_OPTIONAL = {"git_sha": "the report names no commit for the trainer",
                "attention_backends": "backends_recorded is UNMEASURED, the report shows no backends"}


class Presence(enum.StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class Item:
    """One file (or field) of the contract as found in a run directory."""

    file: str
    presence: Presence
    detail: str = ""
    required: bool = True
    field: str | None = None
    """A key inside the file (env.json's world_size), when the item is about one."""

    @property
    def problem(self) -> bool:
        """A required item that is not there as the contract says."""
        return self.required and self.presence != Presence.PRESENT

    def line(self) -> str:
        tag = str(self.presence) if self.required or self.presence == Presence.PRESENT else f"{self.presence} (optional)"
        name = f"{self.file} {self.field}" if self.field else self.file
        return f"{tag:<20} {name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class ContractRead:
    """A run directory's contract files, parsed, and what was found wrong with them."""

    out_dir: Path
    csv: pd.DataFrame | None = None
    heartbeats: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    halted: bool = False
    items: list[Item] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(i.problem for i in self.items)

    def problems(self) -> list[str]:
        """What breaks the contract, each naming the file: the harness's errors of the point."""
        return [f"{self.out_dir / i.file}{' ' + i.field if i.field else ''}: {i.presence}"
                + (f" ({i.detail})" if i.detail else "") for i in self.items if i.problem]


def read(out_dir: Path) -> ContractRead:
    out_dir = Path(out_dir)
    found = ContractRead(out_dir)
    found.csv = _file(found, TRAINING_CSV, (out_dir / TRAINING_CSV).is_file(), read_training_csv, _csv_detail)
    found.heartbeats = _file(found, HEARTBEAT_GLOB, any(out_dir.glob("heartbeat_rank*.jsonl")), read_heartbeats,
                             _beats_detail) or {}
    if found.heartbeats:
        _heartbeat_fields(found)
    found.env = _file(found, ENV_JSON, (out_dir / ENV_JSON).is_file(), read_env_json, lambda env: f"{len(env)} keys")
    if found.env is not None:
        _env_fields(found)
    found.halted = halted(out_dir)
    if found.halted:
        text = (out_dir / HALT).read_text(errors="replace").strip()
        found.items.append(Item(HALT, Presence.PRESENT, f"run stopped: {text[:120] or 'empty file'}", False))
    for rank, path in stackdumps(out_dir).items():
        found.items.append(Item(path.name, Presence.PRESENT, f"stack dump of rank {rank}", False))
    return found


def silent_ranks(found: ContractRead) -> list[Item]:
    """A missing item per rank below env.json's world_size that wrote no heartbeat file (the
    contract: every rank beats). For check-artifacts: in an acceptance run such a rank is an idle
    rank (the idle_ranks gate, with its finding), not a broken file."""
    world = (found.env or {}).get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or not found.heartbeats:
        return []
    return [Item(f"heartbeat_rank{r}.jsonl", Presence.MISSING, f"not written (env.json says world_size {world})")
            for r in range(world) if r not in found.heartbeats]


def _file(found: ContractRead, name: str, exists: bool, reader: Callable[[Path], Any],
          detail: Callable[[Any], str]) -> Any:
    if not exists:
        found.items.append(Item(name, Presence.MISSING, "not written"))
        return None
    try:
        value = reader(found.out_dir)
    except ArtifactError as exc:  # the reader's message names the file; the item names it too
        text = str(exc)
        found.items.append(Item(name, Presence.MALFORMED, text.split(": ", 1)[1] if text.startswith("/") else text))
        return None
    found.items.append(Item(name, Presence.PRESENT, detail(value)))
    return value


def _csv_detail(df: pd.DataFrame) -> str:
    return f"{len(df)} rows, steps {int(df['step'].min())}..{int(df['step'].max())}"


def _beats_detail(beats: dict[int, list[dict[str, Any]]]) -> str:
    return ", ".join(f"rank {r}: {len(recs)} records" for r, recs in sorted(beats.items()))


def _heartbeat_fields(found: ContractRead) -> None:
    for rank, recs in sorted(found.heartbeats.items()):
        for i, rec in enumerate(recs):
            lacking = [f for f in HEARTBEAT_FIELDS if not _number(rec.get(f))]
            if lacking:
                found.items.append(Item(f"heartbeat_rank{rank}.jsonl", Presence.MALFORMED,
                                        f"record {i + 1} has no numeric {', '.join(repr(f) for f in lacking)} "
                                        f"(keys: {', '.join(sorted(rec))})"))
                break


def _env_fields(found: ContractRead) -> None:
    env = found.env or {}
    for key in ENV_REQUIRED:
        if not isinstance(env.get(key), int) or isinstance(env.get(key), bool):
            found.items.append(Item(ENV_JSON, Presence.MISSING if key not in env else Presence.MALFORMED,
                                    f"expected an integer, got {env.get(key)!r}", field=key))
    for key, cost in ENV_OPTIONAL.items():
        if not env.get(key):
            found.items.append(Item(ENV_JSON, Presence.MISSING, cost, False, key))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
