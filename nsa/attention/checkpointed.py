"""An NSA layer's recomputation while torch.compile traces it: selective activation checkpointing.

An eager layer keeps how to make tensors again through saved-tensor hooks of its own
(nsa.attention.remade); a traced one cannot, since what it saves is the compiler's choice. Its
forward runs instead under torch.utils.checkpoint with a policy that tags every op to be made
again in the backward except the top-n selection and the selected branch: the ops whose work is
the largest of the layer's forward and whose outputs (the indices, o_sel and its log-sum-exp, the
inverse selection) its backward reads. The compiler's partitioner then keeps those outputs and the
layer's input, and makes q, the key/value streams, the compressed tokens, the compressed and
window branches' outputs, the gated sum and the gates again from them (the eager recipes make the
same tensors again, but the gates). The stages run as separate ops (nsa.attention.core,
``one_op=False``): the one op of the selected and window branches would keep the window's output
with the selected branch's.

Those two ops are the Triton kernels' custom ops. On the PyTorch path (the CPU's) the selection
and the selected branch are plain aten ops, which the policy tags like every other op: the
compiler may make them again too, to the same values, so the traced layer keeps less than the
eager one and recomputes more.

Under torch.compile, torch prints once per process, for any checkpoint given a context_fn, that
the region must hold no in-place op: the compiler's functionalization can lose one there
(pytorch/pytorch#113737). It prints it whatever the region holds, since it cannot tell; this
region holds none (the custom ops declare ``mutates_args=()``), which
tests/kernels/test_compile.py checks on the traced layer.

The policy carries a ``cache_hash`` (torch's AOTAutograd cache reads it to key a graph holding a
checkpoint with a context_fn, and bypasses the cache for a context_fn without one): a hash of the
policy's source and the kept ops, so that a changed policy misses the cache, and a new process
compiling the same model reuses the traced and partitioned graphs instead of making them again.
"""
from __future__ import annotations

import hashlib
import inspect
from functools import partial
from typing import Callable

from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .backends import Route

#: the op (torch custom op, nsa.kernels) whose outputs a traced layer keeps, by the stage that runs
#: it where the stage's route is Triton
KEPT_OPS_BY_STAGE = {"select": "nsa::select_blocks", "sel": "nsa::sel_fwd"}
KEPT_OPS = frozenset(KEPT_OPS_BY_STAGE.values())


def _keep_selection(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    name = op.name() if hasattr(op, "name") else ""
    return CheckpointPolicy.MUST_SAVE if name in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _policy() -> partial:
    """The context_fn of a checkpoint keeping the outputs of KEPT_OPS, with its cache_hash."""
    context_fn = partial(create_selective_checkpoint_contexts, _keep_selection)
    source = inspect.getsource(_keep_selection) + repr(sorted(KEPT_OPS))
    context_fn.cache_hash = "nsa-keep-selection-" + hashlib.sha256(source.encode()).hexdigest()[:16]
    return context_fn


#: built once: torch.compile cannot trace the setting of an attribute on a partial
_POLICY = _policy()


def runs_kept_ops(routes: dict[str, Route]) -> bool:
    """Whether a layer on ``routes`` runs an op of KEPT_OPS."""
    return any(routes[stage].backend == "triton" for stage in KEPT_OPS_BY_STAGE)


def keep_selection_only(fn: Callable, routes: dict[str, Route], *args, **kwargs):
    """fn(*args, **kwargs) of a layer on ``routes``, its backward making again everything but the
    outputs of KEPT_OPS. Where the routes run none of them, the policy would tag every op
    PREFER_RECOMPUTE, which is what torch.compile gives a checkpoint without a context_fn
    (torch._higher_order_ops.wrap): none is passed, for the same graphs without the warning of
    the module's docstring."""
    policy = dict(context_fn=_POLICY)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False,
                      **(policy if runs_kept_ops(routes) else {}), **kwargs)
