"""The NSA trainer: single process, DDP and FSDP2, driven by one config.

Modules, by role: config (RunConfig and the env-toggle table), distributed (process group),
parallelize (activation checkpointing, compile, DDP / FSDP2), data (sources, byte tokenizer,
loader with timeout), corpus (the default text: the standard library's sources), optim (AdamW,
cosine schedule), telemetry (training.csv, heartbeats, env.json), strict_json (those JSON files
without a bare NaN or Infinity), tensorboard (event files, opt-in), profile (profile.json on the
contract's request), watchdog (stall detection, stack dumps, .HALT), checkpoint (save / exact
resume), faults (fault injection for tests; grammar in its docstring), loop (Trainer), cli (entry
point), keys (``--list-keys``, ``--check-config``). What they write is nsa/contract.py's schema.

The names below are imported on first use, not with the package: ``python -m nsa.train
--list-keys`` must answer without importing torch, which the model config's package does.
"""
from __future__ import annotations

import importlib

__all__ = ["RunConfig", "load_run_config", "ENV_TOGGLES", "NOOP_TOGGLES"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module(".config", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
