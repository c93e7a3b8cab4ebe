"""phi: the compression of l consecutive keys (or values) into one compressed token.

Compressed token i summarises positions [i*d, i*d + l). 'mlp' is the paper's learnable phi (an
MLP over the flattened block plus a learned intra-block position embedding), shared by the KV
heads; 'mean' is mean pooling (no parameters).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .autograd_state import func_transform_active
from .config import NSAConfig


#: from this many tokens (batch x length) an NSA layer's training forward recomputes in the
#: backward what it can make again from tensors kept anyway, instead of keeping it: here fc1's
#: input (every token l/d times, from the per-token keys); in NSAAttention q, the key/value
#: streams, the window branch's output and the output projection's input (nsa.attention.remade).
#: Activation memory counts at long context; below it the recomputation's kernel launches would
#: cost more host time than its memory is worth
RECOMPUTE_TOKENS = 32768


def recompute_applies(x: torch.Tensor) -> bool:
    """Whether a forward on x [B, T, ...] recomputes in the backward (see RECOMPUTE_TOKENS): with
    gradients, eagerly, and outside torch.func transforms, which take no saved-tensor hooks."""
    return (x.shape[0] * x.shape[1] >= RECOMPUTE_TOKENS and torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and not func_transform_active())


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

    def forward(self, x: torch.Tensor, first: int = 0) -> torch.Tensor:
        """x [B, T, H, K] per-token keys/values at positions 0..T-1 -> compressed tokens
        [B, Nc - first, H, K] for blocks first..Nc-1 (Nc blocks fit entirely in T)."""
        l, d = self.cfg.cmp_block, self.cfg.cmp_stride
        B, T, H, K = x.shape
        if T < l or (T - l) // d + 1 <= first:
            return x.new_zeros(B, 0, H, K)
        # [B, Nc, H, K, l] windows of l tokens every d tokens, starting at block `first`
        blocks = x[:, first * d :].unfold(1, l, d)
        if self.kind == "mean":
            return blocks.mean(dim=-1)
        if recompute_applies(x):
            hidden = checkpoint(self._hidden, blocks, use_reentrant=False, preserve_rng_state=False)
        else:
            hidden = self._hidden(blocks)
        return self.fc2(hidden)

    def _hidden(self, blocks: torch.Tensor) -> torch.Tensor:
        """silu(fc1(the flattened block + pos)) of windows [B, Nc, H, K, l]."""
        blocks = blocks.permute(0, 1, 2, 4, 3) + self.pos.to(blocks.dtype)  # [B, Nc, H, l, K]
        return F.silu(self.fc1(blocks.flatten(-2)))
