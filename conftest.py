"""Root pytest configuration: GPU auto-skip by marker, the harness plugin, and one compute
thread per xdist worker.

Markers are registered in pytest.ini (``--strict-markers``). A test marked ``gpu`` skips
without CUDA; ``multi_gpu`` skips with fewer than two GPUs; hardware-profile markers
(``a100``/``h100``/``h200``) need CUDA too. The skip reason says what was missing.
"""
from __future__ import annotations

import os

import pytest

pytest_plugins = ["validation.pytest_plugin"]

_GPU_MARKERS = ("gpu", "a100", "h100", "h200")


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list) -> None:
    """Under xdist several test processes share the machine's cores, and torch's OpenMP pool and
    numpy's OpenBLAS pool in each would take every core: with one thread each they compute side by
    side instead of spinning against each other (the subprocesses the tests start mostly set
    OMP_NUM_THREADS=1 already). Set before the workers start, so that the pools read it as the
    libraries load; a value the caller set is kept."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_runtest_setup(item: pytest.Item) -> None:
    names = {m.name for m in item.iter_markers()}
    count = None
    if names & set(_GPU_MARKERS) or "multi_gpu" in names:
        count = _cuda_count()
        if count == 0:
            pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    if "multi_gpu" in names and count is not None and count < 2:
        pytest.skip(f"needs 2 or more CUDA GPUs; this machine has {count}")
