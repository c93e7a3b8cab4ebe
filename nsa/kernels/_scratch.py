"""Memory for the kernels' largest temporaries, from a pool of the caching allocator's own.

The selected branch's partial outputs (its forward), the tiles its dk/dv pass keeps for dq (its
backward) and the top-n scores are an NSA layer's largest allocations: about 0.8, 0.8 and 0.13
GB for a 32k-token layer of m7c_125m, made and freed once a layer. In the allocator's common
pool the block one layer frees is split for what is allocated after it (that layer's saved
tensors, the parameters' gradients, the optimizer's state), so the next layer's request no
longer fits there and takes a new segment: a model of twelve layers ends up holding twelve such
segments, each partly used. From a pool of their own the same block serves every layer, and the
common pool packs the rest (``python bench/peak_holders.py --lengths 32k --segments`` lists the
segments a training step takes, and for which allocation).

Only where it can: on a CUDA device outside a CUDA graph capture (a capture allocates from the
graph's pool) and outside a compiler trace.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

#: device index -> the pool of that device's scratch allocations
_POOLS: dict[int, torch.cuda.MemPool] = {}


@contextlib.contextmanager
def scratch(device: torch.device) -> Iterator[None]:
    """Allocations made inside come from the kernels' scratch pool where one applies (see the
    module docstring); a tensor allocated there returns its memory to that pool when freed."""
    if (device.type != "cuda" or torch.compiler.is_compiling()
            or torch.cuda.is_current_stream_capturing()):
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.get(index)
    if pool is None:
        with torch.cuda.device(index):
            pool = _POOLS[index] = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool, index):
        yield
