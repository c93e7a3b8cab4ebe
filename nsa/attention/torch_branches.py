"""Vectorised PyTorch implementation of the three NSA branches (the portable backend).

Every function takes a run of queries at absolute positions q_start .. q_start + Tq - 1 and the
keys of positions 0 .. Tk - 1 (Tk >= q_start + Tq; later keys are ignored), so prefill
(q_start = 0) and decode (Tq = 1) share one code path. There is no Python loop over positions
or heads: queries are processed in chunks so that memory stays linear in S for the selected and
window branches (no S x S mask is ever built); the compressed branch is S x S/d by design.

Shapes: q [B, Tq, HQ, K]; per-token k/v [B, Tk, H, K]; compressed kc/vc [B, Nc, H, K];
selected block indices idx [B, Tq, H, n] (ascending, -1 padded); G = HQ // H.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import NSAConfig

# Elements of the gathered selected keys held at once; bounds the selected branch's memory.
_SEL_GATHER_BUDGET = 1 << 25


def visible_compressed(positions: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """How many compressed tokens each query position sees: i visible iff i*d + l - 1 <= t."""
    return torch.where(
        positions + 1 >= cfg.cmp_block,
        torch.div(positions + 1 - cfg.cmp_block, cfg.cmp_stride, rounding_mode="floor") + 1,
        torch.zeros_like(positions),
    )


def overlap_kernel(cfg: NSAConfig, device=None, dtype=torch.float32) -> torch.Tensor:
    """Weights w[m] = overlap / d of compressed block i = j*r + m - (l/d - 1) with selection
    block j, r = l'/d. For l=32, d=16, l'=64 this is [1, 2, 2, 2, 1]."""
    l, d, ls = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block
    offsets = range(-(l // d - 1), ls // d)
    w = [max(0, min(o * d + l, ls) - max(o * d, 0)) // d for o in offsets]
    return torch.tensor(w, device=device, dtype=dtype)


def _grouped(q: torch.Tensor, H: int) -> torch.Tensor:
    B, Tq, HQ, K = q.shape
    return q.view(B, Tq, H, HQ // H, K)


def _chunks(Tq: int, size: int):
    """The query ranges [a, b) of at most ``size`` queries. One range when all fit, decided by a
    comparison, so that a symbolic length of torch.compile stays symbolic (a range over it would
    fix the compiled graph to one length: a recompilation per length)."""
    if Tq <= size:
        yield 0, Tq
        return
    for s in range(0, Tq, size):
        yield s, min(Tq, s + size)


def _cmp_scores(q: torch.Tensor, kc: torch.Tensor, q_start: int, cfg: NSAConfig):
    """Scaled scores [B, Tq, H, G, Nc] and the visibility mask [Tq, Nc]."""
    B, Tq, HQ, K = q.shape
    H = kc.shape[2]
    pos = torch.arange(q_start, q_start + Tq, device=q.device)
    nvis = visible_compressed(pos, cfg)
    visible = torch.arange(kc.shape[1], device=q.device)[None, :] < nvis[:, None]
    s = torch.einsum("bthgk,bnhk->bthgn", _grouped(q, H), kc) / math.sqrt(K)
    return s, visible


def torch_cmp_attention(q, kc, vc, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """Compressed branch. Returns o [B, Tq, HQ, K] and lse [B, Tq, HQ] (float32, -inf where a
    query sees no compressed token; its output is zero, not NaN)."""
    B, Tq, HQ, K = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)  # lse keeps float64 in the oracle tests
    outs, lses = [], []
    for a, b in _chunks(Tq, chunk or cfg.query_chunk):
        s, visible = _cmp_scores(q[:, a:b], kc, q_start + a, cfg)
        s = s.masked_fill(~visible[None, :, None, None, :], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # -inf rows: no visible token
        p = torch.exp(s - lse.unsqueeze(-1).clamp_min(torch.finfo(s.dtype).min))
        p = p.masked_fill(~visible[None, :, None, None, :], 0.0)
        o = torch.einsum("bthgn,bnhk->bthgk", p, vc)
        outs.append(o.reshape(B, b - a, HQ, K))
        lses.append(lse.reshape(B, b - a, HQ).to(acc))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def _block_scores(q, kc, lse, cfg: NSAConfig, q_start: int, n_blocks: int) -> torch.Tensor:
    """p_cmp over the visible compressed tokens (from lse), summed over each KV group's heads and
    mapped onto the first n_blocks selection blocks by overlap weight: [B, Tq, H, n_blocks], in
    q's accumulation dtype, nothing forced or masked."""
    B, Tq, HQ, K = q.shape
    H = kc.shape[2]
    l, d, ls = cfg.cmp_block, cfg.cmp_stride, cfg.sel_block
    r, left = ls // d, l // d - 1
    acc = torch.promote_types(q.dtype, torch.float32)
    w = overlap_kernel(cfg, q.device, acc)
    s, visible = _cmp_scores(q.to(acc), kc.to(acc), q_start, cfg)
    lse_c = lse.reshape(B, Tq, H, HQ // H).to(acc)
    p = torch.exp(s - lse_c.unsqueeze(-1).clamp_min(-1e30))
    p = p.masked_fill(~visible[None, :, None, None, :], 0.0).sum(dim=3)  # [B, t, H, Nc]
    need = (n_blocks - 1) * r + len(w)
    p = F.pad(p, (left, max(0, need - left - p.shape[-1])))[..., :need]
    return p.unfold(-1, len(w), r) @ w


def _forced_and_visible(pos: torch.Tensor, n_blocks: int, cfg: NSAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[t, n_blocks] masks: the blocks every query takes (0, its own, the one before) and the blocks
    it may see (up to its own)."""
    jt = torch.div(pos, cfg.sel_block, rounding_mode="floor")[:, None]
    j = torch.arange(n_blocks, device=pos.device)[None, :]
    return (j == 0) | (j == jt) | (j == jt - 1), j <= jt


@torch.no_grad()
def torch_select_blocks(q, kc, lse, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """Importance scores -> selected block indices [B, Tq, H, n] (int64, ascending, -1 padded).

    p_cmp over visible compressed tokens (from lse), summed over the G heads of each KV group,
    mapped onto selection blocks by overlap weight; block 0 and the two most recent blocks are
    forced; ties go to the lower block index. Selection is discrete: no gradient flows here."""
    Tq = q.shape[1]
    n = cfg.n_selected
    n_blocks = (q_start + Tq + cfg.sel_block - 1) // cfg.sel_block
    out = []
    for a, b in _chunks(Tq, chunk or cfg.query_chunk):
        scores = _block_scores(q[:, a:b], kc, lse[:, a:b], cfg, q_start + a, n_blocks)
        pos = torch.arange(q_start + a, q_start + b, device=q.device)
        forced, visible = _forced_and_visible(pos, n_blocks, cfg)
        scores = scores.masked_fill(forced[None, :, None, :], float("inf"))
        scores = scores.masked_fill(~visible[None, :, None, :], float("-inf"))
        order = torch.sort(scores, dim=-1, descending=True, stable=True)
        take = min(n, n_blocks)
        idx = order.indices[..., :take]
        idx = idx.masked_fill(order.values[..., :take] == float("-inf"), n_blocks)
        idx = torch.sort(idx, dim=-1).values
        idx = idx.masked_fill(idx == n_blocks, -1)
        if take < n:
            idx = F.pad(idx, (0, n - take), value=-1)
        out.append(idx)
    return torch.cat(out, dim=1)


@torch.no_grad()
def selection_regret(q, kc, lse, idx, cfg: NSAConfig, q_start: int = 0) -> torch.Tensor:
    """[B, Tq, H] float64: by how much the best visible block that ``idx`` passed over beats the
    worst block it chose, in exact (float64) scores, as a fraction of the row's top score (the
    forced blocks aside; <= 0 where the choice is the exact top-n)."""
    Tq = q.shape[1]
    n_blocks = (q_start + Tq + cfg.sel_block - 1) // cfg.sel_block
    scores = _block_scores(q.double(), kc.double(), lse.double(), cfg, q_start, n_blocks)
    forced, visible = _forced_and_visible(torch.arange(q_start, q_start + Tq, device=q.device), n_blocks, cfg)
    free = (visible & ~forced)[None, :, None, :]
    chosen = torch.zeros_like(scores, dtype=torch.bool)
    idx = idx.to(q.device)
    chosen.scatter_(-1, idx.clamp_min(0), idx >= 0)
    lowest_chosen = scores.masked_fill(~(free & chosen), float("inf")).amin(-1)
    highest_passed = scores.masked_fill(~(free & ~chosen), float("-inf")).amax(-1)
    top = scores.masked_fill(~free, float("-inf")).amax(-1)
    regret = ((highest_passed - lowest_chosen) / top).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    short = (chosen.sum(-1) < min(cfg.n_selected, n_blocks)) & (free & ~chosen).any(-1)
    return regret.masked_fill(short, float("inf"))


def near_tie_violations(q, kc, lse, idx, cfg: NSAConfig, q_start: int = 0, tie: float = 1e-5) -> torch.Tensor:
    """[B, Tq, H] bool: where the selection passed over a block that beats a chosen one by more
    than ``tie`` of the row's top score (selection_regret). Two blocks closer than that are a
    near-tie that rounding may order either way; anything wider is a wrong choice."""
    return selection_regret(q, kc, lse, idx, cfg, q_start) > tie


def torch_sel_attention(q, k, v, idx, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """Selected branch: each query attends to the tokens of its KV group's selected blocks,
    causally inside the block that holds it. Keys are gathered chunk by chunk."""
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    ls = cfg.sel_block
    # indices are ascending with -1 padding last: with few blocks in the sequence, most of
    # the n slots are padding and need not be gathered at all
    idx = idx[..., : min(idx.shape[-1], -(-(q_start + Tq) // ls))]
    G, n = HQ // H, idx.shape[-1]
    per_query = B * H * n * ls * K
    chunk = max(1, min(chunk or cfg.query_chunk, _SEL_GATHER_BUDGET // per_query))
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [B, H, Tk, K]
    offs = torch.arange(ls, device=q.device)
    outs = []
    for a, b in _chunks(Tq, chunk):
        c = b - a
        blk = idx[:, a:b].transpose(1, 2)  # [B, H, c, n]
        tok = (blk[..., None] * ls + offs).flatten(-2)  # [B, H, c, n*ls]
        pos = torch.arange(q_start + a, q_start + b, device=q.device)[None, None, :, None]
        valid = (blk[..., None] >= 0).expand(-1, -1, -1, -1, ls).flatten(-2) & (tok <= pos)
        gather = tok.clamp(0, Tk - 1).reshape(B, H, c * n * ls, 1).expand(-1, -1, -1, K)
        ks = torch.gather(kt, 2, gather).view(B, H, c, n * ls, K)
        vs = torch.gather(vt, 2, gather).view(B, H, c, n * ls, K)
        qg = q[:, a:b].view(B, c, H, G, K).transpose(1, 2)  # [B, H, c, G, K]
        s = torch.einsum("bhcgk,bhcsk->bhcgs", qg, ks) / math.sqrt(K)
        s = s.masked_fill(~valid[:, :, :, None, :], float("-inf"))
        o = torch.einsum("bhcgs,bhcsk->bhcgk", torch.softmax(s, dim=-1), vs)
        outs.append(o.transpose(1, 2).reshape(B, c, HQ, K))
    return torch.cat(outs, dim=1)


def torch_win_attention(q, k, v, cfg: NSAConfig, q_start: int = 0, chunk: int | None = None):
    """Window branch: query t attends to keys (t - w, t]. Each chunk of queries sees only the
    keys its window can reach, so memory is O(S * (chunk + w))."""
    B, Tq, HQ, K = q.shape
    H, w = k.shape[2], cfg.window
    outs = []
    for a, b in _chunks(Tq, chunk or max(cfg.query_chunk, 1)):
        p0, p1 = q_start + a, q_start + b
        k0 = max(0, p0 - w + 1)
        qpos = torch.arange(p0, p1, device=q.device)[:, None]
        kpos = torch.arange(k0, p1, device=q.device)[None, :]
        mask = (kpos <= qpos) & (kpos > qpos - w)
        qg = q[:, a:b].view(B, b - a, H, HQ // H, K)
        s = torch.einsum("bthgk,bshk->bthgs", qg, k[:, k0:p1]) / math.sqrt(K)
        s = s.masked_fill(~mask[None, :, None, None, :], float("-inf"))
        o = torch.einsum("bthgs,bshk->bthgk", torch.softmax(s, dim=-1), v[:, k0:p1])
        outs.append(o.reshape(B, b - a, HQ, K))
    return torch.cat(outs, dim=1)
