"""Tensors a layer's backward reads, kept as how to make them again.

``Remaking`` is a pair of saved-tensor hooks: while it is active, a tensor an op saves for its
backward whose memory is that of a tensor registered with ``Remaking.add`` is kept as its recipe
and its view's geometry, not as itself, and the backward gets it from the recipe, which computes
the registered tensors again, bit for bit, from tensors kept anyway. A recipe runs once per
backward: what it made is kept from the first unpack until every tensor packed with it has been
unpacked (another backward through a retained graph makes it again).

Every registered tensor must stay alive while the hooks are active (the caller holds it): its
memory is how a saved tensor is recognised, and a freed block could be handed to another tensor.

Autograd checks no version counter of a tensor saved through hooks, so the hooks check their own:
a tensor kept as itself, and each tensor a recipe reads as it is, must be at the version it had
when it was kept, or the backward raises autograd's in-place error (a layer's input changed in
place between its forward and its backward would otherwise give wrong gradients silently).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def _version(t: torch.Tensor) -> int | None:
    """t's version counter (None for an inference tensor, which has none)."""
    return None if t.is_inference() else t._version


def _check_version(t: torch.Tensor, kept: int | None) -> None:
    """Autograd's error for a saved tensor changed in place since it was kept."""
    now = _version(t)
    if now != kept:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{t.dtype} {list(t.shape)}] is at version {now}; expected version {kept} instead (kept for an "
            "NSA layer's backward that makes tensors again, nsa.attention.remade)")


class Recipe:
    """``make()`` (run without gradients) gives tensors with the values and the memory layout of
    the ones it was registered for, in the same order; ``reads``, the tensors it reads as they
    are, are checked to be at their versions of when it was registered."""

    def __init__(self, make: Callable[[], Sequence[torch.Tensor]], reads: Sequence[torch.Tensor] = ()):
        self._make = make
        self._reads = [(t, _version(t)) for t in reads]
        self._made: list[torch.Tensor] | None = None
        self.pending = 0  # tensors packed with this recipe and not yet unpacked

    def made(self) -> list[torch.Tensor]:
        """The tensors, made now or kept from this backward's first call; kept only while a
        packed tensor awaits them."""
        made = self._made
        if made is None:
            for t, version in self._reads:
                _check_version(t, version)
            with torch.no_grad():
                made = list(self._make())
            if self.pending > 0:
                self._made = made
        return made

    def unpacked(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self._made = None


class _Packed:
    """A saved tensor as the hooks keep it: the tensor itself, or (once its memory is
    registered, also after it was saved) its recipe, index and view geometry."""

    __slots__ = ("tensor", "version", "recipe", "index", "geometry")

    def __init__(self, tensor: torch.Tensor):
        self.tensor: torch.Tensor | None = tensor
        self.version = _version(tensor)
        self.recipe: Recipe | None = None
        self.index = 0
        self.geometry: tuple = ()

    def remake_with(self, recipe: Recipe, index: int) -> None:
        t = self.tensor
        self.recipe, self.index, self.geometry = recipe, index, (t.shape, t.stride(), t.storage_offset())
        self.tensor = None
        recipe.pending += 1

    def unpack(self) -> torch.Tensor:
        if self.tensor is not None:
            _check_version(self.tensor, self.version)
            return self.tensor
        shape, stride, offset = self.geometry
        t = self.recipe.made()[self.index].as_strided(shape, stride, offset)
        self.recipe.unpacked()
        return t


class Remaking:
    """The saved-tensor hooks (a context manager) and the tensors registered with them. A
    tensor may be registered after an op saved it (an op saves its own outputs as it returns
    them): until the hooks exit, ``add`` also turns what was saved on its memory into recipes."""

    def __init__(self):
        # storage data_ptr -> the recipe, the index of the tensor it makes there, and its dtype
        self._registered: dict[int, tuple[Recipe, int, torch.dtype]] = {}
        # storage data_ptr -> what was saved on it so far and kept as tensors: a registration
        # looks up its own tensors' memory, not every tensor saved before it
        self._kept: dict[int, list[_Packed]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _Packed.unpack)

    def __enter__(self) -> Remaking:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._registered.clear()  # the memory may now go to other tensors
        self._kept.clear()

    def add(self, make: Callable[[], Sequence[torch.Tensor]], tensors: Sequence[torch.Tensor],
            reads: Sequence[torch.Tensor] = ()) -> None:
        """Keep each saved tensor on the memory of one of ``tensors`` as ``make``'s tensor of
        the same index (a view of it, where the saved tensor is a view); ``reads``: the tensors
        make reads as they are (see Recipe)."""
        recipe = Recipe(make, reads)
        for index, t in enumerate(tensors):
            storage = t.untyped_storage().data_ptr()
            if storage:  # an empty tensor has no memory to recognise
                self._registered.setdefault(storage, (recipe, index, t.dtype))
                kept = self._kept.get(storage)
                if kept:
                    still = []
                    for packed in kept:
                        found = self._found(packed.tensor)
                        if found is None:
                            still.append(packed)
                        else:
                            packed.remake_with(*found)
                    self._kept[storage] = still

    def add_call(self, fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                 tensors: Sequence[torch.Tensor]) -> None:
        """``add`` with the recipe fn(*inputs), each input's value in the backward as ``value``
        gives it."""
        found = [self._found(t) for t in inputs]
        values = [self._value(t, f) for t, f in zip(inputs, found)]
        self.add(lambda: fn(*(v() for v in values)), tensors,
                 reads=[t for t, f in zip(inputs, found) if f is None])

    def value(self, t: torch.Tensor) -> Callable[[], torch.Tensor]:
        """A function giving t's value in the backward, for another recipe: made again by the
        recipe t's memory is registered with (no reference to t kept), else t itself."""
        return self._value(t, self._found(t))

    @staticmethod
    def _value(t: torch.Tensor, found: tuple[Recipe, int] | None) -> Callable[[], torch.Tensor]:
        if found is None:
            return lambda: t
        recipe, index = found
        shape, stride, offset = t.shape, t.stride(), t.storage_offset()
        return lambda: recipe.made()[index].as_strided(shape, stride, offset)

    def _found(self, t: torch.Tensor) -> tuple[Recipe, int] | None:
        found = self._registered.get(t.untyped_storage().data_ptr())
        if found is None or found[2] != t.dtype:
            return None
        return found[0], found[1]

    def _pack(self, t: torch.Tensor) -> _Packed:
        packed = _Packed(t)
        found = self._found(t)
        if found is None:
            self._kept.setdefault(t.untyped_storage().data_ptr(), []).append(packed)
        else:
            packed.remake_with(*found)
        return packed
