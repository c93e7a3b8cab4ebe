"""Fast NSA backends (Triton kernels and library attention), registered with
nsa.attention.backends on import when their dependencies are present.

Stage  name        implementation
cmp    triton      nsa.kernels.compressed.triton_cmp_attention (band attention + lse)
cmp    cudnn       nsa.kernels.cudnn_compressed.cudnn_cmp_attention (cuDNN fused attention over
                   folded query runs for long bf16/fp16 prefill; the band kernel otherwise)
select triton      nsa.kernels.topk.triton_select_blocks (fused scores + top-n)
select cudnn       the same Triton scores + top-n (the select stage follows attn.backend_cmp)
sel    triton      nsa.kernels.selection.triton_sel_attention (group-centric)
win    triton      nsa.kernels.window.triton_win_attention (band attention)
win    flex        FlexAttention with a sliding-window block mask (CUDA)
win    flash_attn  flash-attn local attention (CUDA, when importable)
(gated sum, with sel=triton)  nsa.kernels.combine.triton_gate_combine

The kernel modules are imported on first call, not here: whether Triton interprets a kernel
(TRITON_INTERPRET=1, CPU) is fixed when its @triton.jit runs, and importing nsa.kernels must
stay cheap. On CUDA these backends outrank the PyTorch path; on CPU the Triton ones report
themselves unusable unless TRITON_INTERPRET=1 is set, and even then rank below PyTorch, so
'auto' keeps choosing torch on CPU (the interpreter is for tests, by name).
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import torch

from nsa.attention.backends import register, register_combine

#: the cuDNN compressed branch hands sequences shorter than this to the Triton band kernel, which
#: is faster there. H100, 64 query / 4 KV heads, head dim 128, bf16, cmp branch fwd+bwd
#: (python bench/gpu/cudnn_fold_probe.py): 16k 4.32 ms cuDNN vs 3.81 band, 32k 11.79 vs 12.76,
#: 64k 37.39 vs 52.04
CUDNN_MIN_QUERIES = 32768

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HALF = (torch.float16, torch.bfloat16)  # what cuDNN's fused attention takes


def _triton_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if dtype not in _KERNEL_DTYPES:
        return False, f"the Triton kernels take float16/bfloat16/float32, not {dtype}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return True, "Triton kernels on CUDA"
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "Triton kernels need CUDA (or TRITON_INTERPRET=1 on CPU)"
        if dtype == torch.bfloat16:
            return False, "the Triton interpreter computes bfloat16 wrongly; use float32 on CPU"
        return True, "Triton interpreter (TRITON_INTERPRET=1)"
    return False, f"Triton kernels do not run on {device.type}"


def _flex_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "FlexAttention backend is registered for CUDA only"
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False, "this torch has no torch.nn.attention.flex_attention"
    if dtype not in _KERNEL_DTYPES:
        return False, f"FlexAttention takes float16/bfloat16/float32, not {dtype}"
    return True, "FlexAttention sliding-window block mask"


def _flash_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if importlib.util.find_spec("flash_attn") is None:
        return False, "flash_attn is not installed"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "flash-attn needs CUDA"
    if dtype not in (torch.float16, torch.bfloat16):
        return False, f"flash-attn takes float16/bfloat16, not {dtype}"
    return True, "flash-attn local attention"


def _cudnn_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "cuDNN fused attention is registered for CUDA only"
    if not torch.backends.cudnn.is_available() or (torch.backends.cudnn.version() or 0) < 90000:
        return False, f"cuDNN fused attention needs cuDNN >= 9 (found {torch.backends.cudnn.version()})"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return False, "cuDNN fused attention needs compute capability >= 8.0"
    if dtype not in _HALF:
        return False, f"cuDNN fused attention takes float16/bfloat16, not {dtype}"
    ok, why = _triton_available(device, dtype)  # short sequences, the tail, decode: band kernel
    if not ok:
        return False, f"the cuDNN compressed branch needs the Triton band kernel too: {why}"
    return True, (f"cuDNN fused attention over folded query runs for prefill of >= "
                  f"{CUDNN_MIN_QUERIES} queries, Triton band kernel otherwise")


def _cuda_first(device: torch.device, dtype: torch.dtype) -> int:
    """Priority of a fast backend: above torch (0) on CUDA, below it elsewhere."""
    return 10 if device.type == "cuda" else -1


def _cuda_only(rank: int, dtypes=_KERNEL_DTYPES):
    """Priority of a CUDA-only library backend: not a candidate elsewhere or for other dtypes."""
    return lambda device, dtype: rank if device.type == "cuda" and dtype in dtypes else None


class _Lazy:
    """A stand-in for nsa.kernels.<module>.<name>, imported on its first call or by
    ``load()``. Routes load their implementations when resolved (backends.preload), so
    torch.compile never traces the import: that would break the graph at every NSA call."""

    def __init__(self, module: str, name: str):
        self.module, self.__name__, self.target = module, name, None

    def load(self):
        if self.target is None:
            self.target = getattr(importlib.import_module(f"nsa.kernels.{self.module}"), self.__name__)
        return self.target

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)


register("cmp", "triton", _Lazy("compressed", "triton_cmp_attention"), _triton_available, _cuda_first)
register("select", "triton", _Lazy("topk", "triton_select_blocks"), _triton_available, _cuda_first)
# cuDNN runs the compressed branch of long bf16/fp16 prefill; its scores and top-n stay Triton
register("cmp", "cudnn", _Lazy("cudnn_compressed", "cudnn_cmp_attention"), _cudnn_available, _cuda_only(11, _HALF))
register("select", "cudnn", _Lazy("topk", "triton_select_blocks"), _cudnn_available, _cuda_only(11, _HALF))
register("sel", "triton", _Lazy("selection", "triton_sel_attention"), _triton_available, _cuda_first)
register("win", "triton", _Lazy("window", "triton_win_attention"), _triton_available, _cuda_first)
# the gated sum of the branches, fused, whenever the selected branch runs on Triton
register_combine("triton", _Lazy("combine", "triton_gate_combine"))
register("win", "flex", _Lazy("window", "flex_win_attention"), _flex_available, _cuda_only(5))
# flash-attn is an optional extra: when it is not installed it is no candidate, so its absence
# is not reported as a fallback
_FLASH_RANK = _cuda_only(8) if importlib.util.find_spec("flash_attn") is not None else (lambda device, dtype: None)
register("win", "flash_attn", _Lazy("window", "flash_attn_win_attention"), _flash_available, _FLASH_RANK)

#: the modules that define this package's Triton kernels
_TRITON_MODULES = ("band_attention", "combine", "selection", "topk")


def triton_kernel_names() -> set[str]:
    """The names of this package's Triton kernels as a profiler reports their launches (imports
    Triton and the kernel modules). Jitted helpers are inlined into the kernels, which are the
    ``*_kernel`` functions."""
    from triton.runtime.jit import JITFunction

    names = set()
    for module in _TRITON_MODULES:
        for obj in vars(importlib.import_module(f"nsa.kernels.{module}")).values():
            if isinstance(obj, JITFunction) and obj.fn.__name__.endswith("_kernel"):
                names.add(obj.fn.__name__)
    return names
