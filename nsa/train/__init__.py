"""The NSA trainer: single process, DDP and FSDP2, driven by one config.

Modules, by role: config (RunConfig and the env-toggle table), distributed (process group),
parallelize (activation checkpointing, compile, DDP / FSDP2), data (sources, byte tokenizer,
loader with timeout), optim (AdamW, cosine schedule), telemetry (training.csv, heartbeats,
env.json), watchdog (stall detection, stack dumps, .HALT), checkpoint (save / exact resume),
faults (fault injection for tests; grammar in its docstring), loop (Trainer), cli (entry point).
"""
from .config import ENV_TOGGLES, NOOP_TOGGLES, RunConfig, load_run_config

__all__ = ["RunConfig", "load_run_config", "ENV_TOGGLES", "NOOP_TOGGLES"]
