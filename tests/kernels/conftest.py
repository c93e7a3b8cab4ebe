"""Fixtures for the Triton kernel tests.

``kdev`` gives the device the kernels run on: CUDA when present, else the CPU under Triton's
interpreter. Whether Triton interprets is fixed when each @triton.jit decorator runs, Triton's
own standard library included, so on a machine without CUDA this conftest imports triton and
the kernel modules with TRITON_INTERPRET=1 as soon as it is loaded (before any test imports
triton), then restores the variable. ``kdev`` sets it again only while a kernel test module
runs: other tests in the same pytest process keep seeing the Triton backends as unavailable on
CPU, and 'auto' routing never depends on test order.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

KERNEL_MODULES = ("band_attention", "topk", "selection", "window", "combine", "cudnn_compressed", "gated_branches",
                  "rope", "phi_mlp")


def _prepare_interpreter() -> str | None:
    """Import triton and the kernels interpreted; None when ready, else why not."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if "triton" in sys.modules:
        return ("triton was imported before tests/kernels/conftest.py could select its interpreter; "
                "run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
        for name in KERNEL_MODULES:
            importlib.import_module(f"nsa.kernels.{name}")
    except ImportError as e:  # pragma: no cover - depends on the environment
        return f"triton is not importable: {e}"
    finally:
        del os.environ["TRITON_INTERPRET"]
    return None


_INTERP_PROBLEM = None if torch.cuda.is_available() else _prepare_interpreter()


@pytest.fixture(scope="module")
def kdev():
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"triton is not importable: {e}")
    if torch.cuda.is_available():
        yield torch.device("cuda")
        return
    if _INTERP_PROBLEM:
        pytest.skip(_INTERP_PROBLEM)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield torch.device("cpu")
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


#: launch keywords that are options of the compiled launch, not parameters of the kernel
_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "launch_cooperative_grid", "launch_pdl"}


@pytest.fixture(autouse=True)
def _launch_keywords_declared(monkeypatch):
    """A compiled kernel refuses a launch keyword it does not declare (KeyError on the GPU);
    Triton's interpreter ignores it. Interpreted, such a launch fails here too."""
    if torch.cuda.is_available() or _INTERP_PROBLEM:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction

    real = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        unknown = set(kwargs) - set(self.arg_names) - _LAUNCH_OPTIONS
        if unknown:
            raise KeyError(f"{self.__name__} declares no {', '.join(sorted(unknown))}: a compiled launch refuses it")
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    yield


@pytest.fixture(autouse=True)
def _nan_poisoned_empty(monkeypatch):
    """torch.empty/empty_like return NaN-filled float tensors during kernel tests, so a tile
    a kernel never wrote shows up as NaN instead of leftover memory."""
    real_empty, real_like = torch.empty, torch.empty_like
    # `with torch.device(...)` caches the factories it redirects on its first use, which a trace in
    # a test may make: cached while these are replaced, it would hold the replacements, and the
    # context would build on the CPU for the rest of the process (tests/kernels/test_fixtures.py)
    from torch.utils._device import _device_constructors
    _device_constructors()

    def poison(t):
        if t.requires_grad:  # a leaf made to carry autograd state (torch.utils.checkpoint's), not data
            return t
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int32, torch.int64):
            t.fill_(-7)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_like(*a, **k)))
