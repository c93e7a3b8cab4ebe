"""The cosine schedule with linear warm-up."""
from __future__ import annotations

import pytest

from nsa.train.config import TrainConfig
from nsa.train.optim import lr_at


def cfg(**kw) -> TrainConfig:
    base = dict(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    return TrainConfig(**{**base, **kw})


def test_warmup_is_linear_and_reaches_the_peak():
    c = cfg()
    assert lr_at(0, c) == pytest.approx(1e-4)
    assert lr_at(4, c) == pytest.approx(5e-4)
    assert lr_at(9, c) == pytest.approx(1e-3)
    assert lr_at(10, c) == pytest.approx(1e-3)


def test_cosine_decays_monotonically_to_the_floor():
    c = cfg()
    lrs = [lr_at(s, c) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lrs[-1] == pytest.approx(1e-4)
    assert lr_at(10 + 45, c) == pytest.approx(1e-4 + 0.5 * 9e-4, rel=0.05)  # about half way


def test_no_warmup_and_short_runs():
    assert lr_at(0, cfg(warmup_steps=0)) == pytest.approx(1e-3)
    assert lr_at(0, cfg(steps=1, warmup_steps=0)) == pytest.approx(1e-3)
    assert lr_at(2, cfg(steps=3, warmup_steps=5)) == pytest.approx(1e-3)  # warm-up clamped to the run
