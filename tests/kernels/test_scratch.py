"""On the GPU: the kernels' largest temporaries come from a pool of their own (nsa.kernels._scratch),
except inside a CUDA graph capture, where they must come from the graph's pool."""
from __future__ import annotations

import pytest
import torch

from nsa.kernels._scratch import _POOLS, scratch

pytestmark = pytest.mark.gpu


def _pool_of(t: torch.Tensor) -> tuple[int, int]:
    """The id of the allocator pool whose segment holds t's memory ((0, 0): the common pool)."""
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]:
            return tuple(seg.get("segment_pool_id", (0, 0)))
    raise AssertionError("no segment holds the tensor")


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


def test_a_temporary_comes_from_the_scratch_pool_and_its_memory_serves_the_next_one(cuda):
    with scratch(cuda):
        first = torch.empty(64 << 20, dtype=torch.uint8, device=cuda)
    pool = _POOLS[torch.cuda.current_device()]
    assert _pool_of(first) == tuple(pool.id)
    where = first.data_ptr()
    plain = torch.empty(1 << 20, dtype=torch.uint8, device=cuda)
    assert _pool_of(plain) != tuple(pool.id)
    del first
    between = torch.empty(32 << 20, dtype=torch.uint8, device=cuda)  # the common pool's: cannot split it
    with scratch(cuda):
        second = torch.empty(64 << 20, dtype=torch.uint8, device=cuda)
    assert second.data_ptr() == where
    assert _pool_of(between) != tuple(pool.id)


def test_inside_a_graph_capture_a_temporary_comes_from_the_graphs_pool(cuda):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with scratch(cuda):
            t = torch.empty(1 << 20, dtype=torch.uint8, device=cuda)
        t.fill_(1)
    assert _pool_of(t) == tuple(graph.pool())
