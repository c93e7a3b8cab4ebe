"""Root pytest configuration: GPU auto-skip by marker, and the harness plugin.

Markers are registered in pytest.ini (``--strict-markers``). A test marked ``gpu`` skips
without CUDA; ``multi_gpu`` skips with fewer than two GPUs; hardware-profile markers
(``a100``/``h100``/``h200``) need CUDA too. The skip reason says what was missing.
"""
from __future__ import annotations

import pytest

pytest_plugins = ["validation.pytest_plugin"]

_GPU_MARKERS = ("gpu", "a100", "h100", "h200")


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_runtest_setup(item: pytest.Item) -> None:
    names = {m.name for m in item.iter_markers()}
    count = None
    if names & set(_GPU_MARKERS) or "multi_gpu" in names:
        count = _cuda_count()
        if count == 0:
            pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    if "multi_gpu" in names and count is not None and count < 2:
        pytest.skip(f"needs 2 or more CUDA GPUs; this machine has {count}")
