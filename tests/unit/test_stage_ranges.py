"""The NSA stages' named ranges exist while a profiler records (the profile phase reads them) and
cost no dispatcher call otherwise."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from nsa.attention import NSAAttention
from nsa.attention.config import NSAConfig
from nsa.kernels._ranges import stage_range


def test_a_range_is_entered_only_while_a_profiler_records():
    assert not isinstance(stage_range("nsa.cmp"), record_function)
    with profile(activities=[ProfilerActivity.CPU]):
        assert isinstance(stage_range("nsa.cmp"), record_function)


def test_a_profiled_layer_shows_its_stages():
    layer = NSAAttention(48, 4, 2, 16, NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, n_selected=3, window=8),
                         graph_tokens=0)
    x = torch.randn(1, 40, 48)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(x)
    names = {e.name for e in prof.events()}
    assert {"nsa.cmp", "nsa.select", "nsa.sel", "nsa.win", "nsa.gate_combine"} <= names
