"""The work of each NSA kernel at a shape: FLOPs and minimal bytes, so a measured time becomes
achieved TFLOP/s and GB/s (the distance to the GPU's limits). Pure arithmetic on the shape; no
GPU, no kernels.

FLOPs are the matrix-multiply FLOPs (2 per multiply-add) over the (query head, key) pairs a
query can see, as the kernels compute them: a forward runs two products per pair (Q K^T and
P V), the dq pass three (Q K^T again, dO V^T, dS K), the dk/dv pass four (Q K^T, P^T dO,
dO V^T, dS^T Q); top-n one (Q Kc^T). Masked-out tiles, softmax exponentials and the gated sum
are not counted, so the figures are a lower bound of what the GPU executes.

Bytes are the minimal traffic: every input read once and every output written once, at the
tensors' own sizes (activations in ``elem`` bytes, lse and delta float32, indices int64); a
kernel that reads K/V blocks once per query, as the selected branch does, moves more.

Shapes: prefill of S tokens, B sequences, HQ query heads in H KV groups, head dim K.
"""
from __future__ import annotations

from dataclasses import dataclass

from nsa.attention.config import NSAConfig

F32, I64 = 4, 8  # bytes of an lse/delta element and of a block index

#: FLOPs per visible pair and head dim, per matrix product
_PRODUCT = 2
_FWD_PRODUCTS, _DQ_PRODUCTS, _DKV_PRODUCTS = 2, 3, 4


@dataclass(frozen=True)
class Shape:
    B: int
    S: int
    HQ: int
    H: int
    K: int
    elem: int = 2
    """Bytes per activation element (bf16: 2)."""

    def tokens(self, heads: int, rows: int | None = None) -> int:
        """Elements of a [B, rows (default S), heads, K] tensor."""
        return self.B * (self.S if rows is None else rows) * heads * self.K


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.bytes + other.bytes)

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12

    def gbps(self, ms: float) -> float:
        return self.bytes / (ms * 1e-3) / 1e9


