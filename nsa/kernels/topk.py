"""Triton importance scores and top-n block selection, in two kernels.

Scores: one program owns BT consecutive query tokens of one KV group, with all G query heads of
the group as rows (padded to GP, a power of two; the rows' order puts a token's heads where
their sum costs least, see _row_roles), the tiles with the most work first. It streams the
compressed keys in chunks of BJ selection blocks (R = l'/d compressed tokens a block, padded to
RP columns), recomputes p_cmp = exp(q . kc / sqrt(K) - lse) over the visible compressed tokens
(without a mask for the chunks every row of the tile sees whole), sums it over the group's heads
and maps it onto selection blocks by overlap weight in float32: a block takes its own tokens'
overlap and the previous block's tokens' overlap past that block's end (carried from chunk to
chunk). It writes one float32 score per (token, group, block): forced blocks (0, the block
holding t and the one before) get +inf, blocks after the query's own get -1 (never chosen over
a visible block). The [S, S/d] probability matrix never reaches device memory; the
[S, H, S/l'] scores do, a query chunk at a time (TopkTuning.score_budget bounds them, so memory
stays linear in S). The unmasked loop over whole chunks and the head-major row order keep the
instructions a chunk and the head sum's shuffles few.

Select: one program owns BR rows of scores, whole rows in registers. Non-negative float32 scores
order like their bit patterns, so a binary search on the bits (31 steps) finds the n-th largest
score x; the blocks above x are taken, then the blocks equal to x by ascending index until n are
taken (a tie goes to the lower block index), and a running count (cumsum) writes them in
ascending order, -1 padded when fewer than n blocks are visible. Long rows first take a floor
under x (the least of the maxima of n interleaved sets of blocks); where it leaves at most
TopkTuning.select_candidates scores, the search runs over those alone (shorter than the search
over whole rows).

Two kernels instead of one fused kernel with a running top-n in registers: the running top-n
costs more than writing the scores and reading them back, at the benchmark shape and at
m7c_125m's (`python bench/bench_nsa.py --breakdown` times the two kernels).

Shapes: q [B, Tq, HQ, K]; kc [B, Nc, H, K]; lse [B, Tq, HQ]; output idx [B, Tq, H, n] int64,
ascending, -1 padded (the contract of nsa.attention.torch_branches.torch_select_blocks).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._autograd import run_op
from ._launch import dot_precision, fp32_small_tiles, launch
from ._softmax import LOG2E, lse_log2
from .tuning import TOPK, TopkTuning

INF_BITS: tl.constexpr = tl.constexpr(0x7F800000)
"""+inf as int32 bits: the largest bit pattern of a non-NaN float32, so the top of the search."""


@triton.jit
def _overlap_weight(o, L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr):
    """Overlap / d of compressed token (j*R + o) with selection block j."""
    ov = tl.minimum(o * D + L, LS) - tl.maximum(o * D, 0)
    return tl.maximum(ov, 0) // D


@triton.jit
def _row_roles(ROWS: tl.constexpr, GP: tl.constexpr, REGS: tl.constexpr):
    """(token, head) of each of a tile's ROWS = tokens x GP rows. The rows of a tensor-core
    product's accumulator on 4 warps are rho = 64 a + 16 w + 8 b + l: a its 64-row repeat and b
    its half, both in one thread's registers; w the warp; l the lane's row (lanes 4l..4l+3). A
    token's heads take b, then a, then the low bits of l, so that _head_sum adds them mostly
    inside a thread (at GP = 8 on 128 rows, 3 adds and one shuffle a value against 3 shuffles
    and 3 adds in token-major order). Any bijection is correct; this one is fast. REGS: the
    tile fits it (rows in whole 64-row repeats A, and GP // (2 A) in 1..8), else token-major."""
    rho = tl.arange(0, ROWS)
    if REGS:
        A: tl.constexpr = ROWS // 64
        M: tl.constexpr = GP // (2 * A)  # head bits taken from l
        l = rho % 8
        return ((rho // 16) % 4) * (8 // M) + l // M, (l % M) * (2 * A) + (rho // 64) * 2 + (rho // 8) % 2
    else:
        return rho // GP, rho % GP


@triton.jit
def _head_sum(p, BT: tl.constexpr, GP: tl.constexpr, BC: tl.constexpr, REGS: tl.constexpr):
    """p [BT * GP, BC], rows in _row_roles' order, summed over each token's heads: [BT, BC]."""
    if REGS:
        A: tl.constexpr = BT * GP // 64
        p = tl.sum(tl.reshape(p, [A, 64, BC]), 0)  # a
        p = tl.sum(tl.reshape(p, [4, 2, 8, BC]), 1)  # b
        return tl.sum(tl.reshape(p, [BT, GP // (2 * A), BC]), 1)  # the low bits of l
    else:
        return tl.sum(tl.reshape(p, [BT, GP, BC]), 1)


@triton.jit
def _chunk_scores(p, carry, c, jt, w_in, w_out, out_rows, tok_ok, NB, BT: tl.constexpr, GP: tl.constexpr,
                  BJ: tl.constexpr, RP: tl.constexpr, REGS: tl.constexpr):
    """Chunk c's block scores from its probabilities p [BT * GP, BJ * RP] (rows in _row_roles'
    order; column j * RP + o the o-th compressed token of the chunk's block j): summed over the
    group's heads; each block takes its tokens' overlap with it (w_in [BJ, RP]) and the
    previous block's tokens' overlap past that block's end (w_out; carry for the chunk's first
    block); forced blocks +inf, blocks after the token's own -1; stored. Returns what the
    chunk's last block hands to the next chunk's first."""
    ps = tl.reshape(_head_sum(p, BT, GP, BJ * RP, REGS), [BT, BJ, RP])
    sc = tl.sum(ps * w_in[None, :, :], 2)  # [BT, BJ]
    out = tl.sum(ps * w_out[None, :, :], 2)  # what each block hands to the next
    jj = tl.arange(0, BJ)
    # block i hands to block i + 1: a select, not a product with a 0/1 matrix, which Triton turns
    # into a tl.dot of its default float32 precision (TF32 on some versions: 10 mantissa bits)
    nxt = jj[:, None] + 1 == jj[None, :]  # [BJ, BJ]
    sc += tl.sum(tl.where(nxt[None, :, :], out[:, :, None], 0.0), 1) + tl.where(jj[None, :] == 0, carry[:, None], 0.0)
    j = c * BJ + jj
    forced = (j[None, :] == 0) | (j[None, :] == jt[:, None]) | (j[None, :] == jt[:, None] - 1)
    sc = tl.where(forced, float("inf"), sc)
    sc = tl.where(j[None, :] <= jt[:, None], sc, -1.0)
    tl.store(out_rows[:, None] + j[None, :], sc, mask=tok_ok & (j[None, :] < NB))
    return tl.sum(tl.where(jj[None, :] == BJ - 1, out, 0.0), 1)


@triton.jit
def _score_kernel(
    q, kc, lse, scores, Tq, Nc, NB, q_start, sm_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
    L: tl.constexpr, D: tl.constexpr, LS: tl.constexpr, BJ: tl.constexpr,
    BT: tl.constexpr, RP: tl.constexpr, DOT: tl.constexpr,
):
    pid_t = tl.num_programs(0) - 1 - tl.program_id(0)  # the tiles with the most chunks first
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    HQ: tl.constexpr = H * G
    R: tl.constexpr = LS // D
    BCR: tl.constexpr = BJ * R  # compressed tokens per chunk
    ROWS: tl.constexpr = BT * GP
    REGS: tl.constexpr = (ROWS % 64 == 0) and (GP >= 2 * (ROWS // 64)) and (GP <= 16 * (ROWS // 64))

    tok_r, g = _row_roles(ROWS, GP, REGS)
    tt = pid_t * BT + tok_r
    rmask = (tt < Tq) & (g < G)
    pos_r = q_start + tt
    offk = tl.arange(0, BK)
    kmask = offk < K
    q_base = q + (b.to(tl.int64) * Tq * HQ + h * G) * K
    qt = tl.load(q_base + (tt * HQ + g).to(tl.int64)[:, None] * K + offk[None, :],
                 mask=rmask[:, None] & kmask[None, :], other=0.0)
    lse2 = lse_log2(tl.load(lse + b.to(tl.int64) * Tq * HQ + h * G + tt * HQ + g, mask=rmask, other=0.0))
    lse2 = tl.where(rmask, lse2, float("inf"))  # a padding row's p is 0 without a mask
    # compressed token i is visible to position p iff i*D + L - 1 <= p
    hi_r = tl.where(pos_r + 1 >= L, (pos_r + 1 - L) // D, -1)
    hi_r = tl.where(rmask, hi_r, -1)
    kc_base = kc + (b.to(tl.int64) * Nc * H + h) * K

    tok = pid_t * BT + tl.arange(0, BT)
    jt = (q_start + tok) // LS
    t_last = tl.minimum(pid_t * BT + BT - 1, Tq - 1)
    n_chunks = tl.cdiv((q_start + t_last) // LS + 1, BJ)
    # the chunks whose compressed tokens the tile's first token (so every row) sees: no mask
    p_first = q_start + pid_t * BT
    n_whole = tl.minimum(tl.where(p_first + 1 >= L, ((p_first + 1 - L) // D + 1) // BCR, 0), n_chunks)

    # a chunk's columns: j * RP + o, the o-th compressed token of its block j (o < R)
    jj = tl.arange(0, BJ)
    o = tl.arange(0, RP)
    col = (jj[:, None] * R + o[None, :]).reshape(BJ * RP)  # the token's offset in the chunk
    colv = tl.broadcast_to(o[None, :] < R, [BJ, RP]).reshape(BJ * RP)
    w_in = tl.where(o < R, _overlap_weight(o, L, D, LS), 0).to(tl.float32)
    w_out = tl.where(o < R, _overlap_weight(o - R, L, D, LS), 0).to(tl.float32)  # past the block's end
    w_in = tl.broadcast_to(w_in[None, :], [BJ, RP])
    w_out = tl.broadcast_to(w_out[None, :], [BJ, RP])

    qk_scale = sm_scale * LOG2E
    out_rows = scores + ((b.to(tl.int64) * Tq + tok) * H + h) * NB
    tok_ok = tok[:, None] < Tq
    carry = tl.zeros([BT], tl.float32)
    for c in range(0, n_whole):
        ci = c * BCR + col
        kt = tl.load(kc_base + ci.to(tl.int64)[:, None] * (H * K) + offk[None, :],
                     mask=colv[:, None] & kmask[None, :], other=0.0)
        p = tl.exp2(tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale - lse2[:, None])
        carry = _chunk_scores(p, carry, c, jt, w_in, w_out, out_rows, tok_ok, NB, BT, GP, BJ, RP, REGS)
    for c in range(n_whole, n_chunks):
        ci = c * BCR + col
        kt = tl.load(kc_base + ci.to(tl.int64)[:, None] * (H * K) + offk[None, :],
                     mask=((ci < Nc) & colv)[:, None] & kmask[None, :], other=0.0)
        s = tl.dot(qt, tl.trans(kt), input_precision=DOT) * qk_scale - lse2[:, None]
        p = tl.where((ci[None, :] <= hi_r[:, None]) & colv[None, :], tl.exp2(s), 0.0)
        carry = _chunk_scores(p, carry, c, jt, w_in, w_out, out_rows, tok_ok, NB, BT, GP, BJ, RP, REGS)
    for c in range(n_chunks, tl.cdiv(NB, BJ)):  # blocks after the tile's last query's own
        j = c * BJ + jj
        tl.store(out_rows[:, None] + j[None, :], tl.full([BT, BJ], -1.0, tl.float32),
                 mask=tok_ok & (j[None, :] < NB))


@triton.jit
def _nth_largest(bits, lo, hi, N: tl.constexpr):
    """The largest x in [lo, hi] with at least N of the rows' bits >= x (lo when none is): a
    binary search of 31 steps over non-negative float32 bit patterns, [BR] per row."""
    for _ in range(0, 31):
        mid = lo + (hi - lo + 1) // 2
        ok = tl.sum((bits >= mid[:, None]).to(tl.int32), 1) >= N
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _select_kernel(scores, idx, NROWS, NB, N: tl.constexpr, NP: tl.constexpr, NBP: tl.constexpr,
                   BR: tl.constexpr, NS: tl.constexpr, CAP: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = r < NROWS
    j = tl.arange(0, NBP)
    row = scores + r.to(tl.int64)[:, None] * NB
    s = tl.load(row + j[None, :], mask=rm[:, None] & (j[None, :] < NB), other=-1.0)
    bits = s.to(tl.int32, bitcast=True)  # scores >= 0 order like their bits; -1.0 is negative
    # the largest x in [0, +inf] with at least N scores >= x (0 when fewer than N are visible)
    zero = tl.zeros([BR], tl.int32)
    top = tl.full([BR], INF_BITS, tl.int32)
    if CAP > 0:
        # A floor under x: the least of the maxima of NS interleaved sets of blocks, NS distinct
        # scores >= it. Where at least N and at most CAP scores reach it, they hold every score
        # >= x: the search runs over them alone, moved to the front of the row's own scores
        # (read already, not read again), CAP a row instead of NBP.
        floor = tl.min(tl.max(tl.reshape(bits, [BR, NBP // NS, NS]), 1), 1)
        cand = bits >= floor[:, None]
        count = tl.where(rm, tl.sum(cand.to(tl.int32), 1), N)
        if (tl.min(count) >= N) & (tl.max(count) <= CAP):
            slot = tl.cumsum(cand.to(tl.int32), 1) - 1
            tl.debug_barrier()
            tl.store(row + slot, s, mask=cand & rm[:, None])
            tl.debug_barrier()
            c = tl.arange(0, CAP)
            few = tl.load(row + c[None, :], mask=rm[:, None] & (c[None, :] < count[:, None]), other=-1.0)
            lo = _nth_largest(few.to(tl.int32, bitcast=True), floor, top, N)
        else:
            lo = _nth_largest(bits, zero, top, N)
    else:
        lo = _nth_largest(bits, zero, top, N)
    above = bits > lo[:, None]
    tied = bits == lo[:, None]
    room = N - tl.sum(above.to(tl.int32), 1)
    take = above | (tied & (tl.cumsum(tied.to(tl.int32), 1) <= room[:, None]))
    slot = tl.cumsum(take.to(tl.int32), 1) - 1
    out = idx + r.to(tl.int64)[:, None] * N
    tl.store(out + slot, j[None, :].to(tl.int64) + tl.zeros([BR, NBP], tl.int64), mask=take & rm[:, None])
    n_taken = tl.sum(take.to(tl.int32), 1)
    col = tl.arange(0, NP)
    tl.store(out + col[None, :], tl.full([BR, NP], -1, tl.int64),
             mask=rm[:, None] & (col[None, :] >= n_taken[:, None]) & (col[None, :] < N))


def _select_launch(nbp: int, warps: int = 0) -> tuple[int, int]:
    """(rows per program, warps) of the select kernel; ``warps`` > 0 overrides the rule's. From
    S=16k (256 blocks a row) one row a program on one warp, so that the 31 row counts of the
    search stay inside a warp (shuffles; more warps a row cross warps through shared memory, 10
    barriers in the PTX on 4 warps at S=64k): the fastest of `python bench/bench_nsa.py --sweep
    --sweep-only topk` up to m7c@128k, 2048 blocks a row, 64 scores a thread. Below 16k, four rows
    on 4 warps, which kept the whole top-n of short inputs shorter. Past 2048 blocks (not timed)
    a warp per 2048, to bound the registers a thread."""
    if nbp < 256:
        return 4, warps or 4
    return max(1, 512 // nbp), warps or max(1, nbp // 2048)


def select_top(scores: torch.Tensor, idx: torch.Tensor, candidates: int = TOPK.select_candidates,
               warps: int = 0) -> None:
    """idx [rows, n] (int64): the n best of each row of block scores [rows, NB] (float32, as the
    score kernel writes them: -1 for a block the row may not choose), ascending, -1 padded, ties
    to the lower block (see the module docstring); ``candidates``: TopkTuning.select_candidates;
    ``warps``: TopkTuning.select_warps. Overwrites the scores."""
    rows, NB = scores.shape
    n = idx.shape[1]
    NBP = triton.next_power_of_2(NB)
    BR, warps = _select_launch(NBP, warps)
    # the search over at most CAP candidates a row, for rows of 4 CAP blocks and more (shorter
    # rows search in registers cheaply enough); NS interleaved sets give the floor (NS <= n)
    NS = min(1 << (n.bit_length() - 1), NBP)
    CAP = candidates if NBP >= 4 * candidates and n <= candidates and NS >= 4 else 0
    _select_kernel[(triton.cdiv(rows, BR),)](scores, idx, rows, NB, N=n, NP=triton.next_power_of_2(n), NBP=NBP,
                                             BR=BR, NS=NS, CAP=CAP, num_warps=warps)


def _select_blocks(q, kc, lse, q_start: int, L: int, D: int, LS: int, n: int, tune: TopkTuning):
    B, Tq, HQ, K = q.shape
    Nc, H = kc.shape[1], kc.shape[2]
    G = HQ // H
    idx = torch.empty(B, Tq, H, n, device=q.device, dtype=torch.int64)
    if Tq == 0:
        return idx
    if Nc == 0:  # nothing to score; a valid pointer for the (fully masked) loads
        kc = q.new_zeros(B, 1, H, K)
    interpret = q.device.type == "cpu"
    GP = triton.next_power_of_2(G)
    BT = max(1, (tune.rows_interpret if interpret else tune.rows) // GP)
    BK = max(16, triton.next_power_of_2(K))
    RP = triton.next_power_of_2(LS // D)
    BJ = max(tune.chunk_blocks, 16 // RP)  # at least 16 columns: the tensor cores' smallest product
    NB = triton.cdiv(q_start + Tq, LS)
    chunk = max(BT, tune.score_budget // (B * H * NB * 4) // BT * BT)
    buffer = torch.empty(B * min(chunk, Tq) * H * NB, device=q.device, dtype=torch.float32)
    for a in range(0, Tq, chunk):
        t = min(chunk, Tq - a)
        qa, lsea, sc = q[:, a:a + t], lse[:, a:a + t], buffer[:B * t * H * NB].view(B, t, H, NB)
        if t < Tq:
            qa, lsea = qa.contiguous(), lsea.contiguous()
        # a fallback with fewer rows (BT tokens, at least 16 rows) keeps the chunk a multiple of BT
        launch(_score_kernel, lambda c, t=t: (triton.cdiv(t, c["BT"]), B * H),
               (qa, kc, lsea, sc, t, Nc, NB, q_start + a, 1.0 / math.sqrt(K)),
               dict(H=H, G=G, GP=GP, K=K, BK=BK, L=L, D=D, LS=LS, BJ=BJ, RP=RP,
                    DOT=dot_precision(q.dtype)),
               dict(BT=BT, num_warps=4 if interpret else 8 if fp32_small_tiles(q.dtype, K) else tune.warps,
                    num_stages=1 if interpret else tune.stages), halve=("BT",), floor=max(1, 16 // GP))
        rows = B * t * H
        out = idx[:, a:a + t] if t == Tq else torch.empty(B, t, H, n, device=q.device, dtype=torch.int64)
        select_top(sc.view(rows, NB), out.view(rows, n), tune.select_candidates, tune.select_warps)
        if t < Tq:
            idx[:, a:a + t] = out
    return idx


def _select_blocks_op(q: torch.Tensor, kc: torch.Tensor, lse: torch.Tensor, q_start: int, L: int, D: int,
                      LS: int, n: int, tuning: str) -> torch.Tensor:
    """nsa::select_blocks; tuning: a TopkTuning.as_arg()."""
    return _select_blocks(q, kc, lse, q_start, L, D, LS, n, TopkTuning.from_arg(tuning))


select_blocks_op = torch.library.custom_op("nsa::select_blocks", _select_blocks_op, mutates_args=())


@select_blocks_op.register_fake
def _(q, kc, lse, q_start, L, D, LS, n, tuning):
    return q.new_empty((q.shape[0], q.shape[1], kc.shape[2], n), dtype=torch.int64)


def select_blocks(q, kc, lse, q_start: int, L: int, D: int, LS: int, n: int, tuning: TopkTuning = TOPK):
    """Selected block indices [B, Tq, H, n] (int64, ascending, -1 padded) of q [B, Tq, HQ, K]
    at positions q_start.., from the compressed keys kc [B, Nc, H, K] (compressed token i
    covers [i*D, i*D + L)) and the compressed branch's lse [B, Tq, HQ] (natural log): blocks of
    LS tokens, the n best of each KV group (see the module docstring); tuning: launch parameters
    (nsa.kernels.tuning). Under torch.compile it runs as the custom op nsa::select_blocks (opaque,
    no gradient)."""
    q, kc, lse = (t.detach().contiguous() for t in (q, kc, lse))
    return run_op(select_blocks_op, _select_blocks_op, q, kc, lse, int(q_start), int(L), int(D), int(LS), int(n),
                  tuning.as_arg())
