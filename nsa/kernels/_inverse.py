"""The inverse of a selection: for each (batch, KV head, key block), the query tokens that
selected it, as work items of at most qc tokens. The selected branch's key-block-major passes
run on them: the dk/dv pass of the backward (nsa.kernels.selection) and the block-major forward
(nsa.kernels.selection_blocks).

Shapes: idx [B, Tq, H, n] (ascending, -1 padded) of blocks of ls keys over Tk keys.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


@triton.jit
def _selection_keys_kernel(idx, keys, Tq, total, NB, NSEG, H: tl.constexpr, N: tl.constexpr,
                           BLOCK: tl.constexpr):
    """keys[e] = (b*H + h)*NB + block, the segment of entry e = ((b*Tq + t)*H + h)*N + slot of
    idx; padding (-1) gets NSEG = B*H*NB, above every segment. The entries of a segment come in
    ascending t, so a stable sort lists each segment's tokens in ascending order."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < total
    blk = tl.load(idx + e, mask=m, other=-1)
    h = (e // N) % H
    b = e // (N * H * Tq)
    key = tl.where(blk >= 0, (b * H + h) * NB + blk, NSEG)
    tl.store(keys + e, key.to(keys.dtype.element_ty), mask=m)


@triton.jit
def _lower_bound(keys, n_keys, target, STEPS: tl.constexpr):
    """First index i of the ascending keys[0:n_keys] with keys[i] >= target (per lane)."""
    lo = target * 0
    hi = lo + n_keys
    for _ in range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        kv = tl.load(keys + mid, mask=active & (mid < n_keys), other=0)
        right = active & (kv < target)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _work_items_kernel(keys_sorted, n_keys, item_seg, item_start, item_end, NB, IPB,
                       QC: tl.constexpr, NBP: tl.constexpr, STEPS: tl.constexpr, BW: tl.constexpr):
    """One program per (b, h): its NB segments' bounds in the sorted keys (binary search), cut
    into work items of at most QC tokens, written to the program's IPB item slots
    [bh * IPB, (bh + 1) * IPB) in segment order; the slots left over get empty items."""
    bh = tl.program_id(0)
    j = tl.arange(0, NBP)
    jm = j < NB
    seg = bh * NB + j
    start = _lower_bound(keys_sorted, n_keys, seg, STEPS)
    end = _lower_bound(keys_sorted, n_keys, seg + 1, STEPS)
    chunks = tl.where(jm, (end - start + QC - 1) // QC, 0)
    first = tl.cumsum(chunks, 0) - chunks  # the segment's first item within the program
    base = bh.to(tl.int64) * IPB
    for c in range(0, tl.max(chunks, 0)):
        m = c < chunks
        w = base + first + c
        s0 = start + c * QC
        tl.store(item_seg + w, seg, mask=m)
        tl.store(item_start + w, s0.to(tl.int32), mask=m)
        tl.store(item_end + w, tl.minimum(s0 + QC, end).to(tl.int32), mask=m)
    for w0 in range(tl.sum(chunks, 0), IPB, BW):
        w = w0 + tl.arange(0, BW)
        m = w < IPB
        tl.store(item_seg + base + w, 0, mask=m)
        tl.store(item_start + base + w, 0, mask=m)
        tl.store(item_end + base + w, 0, mask=m)


@triton.jit
def item_rows(tokens, r0, s1, G: tl.constexpr, ROWS: tl.constexpr):
    """ROWS rows of a work item from row r0, in the items' order: row r0 + i is head g of the
    item's sorted entry u, (u, g) = ((r0 + i) // G, (r0 + i) % G), G rows a token, no padding.
    Returns the rows' mask (u below the item's end s1), u, g and the entry's token t (tokens[u]:
    its index in the tokens of the idx the inverse selection was made from)."""
    rho = r0 + tl.arange(0, ROWS)
    rmask = rho < s1 * G
    u = rho // G
    t = tl.load(tokens + u, mask=rmask, other=0)
    return rmask, u, rho % G, t


@triton.jit
def item_block(k, v, seg, Tk, NB, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, LS: tl.constexpr,
               BS: tl.constexpr):
    """The key block of a work item of segment seg = (b * H + h) * NB + j: block j of l' = LS
    keys of KV head h of batch b in k and v [B, Tk, H, K], loaded once, [BS, BK] each (zeros
    past Tk and past K). Returns b, h, the block's lanes offs and their key positions kpos and
    validity kval, the head-dim lanes offk and their mask, the block's int64 base in k and v,
    and its keys and values."""
    bh = seg // NB
    j = seg % NB
    b = bh // H
    h = bh % H
    offs = tl.arange(0, BS)
    kpos = j * LS + offs
    kval = (offs < LS) & (kpos < Tk)
    offk = tl.arange(0, BK)
    kmask = offk < K
    kv_base = (b.to(tl.int64) * Tk * H + h) * K + j.to(tl.int64) * LS * (H * K)
    kv_off = offs[:, None] * (H * K) + offk[None, :]  # int32 within the block
    kvm = kval[:, None] & kmask[None, :]
    kt = tl.load(k + kv_base + kv_off, mask=kvm, other=0.0)
    vt = tl.load(v + kv_base + kv_off, mask=kvm, other=0.0)
    return b, h, offs, kpos, kval, offk, kmask, kv_base, kt, vt


@triton.jit
def _sorted_tokens_kernel(perm, tokens, total, Tq, HN, BLOCK: tl.constexpr):
    """tokens[u] = t of the idx entry perm[u] = ((b*Tq + t)*H + h)*N + slot (HN = H*N), int32."""
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = u < total
    e = tl.load(perm + u, mask=m, other=0)
    tl.store(tokens + u, ((e // HN) % Tq).to(tl.int32), mask=m)


class Inverse(NamedTuple):
    """An inverse selection (see inverse_selection)."""
    tokens: torch.Tensor  # the token of each sorted idx entry (int32)
    perm: torch.Tensor  # the idx entry each sorted entry came from (int64)
    items: torch.Tensor  # [3, n_items] int32: per work item its segment and the [start, end) of entries it owns
    NB: int  # key blocks


def key_dtype(idx_shape: tuple[int, ...], NB: int) -> torch.dtype:
    """The keys' dtype: int16 while every segment and the padding's key, B*H*NB, fit (the sort then
    takes two 8-bit radix passes instead of four), else int32."""
    B, _, H, _ = idx_shape
    return torch.int16 if B * H * NB < 2**15 else torch.int32


def n_items(idx_shape: tuple[int, ...], NB: int, qc: int) -> int:
    """The work items inverse_selection lays out: B*H * (Tq*n // qc + NB), an upper bound on the
    items of at most qc tokens that the NB segments of each (b, h) need (sum of ceil(count / qc))."""
    B, Tq, H, n = idx_shape
    return B * H * (Tq * n // qc + NB)


def inverse_selection(idx: torch.Tensor, Tk: int, ls: int, qc: int) -> Inverse:
    """Work items of the key-block-major passes: tokens grouped by the (b, h, block) they selected.

    One kernel writes a key per idx entry, its segment seg = (b*H + h)*NB + block; one stable
    sort puts each segment's entries together, their tokens in ascending order; one kernel per
    (b, h) finds the segments' bounds and cuts them into items of at most qc tokens. Three
    launches, and a fourth that reads each sorted entry's token out of the idx entry it came from
    (the sort's permutation), no host sync. Returns the tokens, the idx entry each came from, per
    work item its segment and the [start, end) range of the sorted entries it owns, and NB. (The
    kernels read a row's token from the int32 tokens, not from the int64 entries: held from there
    for the stores at the entry, the entries raised the dk/dv kernel's spills at head dim 128 from
    36 to 104 bytes, sm_90.) The item count (n_items) is an upper bound known on the host; items past a
    (b, h)'s real ones are empty."""
    B, Tq, H, n = idx.shape
    NB = triton.cdiv(Tk, ls)
    total = idx.numel()
    keys = torch.empty(total, device=idx.device, dtype=key_dtype(idx.shape, NB))
    block = 1024
    _selection_keys_kernel[(triton.cdiv(total, block),)](idx, keys, Tq, total, NB, B * H * NB, H=H, N=n,
                                                           BLOCK=block)
    keys_sorted, perm = torch.sort(keys, stable=True)
    items = torch.empty(3, n_items(idx.shape, NB, qc), device=idx.device, dtype=torch.int32)
    seg, start, end = items.unbind(0)
    _work_items_kernel[(B * H,)](keys_sorted, total, seg, start, end, NB, items.shape[1] // (B * H),
                                 QC=qc, NBP=triton.next_power_of_2(NB), STEPS=total.bit_length(), BW=256)
    tokens = torch.empty(total, device=idx.device, dtype=torch.int32)
    _sorted_tokens_kernel[(triton.cdiv(total, block),)](perm, tokens, total, Tq, H * n, BLOCK=block)
    return Inverse(tokens, perm, items, NB)


def as_outputs(inverse: Inverse | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An inverse selection as a custom op's outputs (tokens, perm, items), empty tensors for none."""
    if inverse is None:
        return (torch.empty(0, device=device, dtype=torch.int32), torch.empty(0, device=device, dtype=torch.int64),
                torch.empty(3, 0, device=device, dtype=torch.int32))
    return inverse.tokens, inverse.perm, inverse.items


def fake_outputs(idx: torch.Tensor, Tk: int, ls: int, qc: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """as_outputs(inverse_selection(idx, Tk, ls, qc)) in shape and dtype only (qc = 0: none)."""
    if qc == 0:
        return as_outputs(None, idx.device)
    NB = triton.cdiv(Tk, ls)
    return (idx.new_empty(idx.numel(), dtype=torch.int32), idx.new_empty(idx.numel(), dtype=torch.int64),
            idx.new_empty(3, n_items(idx.shape, NB, qc), dtype=torch.int32))


def from_outputs(tokens: torch.Tensor, perm: torch.Tensor, items: torch.Tensor, Tk: int, ls: int) -> Inverse | None:
    """The inverse selection an op's outputs hold (see as_outputs), None for the empty ones."""
    return Inverse(tokens, perm, items, triton.cdiv(Tk, ls)) if tokens.numel() else None

