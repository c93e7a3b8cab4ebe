"""The float64 oracle of NSA: one query token at a time, written for clarity, not speed.

It is the judge of every faster path (the vectorised PyTorch branches, the Triton kernels,
decode). It takes what the module has already projected (rotated q and per-branch k/v, the
gates, the compression parameters) and applies the semantics of docs/design.md directly:

* compressed token i summarises positions [i*d, i*d + l) and is visible to query t only when
  i*d + l - 1 <= t; a query with no visible compressed token gets a zero compressed output;
* importance p_cmp is the softmax of q_t over the *visible* compressed keys; selection block j
  ([j*l', (j+1)*l')) scores sum_i overlap(i, j) / d * p_cmp[i], summed over the query heads of
  the KV group so the whole group shares one selection;
* the selection is the top-n visible blocks (ties: lower block index first), always including
  block 0 and the two most recent blocks; with n or fewer visible blocks all are used; inside
  the block holding t attention is causal;
* the window is (t - w, t];
* o_t = g_cmp * o_cmp + g_sel * o_sel + g_win * o_win, gates per query head.

Shapes: B batch, T tokens, HQ query heads, H KV heads, G = HQ // H, K head dim,
Nc compressed tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import NSAConfig


def num_compressed(T: int, cfg: NSAConfig) -> int:
    """Compressed tokens that fit in T positions: blocks [i*d, i*d + l) with i*d + l <= T."""
    return 0 if T < cfg.cmp_block else (T - cfg.cmp_block) // cfg.cmp_stride + 1


def overlap_weight(i: int, j: int, cfg: NSAConfig) -> int:
    """Overlap in tokens of compressed block i with selection block j, divided by d."""
    lo = max(i * cfg.cmp_stride, j * cfg.sel_block)
    hi = min(i * cfg.cmp_stride + cfg.cmp_block, (j + 1) * cfg.sel_block)
    return max(0, hi - lo) // cfg.cmp_stride


def reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate pairs (x[2m], x[2m+1]) by positions * theta^(-2m/K). x: [B, T, H, K] with T
    matching positions; frequencies depend on the head dim K only."""
    K = x.shape[-1]
    out = torch.empty_like(x)
    for t, pos in enumerate(positions.tolist()):
        for m in range(K // 2):
            ang = pos * theta ** (-2 * m / K)
            c, s = math.cos(ang), math.sin(ang)
            x1, x2 = x[:, t, :, 2 * m], x[:, t, :, 2 * m + 1]
            out[:, t, :, 2 * m] = x1 * c - x2 * s
            out[:, t, :, 2 * m + 1] = x1 * s + x2 * c
    return out


def reference_phi(block: torch.Tensor, phi_params: dict | None, cfg: NSAConfig) -> torch.Tensor:
    """Summarise one block [l, K] into [K].

    'mean': the average token. 'mlp': W2 silu(W1 flatten(block + pos) + b1) + b2 with the
    learned intra-block position embedding pos [l, K] (nn.Linear layouts: W1 [hidden, l*K])."""
    if cfg.phi == "mean":
        return block.mean(dim=0)
    p = phi_params
    flat = (block + p["pos"]).reshape(-1)
    hidden = F.silu(p["w1"] @ flat + p["b1"])
    return p["w2"] @ hidden + p["b2"]


def reference_compress(x: torch.Tensor, phi_params: dict | None, cfg: NSAConfig) -> torch.Tensor:
    """x: [B, T, H, K] per-token keys or values -> [B, Nc, H, K] compressed tokens."""
    B, T, H, K = x.shape
    Nc = num_compressed(T, cfg)
    out = x.new_zeros(B, Nc, H, K)
    for b in range(B):
        for h in range(H):
            for i in range(Nc):
                s = i * cfg.cmp_stride
                out[b, i, h] = reference_phi(x[b, s : s + cfg.cmp_block, h], phi_params, cfg)
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Softmax attention of one query [K] over rows of keys/values [N, K]."""
    if keys.shape[0] == 0:
        return torch.zeros_like(q)
    scores = keys @ q / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=0) @ values


def reference_select(scores: list[float], t: int, cfg: NSAConfig) -> list[int]:
    """Selected block indices (ascending) for query position t given block scores."""
    n_visible = t // cfg.sel_block + 1
    if n_visible <= cfg.n_selected:
        return list(range(n_visible))
    jt = t // cfg.sel_block
    forced = {0, jt, jt - 1}
    rest = sorted((j for j in range(n_visible) if j not in forced), key=lambda j: (-scores[j], j))
    return sorted(forced | set(rest[: cfg.n_selected - len(forced)]))


@dataclass
class ReferenceOutput:
    o: torch.Tensor
    """[B, T, HQ, K] gated sum of the branches."""
    o_cmp: torch.Tensor
    o_sel: torch.Tensor
    o_win: torch.Tensor
    selected: list
    """selected[b][t][h]: ascending list of selected block indices of KV head h."""


def reference_nsa(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_sel: torch.Tensor,
    v_sel: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    gates: torch.Tensor,
    cfg: NSAConfig,
    phi_k: dict | None = None,
    phi_v: dict | None = None,
) -> ReferenceOutput:
    """NSA prefill over positions 0..T-1.

    q [B, T, HQ, K]; k_*/v_* [B, T, H, K] per branch (k_cmp/v_cmp are per-token, compressed
    here with phi_k/phi_v); gates [B, T, HQ, 3] in (cmp, sel, win) order, already in (0, 1).
    """
    B, T, HQ, K = q.shape
    H = k_sel.shape[2]
    G = HQ // H
    kc = reference_compress(k_cmp, phi_k, cfg)
    vc = reference_compress(v_cmp, phi_v, cfg)
    Nc = kc.shape[1]
    o_cmp = torch.zeros_like(q)
    o_sel = torch.zeros_like(q)
    o_win = torch.zeros_like(q)
    selected = [[[None] * H for _ in range(T)] for _ in range(B)]
    n_blocks = (T + cfg.sel_block - 1) // cfg.sel_block
    for b in range(B):
        for t in range(T):
            visible = [i for i in range(Nc) if i * cfg.cmp_stride + cfg.cmp_block - 1 <= t]
            for h in range(H):
                group_scores = [0.0] * n_blocks
                for hq in range(h * G, (h + 1) * G):
                    qv = q[b, t, hq]
                    keys, vals = kc[b, visible, h], vc[b, visible, h]
                    o_cmp[b, t, hq] = _attend(qv, keys, vals)
                    if visible:
                        p_cmp = torch.softmax(keys @ qv / math.sqrt(K), dim=0).detach()
                        for j in range(n_blocks):
                            for pos, i in enumerate(visible):
                                w = overlap_weight(i, j, cfg)
                                if w:
                                    group_scores[j] += w * float(p_cmp[pos])
                blocks = reference_select(group_scores, t, cfg)
                selected[b][t][h] = blocks
                sel_pos = [
                    p
                    for j in blocks
                    for p in range(j * cfg.sel_block, (j + 1) * cfg.sel_block)
                    if p <= t
                ]
                win_pos = list(range(max(0, t - cfg.window + 1), t + 1))
                for hq in range(h * G, (h + 1) * G):
                    qv = q[b, t, hq]
                    o_sel[b, t, hq] = _attend(qv, k_sel[b, sel_pos, h], v_sel[b, sel_pos, h])
                    o_win[b, t, hq] = _attend(qv, k_win[b, win_pos, h], v_win[b, win_pos, h])
    o = gates[..., 0:1] * o_cmp + gates[..., 1:2] * o_sel + gates[..., 2:3] * o_win
    return ReferenceOutput(o, o_cmp, o_sel, o_win, selected)
