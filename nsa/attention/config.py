"""The attention config of the model: NSA's hyper-parameters (paper arXiv 2502.11089 names in
brackets) and backends, or a dense causal attention of the same shape (kind)."""
from __future__ import annotations

import operator
from dataclasses import dataclass

from nsa.kernels import MAX_HEAD_DIM, SEL_FORMS

BRANCHES = ("cmp", "sel", "win")
PHI_KINDS = ("mlp", "mean")
ATTN_KINDS = ("nsa", "dense")
#: the backends each backend key may name besides 'auto': the names of nsa.attention.backends.BACKENDS,
#: kept here as plain data so that a config loads without torch (tests/unit/test_model_config.py
#: checks that the two agree)
BACKEND_CHOICES = {
    "backend_cmp": ("torch", "triton", "cudnn"),
    "backend_sel": ("torch", "triton"),
    "backend_win": ("torch", "triton", "flex", "flash_attn"),
    "backend_dense": ("torch", "cudnn", "flash"),
}


@dataclass(frozen=True)
class NSAConfig:
    """NSA's hyper-parameters and backends, checked when made and frozen after (a layer resolves
    its routes and sizes its parameters from them once). The paper's names: cmp_block l,
    cmp_stride d, sel_block l', n_selected n, window w; phi the compression function; backend_*
    the implementation of each branch ('auto': the fastest that runs on the inputs' device and
    dtype); kind='dense' makes the dense baseline of the same shape."""

    kind: str = "nsa"
    """'nsa', or 'dense': causal attention over all earlier tokens with the same heads, head dim,
    q/k/v projections and RoPE (one k/v pair, no gates), the baseline NSA is measured against;
    the NSA keys below then do not apply."""
    cmp_block: int = 32
    """l: tokens summarised by one compressed token."""
    cmp_stride: int = 16
    """d: stride between compressed tokens; must divide cmp_block and sel_block."""
    sel_block: int = 64
    """l': tokens per selection block."""
    n_selected: int = 16
    """n: selected blocks per query, counting the forced ones (block 0 and the two most recent)."""
    window: int = 512
    """w: sliding window; query t sees keys (t - w, t]."""
    phi: str = "mlp"
    """Compression function: 'mlp' (MLP over the block with intra-block position embedding) or 'mean'."""
    backend_cmp: str = "auto"
    """Backend of the compressed branch and its top-n ('auto', 'torch', 'triton', 'cudnn': cuDNN fused
    attention for bf16/fp16 prefills that nsa.kernels.cudnn_folds takes, of 16384 queries or more holding
    2^25 query elements or more, the Triton band kernel otherwise)."""
    backend_sel: str = "auto"
    """Backend of the selected branch ('auto', 'torch', 'triton')."""
    sel_form: str = "auto"
    """The selected branch's forward on the Triton backend: 'tiles' (token-major: a token's query
    heads, or a tile of tokens, against their selected blocks), 'blocks' (key-block-major: each
    block against the queries that selected it, then a combine) or 'auto' (chosen by group size,
    head dim and length: nsa.kernels.selection.forward_form)."""
    backend_win: str = "auto"
    """Backend of the window branch ('auto', 'torch', 'triton', 'flex', 'flash_attn')."""
    backend_dense: str = "auto"
    """Backend of the dense attention of kind=dense ('auto', 'torch': SDPA's own choice of kernel,
    'cudnn', 'flash': that SDPA kernel)."""
    query_chunk: int = 1024
    """Queries processed at once by the PyTorch path; bounds its memory (linear in S)."""

    def __post_init__(self) -> None:
        if self.kind not in ATTN_KINDS:
            raise ValueError(f"attn.kind must be one of {ATTN_KINDS}, got {self.kind!r}")
        for name in ("cmp_block", "cmp_stride", "sel_block", "n_selected", "window", "query_chunk"):
            given = getattr(self, name)
            try:  # any integer (numpy's among them), kept as a Python int
                value = None if isinstance(given, bool) else operator.index(given)
            except TypeError:
                value = None
            if value is None:
                raise ValueError(f"attn.{name} must be an integer, got {given!r}")
            object.__setattr__(self, name, value)
            if value < 1 and name != "n_selected":  # n_selected's own minimum is 3 (below)
                raise ValueError(f"attn.{name} must be >= 1, got {getattr(self, name)}")
        if self.cmp_block % self.cmp_stride:
            raise ValueError(
                f"attn.cmp_stride={self.cmp_stride} must divide attn.cmp_block={self.cmp_block}"
            )
        if self.sel_block % self.cmp_stride:
            raise ValueError(
                f"attn.cmp_stride={self.cmp_stride} must divide attn.sel_block={self.sel_block}"
            )
        if self.cmp_block > self.sel_block:
            raise ValueError(
                f"attn.cmp_block={self.cmp_block} must be <= attn.sel_block={self.sel_block}"
            )
        if self.n_selected < 3:
            raise ValueError(
                f"attn.n_selected={self.n_selected} must be >= 3 (block 0 and the two most recent "
                "blocks are always selected)"
            )
        for key, names in BACKEND_CHOICES.items():
            if getattr(self, key) not in ("auto", *names):
                raise ValueError(f"attn.{key} must be one of {('auto', *names)}, got {getattr(self, key)!r}")
        if self.sel_form not in SEL_FORMS:
            raise ValueError(f"attn.sel_form must be one of {SEL_FORMS}, got {self.sel_form!r}")
        if self.phi not in PHI_KINDS:
            raise ValueError(f"attn.phi must be one of {PHI_KINDS}, got {self.phi!r}")

    def check_head_dim(self, head_dim: int, key: str = "model.head_dim") -> None:
        """Refuse a head dim the routes could send to a kernel that does not take it: above
        nsa.kernels.MAX_HEAD_DIM unless every NSA stage is on the PyTorch path. ``key``: the head
        dim's name in the error (the model config's, or a layer's argument)."""
        backends = {k: getattr(self, k) for k in ("backend_cmp", "backend_sel", "backend_win")}
        if self.kind == "nsa" and head_dim > MAX_HEAD_DIM and set(backends.values()) != {"torch"}:
            on = ", ".join(f"attn.{k}={v}" for k, v in backends.items() if v != "torch")
            raise ValueError(
                f"{key}={head_dim}: the NSA kernels take head dims up to {MAX_HEAD_DIM} ({on} may "
                "route to them); use a smaller head dim or set attn.backend_cmp, attn.backend_sel and "
                "attn.backend_win to torch"
            )
