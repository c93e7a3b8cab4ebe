"""Triton selected-block attention against the PyTorch branch in float64 with the same
selected indices (forward and backward), any group size."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import (
    torch_cmp_attention,
    torch_sel_attention,
    torch_select_blocks,
)
from nsa.kernels.tuning import SELECTION, SelectionTuning
from tests.kernels._util import (
    INTERP_SETTINGS,
    KCase,
    check_against_reference,
    kcases,
    rel_err,
    rnd,
)

pytestmark = pytest.mark.triton_interp


def _check(kdev, case: KCase, tune: SelectionTuning | None = None):
    from nsa.attention.kernel_branches import triton_sel_attention

    gen = torch.Generator().manual_seed(case.seed)
    B, T, H, G, K, Tk, Nc = case.B, case.T, case.H, case.G, case.K, case.Tk, case.Nc
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    v = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    kc = rnd(gen, B, Nc, H, K, device="cpu", dtype=torch.float64)
    do = rnd(gen, B, T, H * G, K, device=kdev)
    q64 = q.detach().double().cpu()
    _, lse = torch_cmp_attention(q64, kc, kc, case.cfg, case.q_start)
    idx = torch_select_blocks(q64, kc, lse, case.cfg, case.q_start)
    check_against_reference(lambda *x: triton_sel_attention(*x, idx.to(kdev), case.cfg, case.q_start, tune),
                            lambda *x: torch_sel_attention(*x, idx, case.cfg, case.q_start), [q, k, v], do)


@INTERP_SETTINGS
@given(case=kcases())
def test_selection_matches_torch(kdev, case):
    _check(kdev, case)


@pytest.mark.parametrize("G", [6, 16], ids=["G6", "G16"])
def test_selection_group_sizes_and_popular_block(kdev, G):
    """Block 0 is chosen by every query: its dk/dv is split over several work items (of 8
    tokens, forced through the tuning, of 19)."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=3, window=8)
    _check(kdev, KCase(cfg, B=1, T=19, H=1, G=G, K=16, q_start=0, seed=G), SelectionTuning(qc=8, qc_interpret=8))


def _random_idx(gen, B, Tq, H, n, ls, q_start):
    """Per (token, head): its own block plus a random number of random earlier blocks,
    ascending, -1 padded, so neighbouring tokens select different blocks and many rows have
    fewer than n valid entries."""
    idx = torch.full((B, Tq, H, n), -1, dtype=torch.int64)
    for b in range(B):
        for t in range(Tq):
            for h in range(H):
                own = (q_start + t) // ls
                extra = int(torch.randint(0, n, (1,), generator=gen))
                sel = sorted([own] + torch.randperm(own, generator=gen)[:extra].tolist())
                idx[b, t, h, : len(sel)] = torch.tensor(sel)
    return idx


