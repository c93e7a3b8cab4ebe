"""phi: the compression of l consecutive keys (or values) into one compressed token.

Compressed token i summarises positions [i*d, i*d + l). 'mlp' is the paper's learnable phi (an
MLP over the flattened block plus a learned intra-block position embedding), shared by the KV
heads; 'mean' is mean pooling (no parameters).
"""
from __future__ import annotations

from enum import Enum

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .autograd_state import func_transform_active
from .config import NSAConfig


#: from this many tokens (batch x length) an NSA layer's training forward recomputes in the
#: backward what it can make again from tensors kept anyway, instead of keeping it: here fc1's
#: input (every token l/d times, from the per-token keys); in NSAAttention also q, the key/value
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
    def __init__(self, head_dim: int, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg
        self.kind = cfg.phi
        if self.kind == "mlp":
            l = cfg.cmp_block
            self.pos = nn.Parameter(torch.zeros(l, head_dim))
            self.fc1 = nn.Linear(l * head_dim, head_dim)
            self.fc2 = nn.Linear(head_dim, head_dim)

    def phi_params(self) -> dict | None:
        """The parameters in the oracle's layout (see reference.reference_phi)."""
        if self.kind != "mlp":
            return None
        return {"pos": self.pos, "w1": self.fc1.weight, "b1": self.fc1.bias,
                "w2": self.fc2.weight, "b2": self.fc2.bias}

    def forward(self, x: torch.Tensor, first: int = 0, fc1_inputs: list[torch.Tensor] | None = None
                ) -> torch.Tensor:
        """x [B, T, H, K] per-token keys/values at positions 0..T-1 -> compressed tokens
        [B, Nc - first, H, K] for blocks first..Nc-1 (Nc blocks fit entirely in T).
        ``fc1_inputs``: a caller that keeps how to make x again (NSAAttention's recipes) gets
        fc1's input appended to it, to make it again from x with ``fc1_input``; otherwise, where an
        eager forward recomputes (Recompute.RECIPES), fc1 runs under checkpointing, so that its
        input is not kept; a traced forward's recomputation is its caller's."""
        blocks = self.blocks(x, first)
        if blocks is None:
            return x.new_zeros(x.shape[0], 0, *x.shape[2:])
        if self.kind == "mean":
            return blocks.mean(dim=-1)
        if fc1_inputs is not None:
            flat = self.fc1_input(blocks)
            fc1_inputs.append(flat)
            hidden = F.silu(self.fc1(flat))
        elif recompute_for(x) is Recompute.RECIPES:
            hidden = checkpoint(self._hidden, blocks, use_reentrant=False, preserve_rng_state=False)
        else:
            hidden = self._hidden(blocks)
        return self.fc2(hidden)

    def blocks(self, x: torch.Tensor, first: int = 0) -> torch.Tensor | None:
        """[B, Nc - first, H, K, l] windows of l tokens every d tokens of x [B, T, H, K], from block
        ``first`` (a view of x), or None where no block from ``first`` fits in T."""
        l, d = self.cfg.cmp_block, self.cfg.cmp_stride
        T = x.shape[1]
        if T < l or (T - l) // d + 1 <= first:
            return None
        return x[:, first * d :].unfold(1, l, d)

    def fc1_input(self, blocks: torch.Tensor) -> torch.Tensor:
        """The flattened blocks + pos [B, Nc, H, l*K] of windows [B, Nc, H, K, l]."""
        return (blocks.permute(0, 1, 2, 4, 3) + self.pos.to(blocks.dtype)).flatten(-2)

    def _hidden(self, blocks: torch.Tensor) -> torch.Tensor:
        """silu(fc1(fc1_input(blocks)))."""
        return F.silu(self.fc1(self.fc1_input(blocks)))
