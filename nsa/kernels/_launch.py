"""How the Triton kernels are launched: the precision of their float32 products, and launch
configurations that fit the GPU.

Offsets: a kernel addresses the tiles of one sequence with int32 offsets from an int64 base where
they fit (``wide_offsets``): an int64 offset per element of a [rows, head dim] tile holds two
registers per lane, and in an sm_90 compile of the band kernels at the m7c shape those offsets
made their register spills several times as large.

Precision: a float32 ``tl.dot`` runs TF32 products by default in Triton, while PyTorch's float32
matmuls are full float32 precision unless TF32 is allowed (``torch.backends.cuda.matmul.allow_tf32``,
which ``torch.set_float32_matmul_precision('high')`` sets). The kernels take their dots'
``input_precision`` from ``dot_precision`` (a constexpr, so each setting compiles once).

Fit: a launch configuration (tile sizes, pipeline stages, warps) tuned for bf16 at head dim 128
can need more shared memory than the GPU has at float32 or head dim 256 (Triton raises
``OutOfResources: shared memory``). ``launch`` takes the preferred configuration and its smaller fallbacks (``ladder``), tries
them in order until one compiles within the GPU's limits, remembers the one that did for that
kernel and specialisation, and records the fallback with its reason (``fallbacks``); strict
float32 products that fit in no configuration fall back to FMAs (see ``launch``). Triton
raises OutOfResources when it loads the compiled kernel, before anything runs, so a failed try
has no effect on the outputs.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from triton.runtime.errors import OutOfResources

#: (kernel, specialisation, preferred configuration) -> the fallback that fit, where it did not
_FITTED: dict[tuple, dict] = {}
#: kernel and specialisation -> why the preferred configuration was passed over, and for which
_FALLBACKS: dict[str, str] = {}


#: the float32 products' precision where PyTorch allows no TF32 (see dot_precision)
STRICT = "tf32x3"


def wide_offsets(n_elements: int) -> bool:
    """Whether offsets into a span of ``n_elements`` elements (a sequence's keys or query rows,
    from its int64 base) need int64: the kernels' WIDE constexpr."""
    return n_elements >= 2**31


def dot_precision(dtype: torch.dtype) -> str:
    """The ``input_precision`` of the kernels' tl.dot for inputs of ``dtype``: for float32 unless
    PyTorch allows TF32 for float32 matmuls, 'tf32x3' (three TF32 products per product, on the
    tensor cores: float32's accuracy, measured on an H200 by `python bench/selection_exactness.py
    --explain --dot tf32x3`; 'ieee' unrolls into FMAs, which compile several times as long, see
    fp32_small_tiles); else 'tf32' (Triton's default, which half precision inputs ignore)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return STRICT
    return "tf32"


def fp32_small_tiles(dtype: torch.dtype, K: int) -> bool:
    """Whether a launch starts from the small configurations (band_attention.FP32_SMALL_TILES,
    8 warps): float32 inputs with strict products at any head dim, or float32 at head dim > 64
    in any precision. A strict product is three TF32 ones, and with the tiles tuned for bf16 a band
    kernel at K = 64 compiles about four times as long as at 32 x 32 tiles (`python
    bench/compile_offline.py --precision tf32x3`, no GPU needed); at K = 256 the tuned tiles
    need more shared memory than the GPU has in any float32 precision (the ladder then compiles
    the next). `python bench/first_call.py` times a whole first call on a GPU."""
    return dtype == torch.float32 and (K > 64 or dot_precision(dtype) == STRICT)


def ladder(base: dict, halve: Sequence[str] = (), floor: int = 16) -> list[dict]:
    """``base`` (launch keywords: constexpr tile sizes, num_warps, num_stages) and its fallbacks,
    largest first: fewer pipeline stages down to one; then the keys of ``halve`` halved in turn,
    round after round (none below ``floor``), after each halving again from base's stages down."""
    out: list[dict] = []
    cfg = dict(base)
    while True:
        out += [{**cfg, "num_stages": s} for s in range(base["num_stages"], 0, -1)]
        key = next((k for k in sorted(halve, key=lambda k: -cfg[k]) if cfg[k] // 2 >= floor), None)
        if key is None:
            return out
        cfg = {**cfg, key: cfg[key] // 2}


def _describe(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def launch(kernel, grid: Callable[[dict], tuple], args: Sequence, constexprs: dict, base: dict,
           halve: Sequence[str] = (), floor: int = 16) -> dict:
    """kernel[grid(cfg)](*args, **constexprs, **cfg) for ``base``, or, where base does not fit
    the GPU, for the first of its fallbacks (``ladder(base, halve, floor)``) that does; where
    none fits with strict float32 products (DOT = STRICT, whose operands stage through shared
    memory), the same ladder again with 'ieee' products (FMAs, as accurate). Returns the cfg
    launched (with the DOT it overrode). A fallback is remembered per kernel, tensor dtypes,
    constexprs and base (later calls launch it directly) and recorded with its reason
    (``fallbacks``). Raises base's OutOfResources when nothing fits."""
    dtypes = tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
    key = (kernel.fn.__name__, dtypes, tuple(constexprs.items()), tuple(base.items()))
    cfg = _FITTED.get(key, base)
    try:
        kernel[grid(cfg)](*args, **{**constexprs, **cfg})
        return cfg
    except OutOfResources as exc:
        if cfg is not base:
            raise
        why = exc
    # the ladder is built here only, off the per-call path, where building it would cost host time
    # at every launch
    tries = ladder(base, halve, floor)
    if constexprs.get("DOT") == STRICT:
        tries += [{**cfg, "DOT": "ieee"} for cfg in tries]
    for cfg in tries[1:]:
        try:
            kernel[grid(cfg)](*args, **{**constexprs, **cfg})
        except OutOfResources:
            continue
        _FITTED[key] = cfg
        name = f"{kernel.fn.__name__} ({_describe(constexprs)}; {', '.join(map(str, dtypes))})"
        _FALLBACKS[name] = f"{_describe(base)}: {why}; launched {_describe(cfg)}"
        return cfg
    raise why


def fallbacks() -> dict[str, str]:
    """Kernel specialisations launched with a smaller configuration than preferred, and why."""
    return dict(_FALLBACKS)
