"""The trainer's memory figures (nsa/train/telemetry.py memory_gb): on CUDA from one read of the
allocator's nested counters, the same numbers torch.cuda.memory_allocated, memory_reserved and
max_memory_allocated give one call each."""
from __future__ import annotations

import pytest
import torch

from nsa.train.telemetry import GB, cuda_memory_gb, device_memory_gb, memory_gb


def test_cuda_memory_figures_from_the_allocators_nested_counters():
    stats = {"allocated_bytes": {"all": {"current": 3 * GB, "peak": 5 * GB, "allocated": 9 * GB}},
             "reserved_bytes": {"all": {"current": 6 * GB, "peak": 6 * GB}}, "num_alloc_retries": 0}
    assert cuda_memory_gb(stats) == {"mem_alloc_gb": 3.0, "mem_reserved_gb": 6.0, "mem_peak_gb": 5.0}
    # before the allocator has counted anything torch.cuda.memory_allocated gives 0, so do these
    assert cuda_memory_gb({}) == {"mem_alloc_gb": 0.0, "mem_reserved_gb": 0.0, "mem_peak_gb": 0.0}


@pytest.mark.gpu
def test_memory_on_cuda_matches_torchs_one_call_figures():
    dev = torch.device("cuda")
    keep = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # noqa: F841 (held while measured)
    assert memory_gb(dev) == {"mem_alloc_gb": torch.cuda.memory_allocated(dev) / GB,
                              "mem_reserved_gb": torch.cuda.memory_reserved(dev) / GB,
                              "mem_peak_gb": torch.cuda.max_memory_allocated(dev) / GB}


def test_device_memory_on_cpu_is_the_hosts_physical_memory():
    """env.json device_mem_gb: on CPU, where mem_*_gb is the process's resident set, the host's memory
    bounds it (the harness projects when memory that keeps growing would run out)."""
    import os
    total = device_memory_gb(torch.device("cpu"))
    assert total == pytest.approx(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, abs=1e-3)
    assert total > memory_gb(torch.device("cpu"))["mem_reserved_gb"]
