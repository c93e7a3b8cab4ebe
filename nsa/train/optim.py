"""AdamW (optionally fused) with decay on matrices only, and the cosine schedule with warm-up."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR for 0-based optimizer step ``step``: linear warm-up to cfg.lr over warmup_steps (step 0
    gets lr/warmup), then cosine from cfg.lr down to lr*min_lr_ratio at the last step."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    warmup = min(cfg.warmup_steps, cfg.steps)
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_steps = cfg.steps - warmup
    if decay_steps <= 1:
        return peak
    progress = min(1.0, (step - warmup) / (decay_steps - 1))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def fused_adamw(setting: str, device: torch.device) -> bool:
    """Whether AdamW runs its fused kernel: train.fused_adamw on / off, or auto: on CUDA (see
    TrainConfig.fused_adamw)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def build_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=lr_at(0, cfg), betas=(cfg.beta1, cfg.beta2), **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
