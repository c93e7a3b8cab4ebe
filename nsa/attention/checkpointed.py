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
"""
from __future__ import annotations

from functools import partial
from typing import Callable

from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

#: the ops (torch custom ops, nsa.kernels) whose outputs a traced layer keeps
KEPT_OPS = frozenset({"nsa::select_blocks", "nsa::sel_fwd"})


def _keep_selection(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    name = op.name() if hasattr(op, "name") else ""
    return CheckpointPolicy.MUST_SAVE if name in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def keep_selection_only(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), its backward making again everything but the outputs of KEPT_OPS."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False,
                      context_fn=partial(create_selective_checkpoint_contexts, _keep_selection), **kwargs)
