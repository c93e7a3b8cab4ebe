"""Model FLOPs per token of NSATransformer, counted from its config alone (no torch, no model).

What is counted (the convention of PaLM's MFU and Megatron's throughput numbers): matrix
products only, a [m, k] x [k, n] product being 2*m*k*n FLOPs. Per layer and token, forward:

* q and o projections; the K/V projections (NSA: one k and one v per branch, six; dense: two);
* NSA's gates (the gate projection, a linear map to 3 values per query head);
* the compression phi ('mlp': fc1 over the flattened block of l keys of one KV head, fc2; for the
  keys and for the values) over the sequence's compressed tokens, spread over its positions;
  'mean' pooling is no matrix product;
* attention, per query head and attended key: q.k (2K) and p*v (2K), over the keys the position
  actually attends (causal): compressed: the visible compressed tokens; selected: the keys of
  min(n, visible blocks) blocks, the block holding t up to t; window: min(t+1, w); dense: t+1;
* the SwiGLU FFN (gate and up: 2 * dim * hidden each, down: hidden * dim);

and once per token the LM head (dim x vocab; a tied embedding is still that product). Not counted:
elementwise work (RMSNorm, RoPE, softmax, SiLU, sigmoid, the gated sum of the branches, biases),
the embedding lookup and the selection's scoring (the overlap-weighted sum of p_cmp and the top-n:
no matrix product; p_cmp itself is the compressed branch's own softmax, counted there once).

Training is 3x forward (backward: 2x, a gradient for the input and one for the weight of every
product). These are model FLOPs: recomputation (activation checkpointing, a kernel recomputing
the importance scores for its top-n) is work the hardware does, not FLOPs of the model, and is
not counted, so MFU does not reward it. Attention terms depend on the position, so per-token
numbers are averages over the positions 0..seq_len-1 of one training sequence.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: counting needs no torch
    from .config import ModelConfig

#: forward + backward (2x forward) per forward
TRAINING_MULTIPLIER = 3


def compressed_visible(t: int, block: int, stride: int) -> int:
    """Compressed tokens visible to the query at position t: token i covers [i*d, i*d + l) and
    is visible once i*d + l - 1 <= t."""
    return (t + 1 - block) // stride + 1 if t + 1 >= block else 0


def compressed_tokens(seq_len: int, block: int, stride: int) -> int:
    """Compressed tokens phi makes of a sequence of seq_len (those that fit entirely)."""
    return compressed_visible(seq_len - 1, block, stride)


def selected_keys(t: int, sel_block: int, n_selected: int) -> int:
    """Keys the selected branch attends for the query at t: min(n, visible blocks) blocks of l',
    the block holding t (always selected) only up to t."""
    visible_blocks = t // sel_block + 1
    return (min(n_selected, visible_blocks) - 1) * sel_block + t % sel_block + 1


def window_keys(t: int, window: int) -> int:
    """Keys (t - w, t] of the sliding window."""
    return min(t + 1, window)


def dense_keys(t: int) -> int:
    """Keys 0..t of causal dense attention."""
    return t + 1


# Each count summed over the positions 0..seq_len-1 in closed form: a sum position by position
# costs minutes of set-up at long sequences (hours at 2**31) before the first step.

def _sum_floor(n: int, d: int) -> int:
    """sum of u // d for u = 0..n-1: q = n // d whole runs of d equal values 0..q-1, then r = n % d of q."""
    q, r = divmod(n, d)
    return d * q * (q - 1) // 2 + r * q


def _sum_min(n: int, c: int) -> int:
    """sum of min(c, u) for u = 0..n-1."""
    k = min(n, c)
    return k * (k - 1) // 2 + (n - k) * c


def compressed_visible_total(seq_len: int, block: int, stride: int) -> int:
    """sum of compressed_visible(t) over t < seq_len: u = t + 1 - block runs 0..seq_len - block, each
    seeing u // stride + 1 tokens."""
    n = max(seq_len - block + 1, 0)
    return n + _sum_floor(n, stride)


def selected_keys_total(seq_len: int, sel_block: int, n_selected: int) -> int:
    """sum of selected_keys(t) over t < seq_len: t % l' + 1 keys of t's own block, and l' keys of each
    of min(n - 1, t // l') earlier ones."""
    q, r = divmod(seq_len, sel_block)
    own = q * sel_block * (sel_block + 1) // 2 + r * (r + 1) // 2
    return own + sel_block * (sel_block * _sum_min(q, n_selected - 1) + r * min(n_selected - 1, q))


def window_keys_total(seq_len: int, window: int) -> int:
    """sum of window_keys(t) over t < seq_len: 1..w while the window fills, then w."""
    m = min(seq_len, window)
    return m * (m + 1) // 2 + (seq_len - m) * window


def dense_keys_total(seq_len: int) -> int:
    """sum of dense_keys(t) over t < seq_len."""
    return seq_len * (seq_len + 1) // 2


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Forward FLOPs per token of the whole model (all layers), by part, averaged over the
    positions of a sequence of ``seq_len``."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    a = cfg.attn
    D, HQ, H, K, L = cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.n_layers
    per_key = 2 * 2 * K * HQ  # q.k and p*v, every query head
    parts: dict[str, float] = {"q_proj": 2 * D * HQ * K, "o_proj": 2 * HQ * K * D}
    if a.kind == "dense":
        parts["kv_proj"] = 2 * D * 2 * H * K
        parts["attn_dense"] = per_key * dense_keys_total(seq_len) / seq_len
    else:
        parts["kv_proj"] = 2 * D * 6 * H * K
        parts["gates"] = 2 * D * 3 * HQ
        phi = 2 * (a.cmp_block * K) * K + 2 * K * K if a.phi == "mlp" else 0  # fc1, fc2 of one token, one head
        parts["compress_phi"] = 2 * H * phi * compressed_tokens(seq_len, a.cmp_block, a.cmp_stride) / seq_len
        parts["attn_cmp"] = per_key * compressed_visible_total(seq_len, a.cmp_block, a.cmp_stride) / seq_len
        parts["attn_sel"] = per_key * selected_keys_total(seq_len, a.sel_block, a.n_selected) / seq_len
        parts["attn_win"] = per_key * window_keys_total(seq_len, a.window) / seq_len
    parts["ffn"] = 2 * D * 2 * cfg.ffn_hidden + 2 * cfg.ffn_hidden * D
    out = {k: float(v * L) for k, v in parts.items()}
    out["lm_head"] = float(2 * D * cfg.vocab_size)
    return out


def training_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Model FLOPs per trained token: 3x the forward (see the module's docstring)."""
    return TRAINING_MULTIPLIER * sum(forward_flops_per_token(cfg, seq_len).values())
