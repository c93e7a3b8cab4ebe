"""Triton fused importance scores + top-n against the PyTorch selection (computed in float64):
forced blocks, all-visible short prefixes, ascending -1-padded output, and the same chosen
blocks up to near-ties (nsa.attention.torch_branches.near_tie_violations)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (near_tie_violations, torch_cmp_attention, torch_select_blocks,
                                          visible_compressed)
from tests.kernels._util import INTERP_SETTINGS, KCase, kcases, rnd

pytestmark = pytest.mark.triton_interp


def _check(kdev, case: KCase, scale=2.0, tune=None):
    from nsa.attention.kernel_branches import triton_select_blocks

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Nc, cfg = case.B, case.T, case.H, case.G, case.K, case.Nc, case.cfg
    q = rnd(gen, B, T, H * G, K, device="cpu", dtype=torch.float64)
    kc = rnd(gen, B, Nc, H, K, device="cpu", dtype=torch.float64, scale=scale)
    _, lse = torch_cmp_attention(q, kc, kc, cfg, case.q_start)
    ref = torch_select_blocks(q, kc, lse, cfg, case.q_start)
    got = triton_select_blocks(q.float().to(kdev), kc.float().to(kdev), lse.float().to(kdev), cfg,
                               case.q_start, tune).cpu()
    assert got.shape == ref.shape and got.dtype == torch.int64
    pos = torch.arange(case.q_start, case.Tk)
    jt = (pos // cfg.sel_block).view(1, T, 1, 1)
    valid = got >= 0
    # ascending, -1 padded at the end, only visible blocks
    assert ((got[..., 1:] > got[..., :-1]) | (got[..., 1:] == -1)).all()
    assert (valid.sum(-1) == torch.clamp(jt[..., 0] + 1, max=cfg.n_selected)).all()
    assert (got[valid] <= jt.expand_as(got)[valid]).all()
    for forced in (torch.zeros_like(jt), jt, jt - 1):
        has = (got == forced).any(-1) | (forced[..., 0] < 0)
        assert has.all(), "a forced block (0, t//l', t//l'-1) is missing"
    same = (got == ref).all(-1)
    wrong = near_tie_violations(q, kc, lse, got, cfg, case.q_start)
    assert not wrong.any(), f"wrong choices beyond a near-tie at (b, t, h) {wrong.nonzero().tolist()[:5]}"
    return same.float().mean().item()


@INTERP_SETTINGS
@given(case=kcases(max_T=64))
def test_topk_matches_torch(kdev, case):
    _check(kdev, case)


def test_topk_defaults_shape_long_prefix(kdev):
    """Paper defaults (l=32, d=16, l'=64, n=16): several chunks of candidate blocks."""
    cfg = NSAConfig()
    agree = _check(kdev, KCase(cfg, B=1, T=40, H=1, G=2, K=16, q_start=2000, seed=3))
    assert agree >= 0.99


def test_topk_scores_a_query_chunk_at_a_time(kdev):
    """A score budget smaller than one query tile's scores: the queries are scored and
    selected a tile at a time (two chunks here, the last one short), batch of two."""
    from nsa.kernels.tuning import TopkTuning

    cfg = NSAConfig()
    agree = _check(kdev, KCase(cfg, B=2, T=40, H=1, G=2, K=16, q_start=700, seed=5), tune=TopkTuning(score_budget=1))
    assert agree >= 0.99


@pytest.mark.parametrize("G", [3, 6, 12], ids=["G3", "G6", "G12"])
def test_topk_groups_that_are_not_powers_of_two(kdev, G):
    """Groups whose heads fill a power-of-two row set only in part (the seeds' model has G = 6),
    the paper's block sizes, several chunks of candidate blocks, a continuation."""
    cfg = NSAConfig()
    agree = _check(kdev, KCase(cfg, B=1, T=29, H=2 if G < 12 else 1, G=G, K=16, q_start=1500, seed=G))
    assert agree >= 0.99


@pytest.mark.parametrize("G,rows,chunk", [(6, 128, 16), (16, 128, 16), (4, 128, 16), (2, 128, 16), (6, 64, 16),
                                          (6, 128, 8)],
                         ids=["G6-128", "G16-128", "G4-128", "G2-128", "G6-64", "G6-128-chunk8"])
def test_topk_row_orders_and_whole_chunks(kdev, G, rows, chunk):
    """The score kernel's tiles as the GPU launches them (128 rows) and the interpreter's (64):
    a token's heads laid out over registers and lanes (topk._row_roles) where the tile allows
    it, token-major where not (G = 2 on 128 rows); the first tiles' tokens see several chunks
    of compressed tokens whole (the loop without masks), the later ones a chunk in part, and
    the sequence ends inside a tile; chunks of 16 and 8 selection blocks."""
    from nsa.kernels.tuning import TopkTuning

    cfg = NSAConfig()
    tune = TopkTuning(rows=rows, rows_interpret=rows, chunk_blocks=chunk)
    agree = _check(kdev, KCase(cfg, B=1, T=3 * rows // G - 5, H=2 if G < 16 else 1, G=G, K=16, q_start=2090,
                               seed=G + rows), tune=tune)
    assert agree >= 0.99


def test_topk_chunks_of_one_block_and_one_token(kdev):
    """TopkTuning.chunk_blocks 1 with l' = d (one compressed token a block) selects right: the
    kernel widens such a chunk to 16 columns, as products on the GPU's tensor cores need (the
    interpreter would take a narrower one)."""
    from nsa.kernels.tuning import TopkTuning

    cfg = NSAConfig(cmp_block=4, cmp_stride=4, sel_block=4, n_selected=4, window=8)
    agree = _check(kdev, KCase(cfg, B=1, T=40, H=2, G=3, K=16, q_start=90, seed=11), tune=TopkTuning(chunk_blocks=1))
    assert agree >= 0.99


def _top_reference(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The n best of each row by (score descending, block ascending) among scores >= 0,
    ascending, -1 padded."""
    out = torch.full((scores.shape[0], n), -1, dtype=torch.int64)
    for r, row in enumerate(scores.tolist()):
        best = sorted((-v, j) for j, v in enumerate(row) if v >= 0)[:n]
        out[r, :len(best)] = torch.tensor(sorted(j for _, j in best), dtype=torch.int64)
    return out


def _score_rows(rows: int, NB: int, n: int) -> torch.Tensor:
    """Rows of block scores as the score kernel writes them: +inf forced blocks, -1 for the
    blocks a row may not choose, many ties, all tied, fewer than n visible."""
    gen = torch.Generator().manual_seed(NB + n)
    scores = torch.rand(rows, NB, generator=gen)
    scores[0:4] = torch.randint(0, 5, (4, NB), generator=gen).float() / 4  # many ties
    scores[4] = 0.5  # all tied: the floor leaves every block
    for r, visible in ((5, n - 1), (6, n), (7, NB // 3), (8, 1)):  # causal rows: the rest is -1
        scores[r, visible:] = -1.0
    scores[9:, 0] = float("inf")
    scores[9:, NB // 2] = float("inf")
    return scores


@pytest.mark.parametrize("NB,n,cap,warps", [(300, 16, 64, 0), (1024, 16, 64, 0), (70, 4, 16, 0), (2048, 16, 64, 4)],
                         ids=["NB300", "NB1024", "NB70-n4", "NB2048-4warps"])
def test_select_top_searches_few_candidates_or_the_whole_row(kdev, NB, n, cap, warps):
    """The select kernel on rows of scores as the score kernel writes them (+inf forced blocks,
    -1 for the blocks a row may not choose, ties): rows whose floor leaves at most `cap`
    candidates (the short search) and rows where it does not (all scores tied, most blocks
    invisible, fewer than n visible) give the reference's blocks, with the rule's warps and
    with others (TopkTuning.select_warps)."""
    from nsa.kernels import topk

    rows = 24
    scores = _score_rows(rows, NB, n)
    ref = _top_reference(scores, n)
    got = torch.empty(rows, n, dtype=torch.int64, device=kdev)
    work = scores.clone().to(kdev)
    topk.select_top(work, got, cap, warps)
    assert torch.equal(got.cpu(), ref)
    # the short search moves a row's candidates to its front; the whole-row search writes nothing.
    # Which rows take it: the floor is the least maximum of 16 interleaved sets of blocks
    nbp = 1 << (NB - 1).bit_length()
    bits = torch.nn.functional.pad(scores, (0, nbp - NB), value=-1.0).view(torch.int32)
    ns = 1 << (n.bit_length() - 1)
    cand = bits >= bits.view(rows, nbp // ns, ns).amax(1).amin(1)[:, None]
    count = cand.sum(1)
    br, _ = topk._select_launch(nbp)  # a program's rows take the short search together
    short = ((count >= n) & (count <= cap)).view(-1, br).all(1).repeat_interleave(br)
    assert short.sum() >= 4 and (~short).sum() >= 4  # both searches ran
    in_front = torch.stack([c[:k].all() for c, k in zip(cand, count.tolist())])  # nothing to move
    assert torch.equal((work.cpu() != scores).any(1), short & ~in_front)


@pytest.mark.parametrize("G,H,tune", [(1, 2, None), (3, 1, "chunk_blocks=2")], ids=["G1-H2", "G3-chunks-of-2"])
def test_topk_exact_ties_go_to_the_lower_block(kdev, G, H, tune):
    """Zero queries weigh every visible compressed token alike, so the blocks that all of them
    cover score exactly alike, in float32 as in float64: the kernels take the lowest-indexed of
    the tied blocks, as the oracle does, whatever chunk of blocks a block's score was summed in
    (the carry across chunks). test_topk_matches_torch allows either order within a near-tie, so
    it does not pin this."""
    from nsa.attention.kernel_branches import triton_select_blocks
    from nsa.kernels.tuning import TopkTuning

    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=4, window=8)
    B, T, K, q_start = 2, 24, 16, 40
    gen = torch.Generator().manual_seed(G)
    Nc = int(visible_compressed(torch.tensor([q_start + T - 1]), cfg).item())
    q = torch.zeros(B, T, H * G, K, dtype=torch.float64)
    kc = rnd(gen, B, Nc, H, K, device="cpu").double()  # float32 values, exact in both
    _, lse = torch_cmp_attention(q, kc, kc, cfg, q_start)
    ref = torch_select_blocks(q, kc, lse, cfg, q_start)
    got = triton_select_blocks(q.float().to(kdev), kc.float().to(kdev), lse.float().to(kdev), cfg, q_start,
                               None if tune is None else TopkTuning.from_arg(tune)).cpu()
    # the oracle takes block 1 of the tied blocks 1 .. t//l' - 2 beside the forced ones (0, t//l' - 1, t//l')
    jt = torch.arange(q_start, q_start + T) // cfg.sel_block
    assert torch.equal(ref, torch.stack([torch.zeros_like(jt), torch.ones_like(jt), jt - 1, jt], -1)
                       .view(1, T, 1, 4).expand(B, T, H, 4))
    assert torch.equal(got, ref)
