"""How the Triton kernels meet autograd and torch.compile.

Each kernel pair is a torch custom op (``nsa::*_fwd`` with its autograd formula, calling the
``nsa::*_bwd`` op), so torch.compile treats it as one opaque call: it cannot trace a Triton
launch. In eager mode, where small NSA calls are bound by their launches, the dispatcher's
custom-op path is skipped (``run_op``): the forward runs through a plain autograd.Function that
shares the op's setup_context and backward, and the backward formulas and the block selection
call the ops' plain implementations. On the H100 box the op path cost 271 against 211 us
host time per band_bwd call, 93 against 54 us per select_blocks call
(`python bench/host_profile.py --op-overhead`).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


def eager_function(name: str, forward: Callable, setup_context: Callable, backward: Callable):
    """An autograd.Function running ``forward`` (the kernels, directly) with the custom op's
    ``setup_context`` and ``backward``. It is an old-style Function (the context set up inside
    forward): with a separate setup_context, Function.apply binds its arguments through
    inspect.signature on every call, 109-123 us against 33-43 us per call measured on this
    project's CPU box."""
    def run(ctx, *args):
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(run),
        "backward": staticmethod(backward),
    })


def _traced(args) -> bool:
    """True while a graph is being traced (torch.compile, AOT autograd, make_fx, opcheck):
    dynamo is compiling, a dispatch mode (fake, functional, proxy) is active, or an argument is
    a tensor subclass such as FakeTensor. The graph must then hold the custom op."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return True
    return any(isinstance(a, torch.Tensor) and type(a) is not torch.Tensor for a in args)


def run_op(op, implementation: Callable, *args):
    """The custom op while a graph is traced, the op's plain implementation otherwise."""
    return op(*args) if _traced(args) else implementation(*args)
