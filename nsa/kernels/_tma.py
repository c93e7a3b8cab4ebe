"""TMA descriptors for K/V blocks: on sm_90 and later a block of keys comes into shared memory by
one bulk copy of a box, where pointer loads need an address per lane (in an sm_90 compile of the
selected forward, descriptors leave registers to spare where pointers spill). Used by the selected branch's forward (selection._tma).
Triton's interpreter runs descriptor loads too, so the CPU tests cover both paths.
"""
from __future__ import annotations

import torch

try:  # host-built descriptors (Triton >= 3.4); without them the kernels load by pointers
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


def _box(n: int) -> bool:
    return 16 <= n <= 256 and n & (n - 1) == 0


def kv_tma_ok(k: torch.Tensor, box_rows: int) -> bool:
    """Whether k [B, Tk, H, K] (and v, alike) can be read through kv_desc with boxes of
    box_rows keys: a Triton with host descriptors, a GPU with TMA (sm_90 on) or the CPU
    interpreter, box sides powers of two from 16 to 256, k 16-byte aligned and its rows
    addressable by int32 coordinates."""
    K = k.shape[-1]
    return (TensorDescriptor is not None and _box(K) and _box(box_rows)
            and (not k.is_cuda or torch.cuda.get_device_capability(k.device)[0] >= 9)
            and k.data_ptr() % 16 == 0 and k.numel() // K < 2**31)


def kv_desc(t: torch.Tensor, box_rows: int):
    """A descriptor over t [B, Tk, H, K] viewed [B * Tk, H * K] (contiguous), box [box_rows, K]:
    box_rows consecutive keys of one KV head at row b * Tk + key, column h * K."""
    B, Tk, H, K = t.shape
    return TensorDescriptor.from_tensor(t.view(B * Tk, H * K), [box_rows, K])