def _check_tiles(kdev, TT, G, T, q_start, H, B=1, seed=0, sel_block=4, K=16, form="tiles",
                 tune: SelectionTuning = SELECTION):
    """The selected branch at TT tokens a tile (forced through ``tune``) against float64."""
    from nsa.kernels import selection

    tune = dataclasses.replace(tune, tt=TT)
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=sel_block, n_selected=4, window=8)
    gen = torch.Generator().manual_seed(seed)
    Tk = q_start + T
    assert selection._tokens_per_tile(G, cfg.n_selected, -(-Tk // cfg.sel_block), T, tune) == \
        min(TT, 1 << (T - 1).bit_length())
    q = rnd(gen, B, T, H * G, K, device=kdev).requires_grad_()
    k = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    v = rnd(gen, B, Tk, H, K, device=kdev).requires_grad_()
    do = rnd(gen, B, T, H * G, K, device=kdev)
    idx = _random_idx(gen, B, T, H, cfg.n_selected, cfg.sel_block, q_start)
    check_against_reference(lambda *x: selection.selected_attention(*x, idx.to(kdev), q_start, cfg.sel_block,
                                                                    form=form, tuning=tune),
                            lambda *x: torch_sel_attention(*x, idx, cfg, q_start), [q, k, v], do)


@pytest.mark.parametrize("G,q_start", [(1, 0), (3, 7), (6, 0), (16, 5)], ids=["G1", "G3", "G6", "G16"])
@pytest.mark.parametrize("TT", [1, 4], ids=["TT1", "TT4"])
def test_selection_token_tiles(kdev, TT, G, q_start):
    """Forced token tiles: 13 tokens (no multiple of the tile or of l' = 4), random per-token
    selections with -1 padding, prefill (q_start = 0) and continuation (q_start > 0), two
    batches at G = 3. One token a tile and several (a tile of 2 takes the same path as 4)."""
    _check_tiles(kdev, TT, G, T=13, q_start=q_start, H=2 if G < 16 else 1,
                 B=2 if G == 3 else 1, seed=10 * TT + G)


@pytest.mark.parametrize("TT", [1, 4], ids=["TT1", "TT4"])
def test_selection_token_tiles_decode(kdev, TT):
    """One query token after 29 cached keys (the tile is capped at one token)."""
    _check_tiles(kdev, TT, G=6, T=1, q_start=29, H=2, B=2, seed=TT)


def test_selection_dq_kernel_at_one_token_a_tile(kdev):
    """At one token a tile dq comes from what the dk/dv pass keeps (the TT1 cases above);
    switched off, from the dq kernel."""
    from nsa.kernels import selection

    tune = SelectionTuning(tt=1, dq_from_pass=False)
    assert not selection._dq_from_pass(torch.empty(1, 23, 6, 16), torch.empty(1, 23, 2, 16), 4, 4, tune)
    assert selection._dq_from_pass(torch.empty(1, 23, 6, 16), torch.empty(1, 23, 2, 16), 4, 4, SelectionTuning(tt=1))
    _check_tiles(kdev, 1, G=3, T=13, q_start=5, H=2, B=1, seed=3, tune=tune)


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointers"])
@pytest.mark.parametrize("G,K", [(3, 16), (16, 32)], ids=["G3K16", "G16K32"])
def test_selection_tma_gathers(kdev, tma, G, K):
    """One token a tile with blocks of l' = 16 keys: K/V blocks through TMA descriptors (boxes of
    [l', K]; a block past Tk or the tile's last query comes in unmasked, the next batch's keys or
    zeros, and must stay invisible) or by pointers; 21 tokens after 6 cached keys (block 1 ends
    past Tk), two batches."""
    from nsa.kernels import _tma, selection

    tune = SelectionTuning(tma=tma)
    kv = torch.empty(2, 51, 2, K, device=kdev)
    assert selection._tma(kv, kv, 16, 1, tune) == (tma and _tma.TensorDescriptor is not None)
    assert not selection._tma(kv, kv, 16, 2, tune)
    unaligned = torch.empty(2 * 51 * 2 * K + 1, device=kdev)[1:].view(2, 51, 2, K)
    assert not selection._tma(kv, unaligned, 16, 1, tune)  # v unaligned
    wide = torch.empty(2, 51, 2, 24, device=kdev)
    assert not selection._tma(wide, wide, 16, 1, tune)  # no power of two
    _check_tiles(kdev, 1, G=G, T=21, q_start=6, H=2 if G < 16 else 1, B=2, seed=G + K, sel_block=16, K=K,
                 tune=tune)


@pytest.mark.parametrize("keep", ["dq", "ds"])
@pytest.mark.parametrize("G,q_start", [(3, 5), (6, 0)], ids=["G3", "G6"])
def test_selection_dq_from_partials_or_ds_tiles(kdev, keep, G, q_start):
    """At one token a tile the dk/dv pass keeps, per (token, block), its dq partial dS @ K
    (summed by a kernel that gathers nothing) or its dS tile (dq = sum of dS @ K, gathering K):
    both give the float64 gradients."""
    from nsa.kernels import selection

    tune = SelectionTuning(dq_keep=keep)
    assert selection._dq_source(16, 4, tune) == keep
    _check_tiles(kdev, 1, G=G, T=13, q_start=q_start, H=2, B=1, seed=G + len(keep), tune=tune)


@pytest.mark.parametrize("keep", ["dq", "ds"])
@pytest.mark.parametrize("B", [1, 2], ids=["B1", "B2"])
def test_selection_kept_a_chunk_of_tokens_at_a_time(kdev, B, keep):
    """dq partials or dS tiles past SelectionTuning.kept_budget bytes: the backward takes the
    query tokens a chunk at a time (here 5 tokens of 13, the last chunk short; with B=2 the chunks
    are strided slices), each chunk's dk/dv added to the others', at positions q_start + the
    chunk's offset."""
    from nsa.kernels import selection

    q = torch.empty(B, 13, 6, 16)  # float32 on the interpreter: 4 bytes a value
    width = 16 if keep == "dq" else 4  # K, or l'
    tune = SelectionTuning(dq_keep=keep, kept_budget=5 * B * 6 * 4 * width * 4 + 7)  # 5 tokens of n=4
    assert selection._kept_chunk(q, 4, 4, tune) == 5
    _check_tiles(kdev, 1, G=3, T=13, q_start=5, H=2, B=B, seed=4 + B, tune=tune)


def test_selection_kept_path_and_chunk_rules():
    """dq from the dk/dv pass at one token a tile only; it keeps dq partials where the head dim is
    at most the block, dS tiles otherwise; a chunk is as many tokens as fit the budget, at most
    kept_tokens, at least one; a bad dq_keep is named."""
    from nsa.kernels import selection

    q, k = torch.empty(2, 23, 6, 16), torch.empty(2, 23, 2, 16)
    assert selection._dq_from_pass(q, k, 4, 4, SelectionTuning(tt=1))
    assert not selection._dq_from_pass(q, k, 4, 4, SelectionTuning(tt=2))
    assert [selection._dq_source(K, 64) for K in (32, 64, 128, 256)] == ["dq", "dq", "ds", "ds"]
    per_token = 2 * 6 * 4 * 4 * 4  # B * HQ * n * l' * 4 bytes (K=16 > l'=4: dS tiles)
    assert selection._kept_chunk(q, 4, 4, SelectionTuning(kept_budget=3 * per_token)) == 3
    assert selection._kept_chunk(q, 4, 4, SelectionTuning(kept_budget=per_token - 1)) == 1
    assert selection._kept_chunk(q, 4, 4, SelectionTuning(kept_budget=3 * per_token, kept_tokens=4)) == 2  # B=2
    # m7c_125m (12 query heads, head dim 64, 16 blocks of 64): 64k tokens whole, 128k in two chunks
    m7c = torch.empty(1, 131072, 12, 64, dtype=torch.bfloat16, device="meta")
    assert selection._kept_chunk(m7c[:, :65536], 16, 64) == 65536
    assert selection._kept_chunk(m7c, 16, 64) == 65536
    assert selection._kept_chunk(m7c.expand(2, -1, -1, -1), 16, 64) == 32768  # tokens of the batch
    with pytest.raises(ValueError, match="dq_keep is 'dS'"):
        SelectionTuning(dq_keep="dS")


def test_selection_tile_rule():
    from nsa.kernels import selection

    tune = SelectionTuning(tt=0, tt_rows=64, tt_max=8, tt_nb=2.0)

    def rule(**shape):
        return selection._tokens_per_tile(**shape, tune=tune)

    assert rule(G=6, n=16, NB=32, Tq=2048) == 8  # m7c_125m at 2k: 8 rows per token
    assert rule(G=16, n=16, NB=32, Tq=2048) == 4  # HQ=64, H=4 at 2k
    assert rule(G=16, n=16, NB=128, Tq=8192) == 1  # long context: one token per program
    assert rule(G=1, n=16, NB=32, Tq=2048) == 8  # tt_max
    assert rule(G=1, n=16, NB=32, Tq=3) == 4  # capped by the (rounded up) token count
    assert rule(G=128, n=16, NB=32, Tq=2048) == 1


def test_selection_forward_form_rule():
    """Key-block-major at one token a tile and groups of up to 8 heads (measured: the module's
    forward_form); token tiles at short contexts and for 16 heads a group."""
    from nsa.kernels.selection import forward_form

    assert [forward_form(G, 1) for G in (1, 4, 6, 8)] == ["blocks"] * 4
    assert forward_form(16, 1) == "tiles" and forward_form(6, 8) == "tiles"


@pytest.mark.parametrize("TT", [2, 4], ids=["TT2", "TT4"])
def test_selection_tile_union(kdev, TT):
    """The block list of each tile: its tokens' selected blocks, each once, descending, -1 padded."""
    from nsa.kernels import selection

    gen = torch.Generator().manual_seed(TT)
    B, Tq, H, n, ls = 2, 23, 2, 4, 4
    idx = _random_idx(gen, B, Tq, H, n, ls, q_start=9)
    NB = -(-(9 + Tq) // ls)
    got = selection._tile_union(idx.to(kdev), TT, NB).cpu()
    assert got.shape == (B, -(-Tq // TT), H, min(TT * n, NB))
    for b in range(B):
        for i in range(got.shape[1]):
            for h in range(H):
                want = sorted({j for row in idx[b, i * TT:(i + 1) * TT, h].tolist() for j in row if j >= 0}, reverse=True)
                assert got[b, i, h].tolist() == want + [-1] * (got.shape[-1] - len(want))


@pytest.mark.parametrize("qc", [3, 64], ids=["qc3", "qc64"])
def test_inverse_selection_work_items(kdev, qc):
    """The dk/dv pass's work items: each (b, h, block)'s tokens exactly once, ascending, cut
    into items of at most qc tokens in segment order; the slots past a (b, h)'s items are empty;
    the permutation names the idx entry each sorted entry came from (where that entry's partial
    output or kept dq goes), and tokens its token."""
    from nsa.kernels._inverse import inverse_selection

    gen = torch.Generator().manual_seed(qc)
    B, Tq, H, n, ls, Tk = 2, 37, 3, 4, 4, 40
    idx = _random_idx(gen, B, Tq, H, n, ls, q_start=3)
    tokens, perm, items, NB = (x.cpu() if torch.is_tensor(x) else x for x in inverse_selection(idx.to(kdev), Tk, ls, qc))
    seg, start, end = items
    assert NB == Tk // ls and seg.numel() == B * H * (Tq * n // qc + NB)
    got: dict[int, list[int]] = {}
    for w in range(seg.numel()):
        s, a, e = int(seg[w]), int(start[w]), int(end[w])
        if a == e:
            continue
        assert 0 < e - a <= qc and w // (seg.numel() // (B * H)) == s // NB  # in its (b, h)'s slots
        # entry ((b*Tq + t)*H + h)*n + slot holds this segment's block, token t, of its (b, h)
        entries = perm[a:e]
        assert (idx.view(-1)[entries] == s % NB).all() and ((entries // n) % H == (s // NB) % H).all()
        assert (entries // (n * H * Tq) == s // (NB * H)).all()
        assert tokens.dtype == torch.int32 and torch.equal(tokens[a:e].long(), (entries // (n * H)) % Tq)
        got.setdefault(s, []).extend(tokens[a:e].tolist())
    want: dict[int, list[int]] = {}
    for b in range(B):
        for t in range(Tq):
            for h in range(H):
                for j in idx[b, t, h].tolist():
                    if j >= 0:
                        want.setdefault((b * H + h) * NB + j, []).append(t)
    assert got == want  # dicts of lists: same segments, same tokens in the same (ascending) order


@pytest.mark.parametrize("G,q_start,B", [(1, 0, 2), (3, 7, 2), (6, 0, 1), (16, 5, 1)], ids=["G1", "G3", "G6", "G16"])
def test_selection_blocks_forward(kdev, G, q_start, B):
    """The key-block-major forward (selection_blocks): random per-token selections with -1
    padding, blocks chosen by more tokens than a work item holds (3), continuation."""
    _check_tiles(kdev, 1, G=G, T=13, q_start=q_start, H=2 if G < 16 else 1, B=B, seed=20 + G,
                 form="blocks", tune=SelectionTuning(qc=3, qc_interpret=3))


@pytest.mark.parametrize("B", [1, 2], ids=["B1", "B2"])
def test_selection_blocks_forward_a_chunk_of_tokens_at_a_time(kdev, B):
    """Partials past SelectionTuning.partials_budget bytes: the query tokens a chunk at a time
    (5 of 13 here, the last chunk short), each chunk's outputs written at its tokens' rows."""
    from nsa.kernels import selection_blocks

    per_token = B * 6 * 4 * 16 * 4  # B * HQ * n * K float32 partials
    assert selection_blocks._chunk(B, 13, 6, 4, 16, 4, 5 * per_token + 11) == 5
    _check_tiles(kdev, 1, G=3, T=13, q_start=5, H=2, B=B, seed=30 + B, form="blocks",
                 tune=SelectionTuning(partials_budget=5 * per_token + 11))


def test_selection_blocks_forward_combines_the_same_however_many_rows_a_program(kdev):
    """The kernel combining the partials (SelectionTuning.combine_values, combine_warps) sums each
    row's slots in slot order whatever its rows a program: the outputs are those of the
    default launch, bit for bit (here one row a program against eight)."""
    from nsa.kernels import selection

    gen = torch.Generator().manual_seed(11)
    q = rnd(gen, 1, 21, 6, 16, device=kdev)
    k, v = rnd(gen, 1, 21, 2, 16, device=kdev), rnd(gen, 1, 21, 2, 16, device=kdev)
    idx = _random_idx(gen, 1, 21, 2, 4, 4, 0).to(kdev)
    want = selection._sel_fwd(q, k, v, idx, 4, 0, False, "blocks", SELECTION)[:2]
    got = selection._sel_fwd(q, k, v, idx, 4, 0, False, "blocks", SelectionTuning(combine_values=64, combine_warps=2))
    assert all(torch.equal(a, b) for a, b in zip(got[:2], want))


def test_selection_blocks_forward_16_bit_partials(kdev):
    """fp16 inputs: the partial outputs are stored in fp16 (half the traffic of float32) and
    combined in float32; the output stays within fp16's error of the float64 reference, and
    equals the float32-partials path but for that one rounding."""
    from nsa.kernels import selection, selection_blocks

    assert selection_blocks.partial_dtype(torch.float16) is torch.float16
    assert selection_blocks.partial_dtype(torch.bfloat16) is torch.bfloat16
    assert selection_blocks.partial_dtype(torch.float32) is torch.float32
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, n_selected=4, window=8)
    gen = torch.Generator().manual_seed(7)
    B, T, H, G, K = 1, 23, 2, 6, 16
    q, k, v = (rnd(gen, B, T, H * n, K, device=kdev) for n in (G, 1, 1))
    idx = _random_idx(gen, B, T, H, cfg.n_selected, cfg.sel_block, 0)
    o16 = selection.selected_attention(q.half(), k.half(), v.half(), idx.to(kdev), 0, cfg.sel_block, form="blocks")
    assert o16.dtype is torch.float16
    ref = torch_sel_attention(q.half().double().cpu(), k.half().double().cpu(), v.half().double().cpu(), idx, cfg, 0)
    assert rel_err(o16.float().cpu(), ref) < 2e-3


def test_selection_forward_forms_refuse_unknown():
    from nsa.kernels import selection

    with pytest.raises(ValueError, match="forms: auto, tiles, blocks"):
        selection._sel_fwd(torch.empty(1, 2, 2, 16), torch.empty(1, 2, 1, 16), torch.empty(1, 2, 1, 16),
                           torch.zeros(1, 2, 1, 4, dtype=torch.int64), 4, 0, False, "rows")


@pytest.mark.parametrize("form,deterministic,budget", [("blocks", False, None), ("blocks", True, None),
                                                       ("tiles", False, None), ("blocks", False, 1)],
                         ids=["blocks", "deterministic", "tiles", "blocks-in-chunks"])
def test_selection_forward_inverse_outputs_match_their_fakes(kdev, form, deterministic, budget):
    """The inverse selection the forward hands to the backward (nsa::sel_fwd's last three outputs)
    has the shapes and dtypes its fake says, also where there is none (deterministic, token-major,
    partials taken a chunk at a time): torch.compile traces with the fakes."""
    from nsa.kernels import selection
    from nsa.kernels._inverse import as_outputs

    tune = SELECTION if budget is None else SelectionTuning(partials_budget=budget)
    gen = torch.Generator().manual_seed(7)
    q = rnd(gen, 2, 19, 6, 16, device=kdev)
    k, v = rnd(gen, 2, 19, 2, 16, device=kdev), rnd(gen, 2, 19, 2, 16, device=kdev)
    idx = _random_idx(gen, 2, 19, 2, 4, 4, 0).to(kdev)
    real = as_outputs(selection._sel_fwd(q, k, v, idx, 4, 0, deterministic, form, tune)[2], q.device)
    fake = selection.fake_inverse(q, k, idx, 4, deterministic, form, tune)
    assert [(t.shape, t.dtype) for t in real] == [(t.shape, t.dtype) for t in fake]
    assert (real[0].numel() > 0) == (form == "blocks" and not deterministic and budget is None)
