"""The NSA stages' named ranges (nsa.cmp, nsa.select, nsa.sel, nsa.win, nsa.gate_combine), which
torch.profiler attributes time to (the profile phase checks them) and which become NVTX ranges
under torch.autograd.profiler.emit_nvtx.

A range is entered only while a profiler records: with none, record_function still costs a
dispatcher call each way (several microseconds, a dozen a layer's forward), which an eager layer
bound by its host pays on every call. A compiled layer has none: torch.compile drops
record_function from what it traces (with a warning), so the trace gets a context that does
nothing instead."""
from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function

_NONE = contextlib.nullcontext()


def stage_range(name: str):
    """record_function(name) while a profiler (or emit_nvtx) records, outside a torch.compile
    trace; else a context that does nothing."""
    if not torch.compiler.is_compiling() and torch._C._autograd._profiler_enabled():
        return record_function(name)
    return _NONE
