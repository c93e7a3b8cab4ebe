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

__all__ = ["ADAPTERS", "Adapter", "HfTrainerAdapter", "RunFacts", "SeedAdapter", "TorchtitanAdapter"]
