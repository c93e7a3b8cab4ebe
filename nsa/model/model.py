"""NSATransformer: a LLaMA-style decoder (RMSNorm, RoPE, SwiGLU) with NSA attention, or with dense
causal attention of the same shape (model.attn.kind=dense: the baseline, trained by the same
trainer under the same contract).

Single-device code only: parallelism and activation checkpointing are applied by the trainer
(nsa/train), which wraps the blocks in ``model.layers``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import NSAAttention, NSACache
from ..attention.dense import DenseAttention
from ..attention.rope import table_dtype
from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def reset_parameters(self) -> None:
        self.gate_up.reset_parameters()
        self.down.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        kind = NSAAttention if cfg.attn.kind == "nsa" else DenseAttention
        self.attn = kind(cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.attn, cfg.rope_theta)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.dim, cfg.ffn_hidden)
        self.dropout = cfg.dropout

    def reset_parameters(self) -> None:
        for module in (self.attn_norm, self.attn, self.ffn_norm, self.ffn):
            module.reset_parameters()

    def forward(self, x: torch.Tensor, cache: NSACache | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self._drop(self.attn(self.attn_norm(x), cache, rope))
        return x + self._drop(self.ffn(self.ffn_norm(x)))

    def _drop(self, h: torch.Tensor) -> torch.Tensor:
        # no dropout call at 0: the default model draws nothing from the RNG
        return F.dropout(h, self.dropout, self.training) if self.dropout else h


class NSATransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """Every parameter and buffer as the constructor sets them, drawn from the RNG in the
        constructor's order: a model built on the meta device (``with torch.device("meta")``),
        materialised with ``to_empty`` and reset so is the model built directly under the same
        seed, on the same device. Tied embeddings are tied again: ``to_empty`` unties them."""
        if self.cfg.tie_embeddings and self.head.weight is not self.embed.weight:
            self.head.weight = self.embed.weight
        for module in (self.embed, *self.layers, self.norm, self.head):
            module.reset_parameters()
        self._init_weights()

    def _init_weights(self) -> None:
        """The model's own initialisation over the modules' defaults. With tied embeddings (after
        the constructor) the head's weight is the embedding's: its draw, which the constructor
        made into a tensor of its own before tying, goes to a scratch tensor, so that the draws
        after it and the embedding's values are the constructor's."""
        std = self.cfg.init_std
        seen: set[int] = set()
        for name, p in self.named_parameters(remove_duplicate=False):
            if name.endswith("norm.weight"):
                continue
            if p.dim() >= 2 and "compress" not in name:
                nn.init.normal_(torch.empty_like(p) if id(p) in seen else p, mean=0.0, std=std)
            seen.add(id(p))
        # scale residual outputs by depth (GPT-2 style) so the residual stream starts small
        for block in self.layers:
            for lin in (block.attn.o_proj, block.ffn.down):
                nn.init.normal_(lin.weight, mean=0.0, std=std / (2 * self.cfg.n_layers) ** 0.5)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, caches: list[NSACache] | None = None) -> torch.Tensor:
        """idx [B, T] token ids -> logits [B, T, vocab]. With ``caches`` (one per layer, from
        ``new_caches``), idx holds the positions after the cached ones."""
        x = self.embed(idx)
        # RoPE tables once for all layers, in the dtype apply_rope computes in
        start = caches[0].length if caches else 0
        attn = self.layers[0].attn if len(self.layers) else None
        rope = None
        if attn is not None:
            rope = attn.rope(start, idx.shape[1], idx.device, table_dtype(x.dtype))
        for i, layer in enumerate(self.layers):
            x = layer(x, None if caches is None else caches[i], rope)
        return self.head(self.norm(x))

    def new_caches(self) -> list[NSACache]:
        return [NSACache() for _ in self.layers]
