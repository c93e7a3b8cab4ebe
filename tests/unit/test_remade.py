"""nsa.attention.remade: saved tensors kept as how to make them again, made once per backward,
registered before or after an op saved them; the gradients those of the tensors themselves."""
from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from nsa.attention.remade import Remaking


def _graph(remake: bool, register_late: bool = False):
    """y = sum(sin(h) * h[::2].repeat(2)) with h = x @ w, h made again from x and w: sin and the
    product save h and a view of it. Returns y, the leaves, h's weak reference, and the count of
    h's remakings."""
    torch.manual_seed(0)
    x = torch.randn(8, 6, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)
    made = []

    def again():
        made.append(1)
        return [x.detach() @ w.detach()]

    with Remaking() as remaking:
        h = x @ w
        if remake and not register_late:
            remaking.add(again, [h])
        y = (torch.sin(h) * h[::2].repeat(2, 1)).sum()
        if remake and register_late:
            remaking.add(again, [h])
    ref = StorageWeakRef(h.untyped_storage())
    del h
    gc.collect()
    return y, (x, w), ref, made


def test_a_registered_tensor_is_freed_and_made_once_per_backward():
    y_kept, leaves_kept, ref_kept, _ = _graph(remake=False)
    assert not ref_kept.expired()
    grads_kept = torch.autograd.grad(y_kept, leaves_kept)
    for late in (False, True):
        y, leaves, ref, made = _graph(remake=True, register_late=late)
        assert ref.expired(), "the graph holds h"
        grads = torch.autograd.grad(y, leaves, retain_graph=True)
        assert made == [1], "one remaking for the three saved tensors on h's memory"
        for g, ref_g in zip(grads, grads_kept):
            assert torch.equal(g, ref_g)
        again = torch.autograd.grad(y, leaves)  # through the retained graph: made again, same result
        assert len(made) >= 2
        for g, ref_g in zip(again, grads_kept):
            assert torch.equal(g, ref_g)


def test_a_value_read_by_another_recipe_and_tensors_not_registered():
    """value() gives a recipe's tensor to another recipe without keeping the tensor; a saved
    tensor of another dtype on no registered memory is kept as itself."""
    x = torch.randn(5, requires_grad=True)
    with Remaking() as remaking:
        h = x * 3
        remaking.add(lambda: [x.detach() * 3], [h])
        h_again = remaking.value(h)
        g = h.exp()
        remaking.add(lambda: [h_again().exp()], [g])
        y = (g * g).sum() + (x.double() ** 2).sum()
        kept = remaking.value(x.double())
    refs = [StorageWeakRef(t.untyped_storage()) for t in (h, g)]
    del h, g
    gc.collect()
    assert all(r.expired() for r in refs)
    assert torch.equal(kept(), x.double())
    dx, = torch.autograd.grad(y, x)
    torch.testing.assert_close(dx, 6 * (x * 3).exp() ** 2 + 2 * x)


def test_a_tensor_changed_in_place_after_it_was_kept_is_refused():
    """Autograd checks no version of a tensor saved through hooks: the hooks refuse, as autograd
    does, a kept tensor changed in place before the backward reads it, and a recipe whose input
    (read as it is) was."""
    x = torch.randn(6, requires_grad=True)
    with Remaking():
        h = x * 2.0
        y = (h.sin() * 3.0).sum()  # sin keeps h as itself
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()

    w = torch.randn(6)
    with Remaking() as remaking:
        h = x * w
        remaking.add(lambda: [x.detach() * w], [h], reads=[w])
        y = h.sin().sum()
    del h
    w.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
