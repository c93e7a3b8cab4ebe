"""Deterministic training steps (train.deterministic, env NSA_DETERMINISTIC): the switches
PyTorch offers, set once before the trainer does any CUDA work, and what they leave open.

With the switch on, the same commit, config, seed and hardware give the same per-step loss, so
golden loss curves (validation/goldens.py) can hold a tight tolerance on GPU as on CPU. What it
sets:

* ``torch.use_deterministic_algorithms(True)``: PyTorch picks deterministic kernels, and raises
  on an op that has none (the run fails loudly rather than drifting silently);
* ``torch.backends.cudnn.deterministic = True`` and ``benchmark = False`` (no autotuned pick
  that may differ from run to run);
* ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` where unset (cuBLAS needs it for reproducible results on
  CUDA >= 10.2; it must be in the environment before the first cuBLAS handle exists).

The NSA Triton kernels read ``torch.are_deterministic_algorithms_enabled()`` themselves and choose
a fixed-order backward instead of float32 atomics (nsa/kernels); this module only sets the flag.
``NON_DETERMINISTIC`` says what stays outside these switches; env.json records it.
"""
from __future__ import annotations

import os
from typing import Any

import torch

#: cuBLAS's reproducibility setting (not a trainer toggle: it is CUDA's own variable)
CUBLAS_VAR, CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG", ":4096:8"

#: what deterministic mode does not cover, recorded in env.json and the docs
NON_DETERMINISTIC = (
    "NCCL all-reduce under DDP/FSDP2 on several GPUs: the reduction order follows the ring or tree "
    "NCCL picks, so multi-GPU losses may differ in the last bits between runs",
    "the data loader's wall-clock timeouts and the throughput/memory columns of training.csv (timing, "
    "not numerics)",
    "torch.compile (train.compile): inductor honours the flag for the ops it lowers, but autotuned "
    "Triton configurations can differ between runs",
    "a different GPU model, driver, CUDA, PyTorch or Triton version: goldens are kept per hardware class",
)


def apply(enabled: bool) -> dict[str, Any]:
    """Set PyTorch's deterministic switches when ``enabled``; return what env.json records.
    Call before any CUDA work (the cuBLAS variable is read when its first handle is made)."""
    if not enabled:
        return {"enabled": False}
    os.environ.setdefault(CUBLAS_VAR, CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return {"enabled": True, "cublas_workspace_config": os.environ[CUBLAS_VAR],
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "non_deterministic": list(NON_DETERMINISTIC)}
