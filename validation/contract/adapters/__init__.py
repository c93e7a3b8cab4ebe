"""Adapters: a trainer's own files -> the artifact contract (docs/artifact_contract.md).

A trainer named in a runbook's ``trainer:`` entry writes into its own directory; after it exits
its adapter writes the contract files into the point's run directory, where the harness reads
them (validation/contract/check.py). While it runs, the harness shows progress from the trainer's own
CSV, whose first and fourth columns are step and tokens/s in every format adapted here.
"""
from __future__ import annotations

from validation.contract.adapters.base import Adapter, RunFacts
from validation.contract.adapters.hf_trainer import HfTrainerAdapter
from validation.contract.adapters.seed import SeedAdapter
from validation.contract.adapters.torchtitan import TorchtitanAdapter

#: the formats this harness reads, by adapter name (a runbook's ``trainer.format``; the native
#: adapter's format is called "contract" there)
ADAPTERS: dict[str, Adapter] = {a.name: a for a in (Adapter(), SeedAdapter(), TorchtitanAdapter(), HfTrainerAdapter())}

#: the name people give a format (a runbook's ``trainer.format``, ``check-artifacts --adapter``, what
#: ``phases`` prints) where it differs from its adapter's: a trainer that writes the contract itself
#: is "native" inside, its files are "contract"
FORMAT_OF = {"native": "contract"}
#: each adapter by its format's name
FORMATS: dict[str, str] = {FORMAT_OF.get(name, name): name for name in ADAPTERS}


def format_of(adapter: str) -> str:
    """The format an adapter reads, as a runbook's ``trainer.format`` names it."""
    return FORMAT_OF.get(adapter, adapter)


__all__ = ["ADAPTERS", "FORMATS", "FORMAT_OF", "Adapter", "HfTrainerAdapter", "RunFacts", "SeedAdapter",
           "TorchtitanAdapter", "format_of"]
