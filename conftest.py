"""Root pytest configuration: GPU auto-skip by marker, the harness plugin, and one compute
thread per xdist worker.

Markers are registered in pytest.ini (``--strict-markers``). A test marked ``gpu`` skips
without CUDA; ``multi_gpu`` skips with fewer than two GPUs; hardware-profile markers
(``a100``/``h100``/``h200``) need CUDA too. The skip reason says what was missing.
"""
from __future__ import annotations

import os

import pytest

from validation.launch.load import IGNORE_ENV

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


@pytest.fixture(autouse=True, scope="session")
def quiet_machine():
    """The tests judge their trainers' timings as if run on a quiet machine, whatever else shares the
    cores (an xdist run on two): the fake trainer makes its speeds up, and the fault tests assert
    exactly the findings of a fault, not a busy machine's too. Session-wide, so that module-scoped
    fixtures that run trainers see it; the acceptance runbooks' points (what `pytest -m h100` runs)
    are real runs, judged with the machine's load (validation/tests/test_acceptance.py lifts it)."""
    saved = os.environ.get(IGNORE_ENV)
    os.environ[IGNORE_ENV] = "1"
    yield
    if saved is None:
        os.environ.pop(IGNORE_ENV, None)
    else:
        os.environ[IGNORE_ENV] = saved


def pytest_runtest_setup(item: pytest.Item) -> None:
    names = {m.name for m in item.iter_markers()}
    count = None
    if names & set(_GPU_MARKERS) or "multi_gpu" in names:
        count = _cuda_count()
        if count == 0:
            pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    if "multi_gpu" in names and count is not None and count < 2:
        pytest.skip(f"needs 2 or more CUDA GPUs; this machine has {count}")
