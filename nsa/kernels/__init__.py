"""The NSA kernels: plain functions over tensors and ints, leaves of the package (they import
nothing from nsa.attention or any layer above). nsa.attention.kernel_branches turns the NSA
config into their arguments and nsa.attention.backends routes each stage to one of them.

module            public function                 what it computes
band_attention    band_attention                  softmax attention over one key interval per query:
                                                  the compressed branch and the window branch
topk              select_blocks                   importance scores and top-n blocks, fused
selection         selected_attention              attention over each query's selected blocks
selection_blocks  blocks_forward                  its forward key-block-major (attn.sel_form)
combine           gate_combine                    the gated sum of the three branches, fused
gated_branches    gated_branches                  the selected and window branches and the gated sum
                                                  as one op, without the glue between their backwards
cudnn_compressed  cudnn_cmp_attention             the compressed branch on cuDNN's fused attention
                                                  (long bf16/fp16 prefill), band kernel otherwise
rope              rope_split, project_split       RoPE on the projections and their split into the
                                                  branches' contiguous tensors, one kernel each way;
                                                  project_split also makes the gates from one
                                                  stacked projection's output, whose gradient its
                                                  backward writes whole
window            flex_window_attention,          the window branch on FlexAttention / flash-attn
                  flash_attn_window_attention
phi_mlp           phi_mlp_forward,                the key and value compressors' MLP, one kernel
                  phi_mlp_backward                forward and three backward (nsa.attention.phi_mlp
                                                  makes them one autograd node)

Shared by the Triton files: _softmax.py (log2(e), the log-sum-exp convention: natural log in
memory, base 2 in registers; the online-softmax step, its finish and its gradient) and
_autograd.py (the custom-op / fake / autograd wiring of a forward/backward pair); _tma.py (TMA
descriptors over K/V, which the selected forward loads its blocks through on sm_90 and later);
_launch.py (the float32 products' precision, launch configurations that fit the GPU);
_inverse.py (the inverse of a selection: the tokens that chose each key block); tuning.py (launch
parameters and kernel variants as frozen dataclasses, handed to the public functions as
``tuning`` arguments: the measured defaults, or what a sweep or a test asks for); _ranges.py (the
stages' named profiler ranges, entered only while a profiler records).

Importing this package is cheap and imports no Triton: whether Triton interprets a kernel
(TRITON_INTERPRET=1, CPU) is fixed when its @triton.jit runs, so the kernel modules are imported
when a route needs them (nsa.attention.backends.preload). The Triton kernel pairs are torch custom
ops named nsa::* (see _autograd.py); the profile phase counts launches by those names and by
``triton_kernel_names()``.
"""
from __future__ import annotations

#: the largest head dim the Triton kernels take: their tiles hold a whole head (up to 256 lanes),
#: and launch configurations that do not fit the GPU at 256 fall back to smaller ones (_launch)
MAX_HEAD_DIM = 256

#: the most positions a sequence may have: the kernels hold a token's position in int32 (the
#: inverse selection's tokens, _inverse.py; the token-major launches' program ids), so positions
#: 0..2**31 - 1. RoPE takes any (float64 angles of int64 positions); memory ends a run far sooner.
MAX_POSITIONS = 2**31

#: the forms of the selected branch's forward (nsa.kernels.selection._sel_fwd): 'tiles'
#: token-major, 'blocks' key-block-major (selection_blocks), 'auto' by shape (forward_form)
SEL_FORMS = ("auto", "tiles", "blocks")

#: the cuDNN compressed branch hands sequences shorter than this to the Triton band kernel, which
#: is faster there (the compressed branch's fwd+bwd on each: bench/bench_nsa.py --breakdown)
CUDNN_MIN_QUERIES = 16384
#: and it takes cuDNN only where the queries hold at least this many elements (Tq * HQ * K): with
#: few heads the fold's host work costs more than cuDNN saves on the GPU (the m7c_125m layer at
#: 16k and 32k: bench/nsa_vs_dense.py --parts layer host, with --nsa-set model.attn.backend_cmp=triton)
CUDNN_MIN_ELEMENTS = 2**25
#: the head dims cuDNN's fused attention is used for (the compressed branch's fold, the dense layer)
CUDNN_MAX_HEAD_DIM = 128


def cudnn_folds(queries: int, heads: int, head_dim: int, l: int, d: int, q_start: int = 0,
                deterministic: bool = False) -> bool:
    """Whether cudnn_compressed.cudnn_cmp_attention runs a call of these sizes on cuDNN's fold
    rather than the band kernel: a prefill (q_start 0) of CUDNN_MIN_QUERIES queries or more whose
    query tensor holds CUDNN_MIN_ELEMENTS elements or more (queries x heads x head_dim), head dims up
    to CUDNN_MAX_HEAD_DIM, a whole run of d queries that sees a compressed token (of l positions),
    and no fixed summation order asked for (cuDNN's backward promises none). Cheap and Triton-free,
    so that what a route ran can be said without running it (nsa.model.telemetry.backend_report)."""
    whole_runs = (queries - (l - 1)) // d
    return (not deterministic and q_start == 0 and queries >= CUDNN_MIN_QUERIES
            and queries * heads * head_dim >= CUDNN_MIN_ELEMENTS and head_dim <= CUDNN_MAX_HEAD_DIM
            and whole_runs > 0)


def triton_kernel_names() -> set[str]:
    """The names of this package's Triton kernels as a profiler reports their launches (imports
    Triton and the kernel modules). Jitted helpers are inlined into the kernels, which are the
    ``*_kernel`` functions."""
    from triton.runtime.jit import JITFunction

    from . import _inverse, band_attention, combine, phi_mlp, rope, selection, selection_blocks, topk

    return {obj.fn.__name__
            for module in (_inverse, band_attention, combine, phi_mlp, rope, selection, selection_blocks, topk)
            for obj in vars(module).values()
            if isinstance(obj, JITFunction) and obj.fn.__name__.endswith("_kernel")}