def compressed_tokens(S: int, cfg: NSAConfig) -> int:
    """Nc: compressed tokens of S positions (token i covers [i*d, i*d + l))."""
    return max(0, (S - cfg.cmp_block) // cfg.cmp_stride + 1)


def cmp_pairs(S: int, cfg: NSAConfig) -> int:
    """Visible (query, compressed token) pairs of one head: sum over t of
    floor((t + 1 - l) / d) + 1 for t >= l - 1."""
    return sum((t + 1 - cfg.cmp_block) // cfg.cmp_stride + 1 for t in range(cfg.cmp_block - 1, S))


def sel_pairs(S: int, cfg: NSAConfig) -> int:
    """Visible (query, key) pairs of one head in the selected branch: a query in block jt sees
    all t + 1 earlier keys while jt < n (every block is selected), else n - 1 whole blocks of
    l' and its own block up to itself."""
    ls, n = cfg.sel_block, cfg.n_selected
    return sum(t + 1 if t // ls < n else (n - 1) * ls + t % ls + 1 for t in range(S))


def win_pairs(S: int, cfg: NSAConfig) -> int:
    """Visible pairs of one head in the window branch: min(t + 1, w) keys for query t."""
    return sum(min(t + 1, cfg.window) for t in range(S))


def causal_pairs(S: int) -> int:
    """Full causal attention: t + 1 keys for query t."""
    return S * (S + 1) // 2


def _attention(x: Shape, pairs: int, n_keys: int, products: int, reads: int, writes: int,
               stats: int) -> Work:
    """``products`` matrix products over ``pairs`` per query head; ``reads``/``writes`` query
    shaped tensors ([B, S, HQ, K]) plus the keys and values ([B, n_keys, H, K], read once, and
    written once more when writes counts their gradients: see the callers) and ``stats``
    float32 [B, S, HQ] tensors (lse, delta)."""
    q_like = x.tokens(x.HQ) * x.elem
    kv = 2 * x.tokens(x.H, n_keys) * x.elem
    return Work(_PRODUCT * products * x.K * pairs * x.B * x.HQ,
                (reads + writes) * q_like + kv + stats * x.B * x.S * x.HQ * F32)


def attention_fwd(x: Shape, pairs: int, n_keys: int) -> Work:
    """A forward: reads q, k, v; writes o and lse."""
    return _attention(x, pairs, n_keys, _FWD_PRODUCTS, reads=1, writes=1, stats=1)


def attention_bwd(x: Shape, pairs: int, n_keys: int) -> Work:
    """A whole backward (dq pass + dk/dv pass): reads q, k, v, o, dO, lse; writes dq, dk, dv."""
    dkv = 2 * x.tokens(x.H, n_keys) * x.elem
    w = _attention(x, pairs, n_keys, _DQ_PRODUCTS + _DKV_PRODUCTS, reads=3, writes=1, stats=1)
    return Work(w.flops, w.bytes + dkv)


def topn(x: Shape, cfg: NSAConfig) -> Work:
    """Importance scores and top-n: Q Kc^T over the visible compressed tokens; reads q, kc and
    the lse, writes idx [B, S, H, n]."""
    nc = compressed_tokens(x.S, cfg)
    return Work(_PRODUCT * x.K * cmp_pairs(x.S, cfg) * x.B * x.HQ,
                (x.tokens(x.HQ) + x.tokens(x.H, nc)) * x.elem + x.B * x.S * x.HQ * F32
                + x.B * x.S * x.H * cfg.n_selected * I64)


def cmp_fwd(x: Shape, cfg: NSAConfig) -> Work:
    return attention_fwd(x, cmp_pairs(x.S, cfg), compressed_tokens(x.S, cfg))


def cmp_bwd(x: Shape, cfg: NSAConfig) -> Work:
    return attention_bwd(x, cmp_pairs(x.S, cfg), compressed_tokens(x.S, cfg))


def win_fwd(x: Shape, cfg: NSAConfig) -> Work:
    return attention_fwd(x, win_pairs(x.S, cfg), x.S)


def win_bwd(x: Shape, cfg: NSAConfig) -> Work:
    return attention_bwd(x, win_pairs(x.S, cfg), x.S)


def _idx_bytes(x: Shape, cfg: NSAConfig) -> int:
    return x.B * x.S * x.H * cfg.n_selected * I64


def sel_fwd(x: Shape, cfg: NSAConfig) -> Work:
    """Selected forward: the attention forward plus reading idx."""
    return attention_fwd(x, sel_pairs(x.S, cfg), x.S) + Work(0, _idx_bytes(x, cfg))


def _kept_bytes(x: Shape, cfg: NSAConfig, keep: str) -> int:
    """What the dk/dv pass keeps for dq at long contexts (nsa.kernels.selection._dq_source), per
    (token, query head, selected block): K values of a dq partial ('dq') or l' of a dS tile
    ('ds'); nothing for ''."""
    width = {"": 0, "dq": x.K, "ds": cfg.sel_block}[keep]
    return x.B * x.S * x.HQ * cfg.n_selected * width * x.elem


def sel_dq(x: Shape, cfg: NSAConfig, keep: str = "") -> Work:
    """Selected dq pass. The dq kernel: reads q, k, v, o, dO, lse, idx; writes dq and delta.
    Long contexts, from what the dk/dv pass kept (keep): 'ds', dS K alone (reads k, the tiles
    and idx); 'dq', the sum of the dq partials (reads them and idx). Both write dq."""
    if keep == "ds":
        return Work(_PRODUCT * x.K * sel_pairs(x.S, cfg) * x.B * x.HQ,
                    x.tokens(x.HQ) * x.elem + x.tokens(x.H) * x.elem + _kept_bytes(x, cfg, keep)
                    + _idx_bytes(x, cfg))
    if keep == "dq":
        return Work(0, x.tokens(x.HQ) * x.elem + _kept_bytes(x, cfg, keep) + _idx_bytes(x, cfg))
    return _attention(x, sel_pairs(x.S, cfg), x.S, _DQ_PRODUCTS, reads=3, writes=1, stats=2) \
        + Work(0, _idx_bytes(x, cfg))


def sel_dkv(x: Shape, cfg: NSAConfig, keep: str = "") -> Work:
    """Selected dk/dv pass: reads q, k, v, dO, lse, delta, idx; writes dk, dv, and what it
    keeps for dq (keep, see sel_dq; the dq partials cost one product more)."""
    dkv = 2 * x.tokens(x.H) * x.elem
    products = _DKV_PRODUCTS + (keep == "dq")
    w = _attention(x, sel_pairs(x.S, cfg), x.S, products, reads=2, writes=0, stats=2)
    return w + Work(0, dkv + _idx_bytes(x, cfg) + _kept_bytes(x, cfg, keep))


def sel_bwd(x: Shape, cfg: NSAConfig, keep: str = "") -> Work:
    """keep: dq from what the dk/dv pass kept (see sel_dq); delta = rowsum(dO O) then has a
    pass of its own (reads o and dO, writes delta)."""
    delta = Work(0, 2 * x.tokens(x.HQ) * x.elem + x.B * x.S * x.HQ * F32) if keep else Work(0, 0)
    return sel_dq(x, cfg, keep) + sel_dkv(x, cfg, keep) + delta


def core_fwd(x: Shape, cfg: NSAConfig) -> Work:
    """The NSA core forward: top-n, the three branches, and the gated sum (reads the gates and
    three branch outputs, writes o)."""
    combine = Work(0, x.B * x.S * x.HQ * 3 * x.elem + 4 * x.tokens(x.HQ) * x.elem)
    return topn(x, cfg) + cmp_fwd(x, cfg) + sel_fwd(x, cfg) + win_fwd(x, cfg) + combine


def core_bwd(x: Shape, cfg: NSAConfig, keep: str = "") -> Work:
    """The NSA core backward: the three branches' and the gated sum's (reads gates, three
    outputs and dO; writes dgates and three output gradients); keep: see sel_bwd."""
    gates = x.B * x.S * x.HQ * 3 * x.elem
    combine = Work(0, 2 * gates + 7 * x.tokens(x.HQ) * x.elem)
    return cmp_bwd(x, cfg) + sel_bwd(x, cfg, keep) + win_bwd(x, cfg) + combine


def causal_fwd(x: Shape) -> Work:
    return attention_fwd(x, causal_pairs(x.S), x.S)


def causal_bwd(x: Shape) -> Work:
    return attention_bwd(x, causal_pairs(x.S), x.S)
