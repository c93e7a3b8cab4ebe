"""The kernel layer is a leaf: nsa/kernels imports nothing from the layers above it, importing
nsa imports no Triton, and routing a stage to a kernel imports that kernel before the first
call (which torch.compile may trace)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nsa.attention.backends import BACKENDS, STAGES, auto_order

KERNELS = Path(__file__).resolve().parents[2] / "nsa" / "kernels"


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module or "")
    return names


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.name)
def test_kernel_modules_import_no_layer_above(path):
    above = sorted(m for m in _imported_modules(path) if m == "nsa" or (m.startswith("nsa.") and not m.startswith("nsa.kernels")))
    assert not above, f"{path.name} imports {above}: nsa/kernels must take tensors and ints only"


def _run(code: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_nsa_imports_no_triton_and_routing_imports_the_kernels():
    code = """
import sys, torch
import nsa.model, nsa.attention, nsa.kernels
from nsa.attention.backends import preload, resolve_route
before = "triton" in sys.modules
torch_route = resolve_route("sel", "torch", torch.device("cpu"), torch.float32)
preload(torch_route)
after_torch = "triton" in sys.modules
preload(resolve_route("sel", "triton", torch.device("cpu"), torch.float32))
print(before, after_torch, "nsa.kernels.selection" in sys.modules, "nsa.kernels.band_attention" in sys.modules)
"""
    pytest.importorskip("triton")
    assert _run(code, TRITON_INTERPRET="1") == "False False True True"


@pytest.mark.parametrize("stage", STAGES)
def test_auto_order_names_backends_of_the_stage_and_ends_with_torch(stage):
    for device in (torch.device("cpu"), torch.device("cuda")):
        for dtype in (torch.float32, torch.bfloat16):
            order = auto_order(stage, device, dtype)
            assert order[-1] == "torch" and set(order) <= set(BACKENDS[stage]), (device, dtype, order)
    assert auto_order(stage, torch.device("cpu"), torch.float32) == ("torch",)
