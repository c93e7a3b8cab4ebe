"""A kernel op runs its plain implementation in eager mode and the custom op while a graph is
traced (nsa.kernels._autograd.run_op): a dispatch mode that only watches the ops
(``WatchingMode``, what `bench/host_profile.py --origins` counts under) sees the eager path,
any other dispatch mode the traced one."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nsa.kernels._autograd import WatchingMode, run_op


def _op(*args):
    return "custom op"


def _eager(*args):
    return "eager implementation"


class _Watch(WatchingMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Trace(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_watching_mode_sees_the_eager_path_and_another_mode_the_custom_op():
    x = torch.ones(3)
    assert run_op(_op, _eager, x) == "eager implementation"
    with _Watch():
        assert run_op(_op, _eager, x) == "eager implementation"
    with _Trace():
        assert run_op(_op, _eager, x) == "custom op"
    with _Watch(), _Trace():  # the innermost mode decides
        assert run_op(_op, _eager, x) == "custom op"
