"""phi: the compression of l consecutive keys (or values) into one compressed token.

Compressed token i summarises positions [i*d, i*d + l). 'mlp' is the paper's learnable phi (an
MLP over the flattened block plus a learned intra-block position embedding), shared by the KV
heads; 'mean' is mean pooling (no parameters).
"""
from __future__ import annotations

from enum import Enum
from operator import attrgetter
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from nsa.kernels._autograd import traced

from .autocast import autocast_dtype
from .autograd_state import func_transform_active
from .backends import phi_kernel
from .config import NSAConfig
from . import phi_mlp


#: from this many tokens (batch x length) an NSA layer's training forward recomputes in the
#: backward what it can make again from tensors kept anyway, instead of keeping it: here fc1's
#: input (the key/value streams' chunks, from the streams); in NSAAttention also q, the key/value
#: streams, the compressed and window branches' outputs and the output projection's input.
#: Activation memory counts at long context; below it the recomputation's kernel launches would
#: cost more host time than its memory is worth
RECOMPUTE_TOKENS = 32768


class Recompute(Enum):
    """How a training forward recomputes in the backward (see RECOMPUTE_TOKENS)."""

    #: not at all: below RECOMPUTE_TOKENS, without gradients, under a torch.func transform
    NONE = "none"
    #: eagerly, through saved-tensor hooks that keep how to make a tensor again (nsa.attention.remade)
    RECIPES = "recipes"
    #: while torch.compile traces (which takes no saved-tensor hooks of a layer's own): selective
    #: activation checkpointing tags what the compiler's partitioner makes again in the backward
    CHECKPOINT = "checkpoint"


def recompute_for(x: torch.Tensor) -> Recompute:
    """How a forward on x [B, T, ...] recomputes in the backward."""
    if x.shape[0] * x.shape[1] < RECOMPUTE_TOKENS or not torch.is_grad_enabled():
        return Recompute.NONE
    if torch.compiler.is_compiling():
        return Recompute.CHECKPOINT
    return Recompute.NONE if func_transform_active() else Recompute.RECIPES


