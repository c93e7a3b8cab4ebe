"""How the kernels meet autograd and torch.compile, written once for every kernel pair.

``kernel_op`` turns a forward and a backward implementation into two torch custom ops,
``nsa::<name>_fwd`` (with its autograd formula, calling ``nsa::<name>_bwd``) and
``nsa::<name>_bwd``, so torch.compile treats each as one opaque call: it cannot trace a Triton
launch, nor lower the views around the cuDNN fold of the compressed branch (cudnn_compressed). In eager mode, where small NSA calls are bound by their launches, the dispatcher's
custom-op path is skipped (``run_op``): the forward runs through a plain autograd.Function that
shares the op's setup_context and backward, and the backward formula calls the plain backward
implementation: the dispatcher's path costs host time a call that this one does not
(`python bench/host_profile.py --op-overhead` measures both).

The contract of a pair: forward(*tensors, *args) returns one tensor or a tuple whose first
element is the differentiable output (the rest, such as a log-sum-exp, carry no gradient);
backward(*tensors, *saved outputs, grad of the first output, *args) returns the gradients of
the first ``grads`` tensors. ``args`` are ints, bools and strs (a form's name, a tuning's
``as_arg()``, nsa.kernels.tuning).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode


#: why a double backward through a kernel is refused, and where one runs
NO_DOUBLE_BACKWARD = (
    "has no double backward (create_graph=True, such as a gradient penalty): the kernels compute their "
    "gradients outside autograd, so a second derivative through them would miss their terms; under torch.func "
    "(torch.func.grad, vjp, jacrev) an attention layer runs op by op, which has one")


def _eager_function(name: str, forward: Callable, setup_context: Callable, backward: Callable):
    """An autograd.Function running ``forward`` (the kernels, directly) with the custom op's
    ``setup_context`` and ``backward``. It is an old-style Function (the context set up inside
    forward): with a separate setup_context, Function.apply binds its arguments through
    inspect.signature on every call, several times the host time of this path."""
    def run(ctx, *args):
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    def first_order_backward(ctx, *grads):
        # grad mode is on in a backward only under create_graph=True: the gradients made here
        # would carry no graph of the kernels, and a second derivative would lack their terms
        if torch.is_grad_enabled():
            raise RuntimeError(f"NSA's kernel {name} {NO_DOUBLE_BACKWARD}")
        return backward(ctx, *grads)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(run),
        "backward": staticmethod(first_order_backward),
    })


#: the tensor types an eager call passes as they are
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class WatchingMode(TorchDispatchMode):
    """A dispatch mode that only watches: a subclass returns each op's own result and traces
    nothing, so the kernels take their eager path under it, and what it sees of a call is what an
    eager call runs (`python bench/host_profile.py --layer --origins` counts ops under one)."""


def traced(args) -> bool:
    """True while a graph is being traced (torch.compile, AOT autograd, make_fx, opcheck):
    dynamo is compiling, a dispatch mode (fake, functional, proxy; not a WatchingMode) is active,
    or an argument is a tensor subclass such as FakeTensor (a module's own parameter, an
    nn.Parameter, is not one). The graph must then hold the custom op."""
    if torch.compiler.is_compiling():  # first: dynamo does not trace the dispatch-mode stack
        return True
    mode = _get_current_dispatch_mode()
    if mode is not None and not isinstance(mode, WatchingMode):
        return True
    return any(isinstance(a, torch.Tensor) and type(a) not in _PLAIN for a in args)


def run_op(op, implementation: Callable, *args):
    """The custom op while a graph is traced, the op's plain implementation otherwise."""
    return op(*args) if traced(args) else implementation(*args)


@dataclass(frozen=True)
class KernelOp:
    """A differentiable kernel pair; call it with the forward's arguments."""
    fwd: torch.library.CustomOpDef
    bwd: torch.library.CustomOpDef
    eager: type[torch.autograd.Function]

    def __call__(self, *args):
        return run_op(self.fwd, self.eager.apply, *args)


def kernel_op(name: str, forward: Callable, backward: Callable, fake_forward: Callable, *,
              tensors: int, grads: int, saved_outputs: slice = slice(None)) -> KernelOp:
    """Register nsa::<name>_fwd / nsa::<name>_bwd (schemas from the type hints of ``forward``
    and ``backward``). ``tensors``: how many leading arguments are tensors (the rest are ints,
    bools and strs); ``grads``: how many of them get a gradient; ``saved_outputs``: which of the
    forward's outputs the backward reads, and so keeps alive past the forward (attention: o and
    its lse; a weighted sum: none; the gated branches: each branch's, not their sum's)."""
    fwd = torch.library.custom_op(f"nsa::{name}_fwd", forward, mutates_args=())
    fwd.register_fake(fake_forward)
    bwd = torch.library.custom_op(f"nsa::{name}_bwd", backward, mutates_args=())
    bwd.register_fake(lambda *inputs: tuple(torch.empty_like(t) for t in inputs[:grads]))

    def setup_context(ctx, inputs, output):
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*inputs[:tensors], *outputs[saved_outputs])
        ctx.args = inputs[tensors:]
        ctx.mark_non_differentiable(*outputs[1:])
        # no zero-filled gradients for the other outputs (a log-sum-exp, saved branch outputs):
        # the backward reads the first output's gradient only
        ctx.set_materialize_grads(False)

    def backward_formula(ctx, grad, *_no_grads):
        dx = run_op(bwd, backward, *ctx.saved_tensors, grad, *ctx.args)
        return (*dx, *(None,) * (tensors - grads + len(ctx.args)))

    fwd.register_autograd(backward_formula, setup_context=setup_context)
    return KernelOp(fwd, bwd, _eager_function(name, forward, setup_context, backward_formula))
