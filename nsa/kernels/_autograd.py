"""How the Triton kernels meet autograd and torch.compile.

Each kernel pair is a torch custom op (``nsa::*_fwd`` with its autograd formula, calling the
``nsa::*_bwd`` op), so torch.compile treats it as one opaque call: it cannot trace a Triton
launch. In eager mode the same forward runs through a plain autograd.Function that shares the
op's setup_context and backward: a custom op's autograd dispatch costs about three times the
host time of an autograd.Function (88 vs 27 us per call, measured on this project's CPU box),
and small NSA calls are bound by their launches.
"""
from __future__ import annotations

from typing import Callable

import torch


def eager_function(name: str, forward: Callable, setup_context: Callable, backward: Callable):
    """An autograd.Function running ``forward`` (the kernels, directly) with the custom op's
    ``setup_context`` and ``backward``."""
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
    })


def dispatch(op, function, *args):
    """The custom op while torch.compile traces, the autograd.Function otherwise."""
    return op(*args) if torch.compiler.is_compiling() else function.apply(*args)