class Compressor(nn.Module):
    """phi over the blocks of one key or value stream (``compress`` runs several at once)."""

    def __init__(self, head_dim: int, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg
        self.kind = cfg.phi
        if self.kind == "mlp":
            l = cfg.cmp_block
            self.pos = nn.Parameter(torch.zeros(l, head_dim))
            self.fc1 = nn.Linear(l * head_dim, head_dim)
            self.fc2 = nn.Linear(head_dim, head_dim)

    def reset_parameters(self) -> None:
        """The initial values (pos zero, the Linears' own), for a model built on the meta
        device and materialised with ``to_empty``."""
        if self.kind == "mlp":
            nn.init.zeros_(self.pos)
            self.fc1.reset_parameters()
            self.fc2.reset_parameters()

    def phi_params(self) -> dict | None:
        """The parameters in the oracle's layout (see reference.reference_phi)."""
        if self.kind != "mlp":
            return None
        return {"pos": self.pos, "w1": self.fc1.weight, "b1": self.fc1.bias,
                "w2": self.fc2.weight, "b2": self.fc2.bias}

    def forward(self, x: torch.Tensor, first: int = 0) -> torch.Tensor:
        """x [B, T, H, K] per-token keys/values at positions 0..T-1 -> compressed tokens
        [B, Nc - first, H, K] for blocks first..Nc-1 (Nc blocks fit entirely in T)."""
        return compress([self], [x], first)[0]


def compress(compressors: Sequence[Compressor], xs: Sequence[torch.Tensor], first: int = 0,
             fc1_inputs: list[torch.Tensor] | None = None, one_node: bool = False) -> list[torch.Tensor]:
    """Each compressor's tokens of its stream (``Compressor.forward``), those of one config and
    shape together: an MLP phi runs once for all, its parameters stacked, so that a layer's key
    and value compressors cost the launches of one.

    ``fc1_inputs``: a caller that keeps how to make the streams again (NSAAttention's recipes)
    gets fc1's input appended to it, to make it again from them with ``fc1_input``; otherwise,
    where an eager forward recomputes (Recompute.RECIPES), the MLP's first layer runs under
    checkpointing, so that its input is not kept; a traced forward's recomputation is its
    caller's.

    ``one_node``: in eager mode (no torch.compile trace or other graph capture, no torch.func
    transform), where the Triton kernels run on the streams' device in the compute dtype (CUDA,
    or the CPU under TRITON_INTERPRET=1) and where fc1's input is kept or handed to the caller,
    the MLP runs as one autograd node on them (nsa.attention.phi_mlp.one_node), for the host time
    of an eager layer; elsewhere op by op."""
    cfg, x = compressors[0].cfg, xs[0]
    n = blocks_in(cfg, x.shape[1], first)
    if n == 0:
        return [t.new_zeros(t.shape[0], 0, *t.shape[2:]) for t in xs]
    if cfg.phi == "mean":
        return [unfold_blocks(cfg, t, first).mean(dim=-1) for t in xs]
    dtype = autocast_dtype(x.device.type) or x.dtype
    # the streams in the compute dtype before fc1's input stacks them: autocast's rule for a stack
    # of another 16-bit dtype (float16 streams under bfloat16 autocast) is an error
    xs = [t.to(dtype) for t in xs]
    if (one_node and not traced(xs) and not func_transform_active() and phi_kernel(x.device, dtype)
            and (fc1_inputs is not None or recompute_for(x) is Recompute.NONE)):
        out, flat = phi_mlp.one_node(compressors, xs, first, n, cfg.cmp_stride)
        if fc1_inputs is not None and flat is not None:
            fc1_inputs.append(flat)
        return out
    w1, pos, b1, w2, b2 = _stacked(compressors, dtype, "fc1.weight", "pos", "fc1.bias", "fc2.weight", "fc2.bias")
    if fc1_inputs is not None:
        flat = fc1_input(cfg, xs, first)
        fc1_inputs.append(flat)
        hidden = _hidden(flat, n, w1, pos, b1)
    elif recompute_for(x) is Recompute.RECIPES:
        hidden = checkpoint(_hidden_of, cfg, xs, first, n, w1, pos, b1, use_reentrant=False, preserve_rng_state=False)
    else:
        hidden = _hidden_of(cfg, xs, first, n, w1, pos, b1)
    return list(phi_mlp.fc2(hidden, w2, b2).unbind(0))


def blocks_in(cfg: NSAConfig, T: int, first: int = 0) -> int:
    """Compressed tokens from block ``first`` of a stream of T tokens (blocks that fit whole)."""
    l, d = cfg.cmp_block, cfg.cmp_stride
    return max(0, (T - l) // d + 1 - first) if T >= l else 0


def unfold_blocks(cfg: NSAConfig, x: torch.Tensor, first: int = 0) -> torch.Tensor:
    """[B, n, H, K, l] windows of l tokens every d tokens of x [B, T, H, K] from block ``first``
    (a view of x; n = ``blocks_in``, at least one)."""
    return x[:, first * cfg.cmp_stride :].unfold(1, cfg.cmp_block, cfg.cmp_stride)


def fc1_input(cfg: NSAConfig, xs: Sequence[torch.Tensor], first: int = 0) -> torch.Tensor:
    """What the MLP's first matmul reads for blocks ``first``.. of the streams xs [B, T, H, K]
    (at least one block): their chunks of d tokens, stacked [len(xs), B, n + r - 1, H, d*K].
    The stride divides the block (l = r*d, NSAConfig checks it), so block i is chunks i..i+r-1,
    and fc1(flatten(block + pos)) is sum_q W1_q chunk_{i+q} + (W1 flatten(pos) + b1), W1_q the
    q-th d*K columns of W1: each token is read once, and the blocks, which hold each token r
    times, are never built."""
    l, d = cfg.cmp_block, cfg.cmp_stride
    T = xs[0].shape[1]
    m = blocks_in(cfg, T, first) + l // d - 1
    start, end = first * d, (first + m) * d
    views = [(t if (start, end) == (0, T) else t[:, start:end]).unflatten(1, (m, d)).transpose(2, 3) for t in xs]
    return torch.stack(views).flatten(-2)


def _stacked(compressors: Sequence[Compressor], dtype: torch.dtype, *names: str) -> list[torch.Tensor]:
    """The named parameters of every compressor, each stacked [len(compressors), ...] in dtype
    (phi_mlp.stack)."""
    return phi_mlp.stack([attrgetter(name)(c) for name in names for c in compressors], len(compressors), dtype)


def _hidden(flat: torch.Tensor, n: int, w1: torch.Tensor, pos: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """silu(fc1(flatten(block + pos))) [G, B, n, H, K_out] of the n blocks whose fc1 input is
    ``flat`` (``fc1_input``'s), from the G compressors' stacked fc1 parameters."""
    return F.silu(phi_mlp.pre_activation(flat, n, w1, pos, b1))


def _hidden_of(cfg: NSAConfig, xs: Sequence[torch.Tensor], first: int, n: int, *fc1_params: torch.Tensor
               ) -> torch.Tensor:
    """``_hidden`` from the streams themselves: what a checkpoint makes again, fc1's input with it."""
    return _hidden(fc1_input(cfg, xs, first), n, *fc1_params)
