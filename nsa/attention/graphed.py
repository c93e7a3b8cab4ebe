"""An NSA layer's forward and backward replayed as two CUDA graphs, in a user's eager model.

Below ~32k tokens an eager NSA layer is bound by the host: its forward + backward enqueues some
sixty kernels, memsets and copies through Python (projections, compression, three branches,
gates), which takes longer than the GPU needs to run them. Replaying the layer as one forward
graph and one backward graph turns that into two launches and a few copies. The trainer captures whole steps itself;
this is for everyone else's model (`python bench/nsa_vs_dense.py --parts layer host` measures
both paths).

A layer's graphs are captured on its second call at a new key (the first runs eagerly, so
Triton compiles and tunes outside the capture): input shape and dtype, autocast state, the
deterministic switch, whether the layer counts its calls, which tensors need gradients, and the
parameters' storage. Each layer
holds its own memory pool: its activations and its backward's buffers stay allocated between
steps, which is why only short inputs are graphed (``GRAPH_TOKENS``, the layer's
``graph_tokens``) and all layers' graphs together hold at most ``MEMORY_SHARE`` of the GPU.

The graphs hold one forward's activations at a time, so a call replays them only when the
layer has no forward waiting for its backward; anything else runs eagerly and is exact:

* a second forward before the first one's backward (two micro-batches in flight) runs eagerly;
* a backward whose activations were overwritten since (a later replay) or already consumed
  (a second backward through a retained graph), or whose parameters are no longer where the
  graphs read them (FSDP2 frees them after the forward and gathers them again for the
  backward), recomputes the layer eagerly from its saved input and differentiates that, unless
  a parameter changed in place since the forward, which it refuses as autograd does;
* torch.compile, a graph being captured already (the trainer's CUDA graphs), a dispatch mode
  or a torch.func transform, saved-tensor hooks (activation checkpointing), no gradient, a
  decode cache or gate telemetry: eager.
"""
from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._python_dispatch import _get_current_dispatch_mode

from nsa.kernels._autograd import NO_DOUBLE_BACKWARD

from .autograd_state import func_transform_active, saved_tensor_hooks_active

#: inputs of up to this many tokens (batch x length) are graphed by default: where the host, not
#: the GPU, sets an eager layer's pace at the seeds' shape (`python bench/nsa_vs_dense.py --parts
#: layer host` prints both); longer inputs would keep large activations allocated between steps
GRAPH_TOKENS = 16384
#: captures a layer may make before it stops graphing (parameters that move every step, such as
#: a sharded model's, would otherwise capture on every call)
MAX_CAPTURES = 4
#: captured keys a layer keeps (the oldest is dropped, and its memory freed, past this)
MAX_KEPT = 2
#: keys seen once and not captured that a layer remembers, the latest: a model whose parameters
#: move every step (FSDP2 gathers them anew) never sees a key twice and would add one a step
MAX_SEEN = 16
#: the share of a GPU's memory the layer graphs of one process may hold, all layers together: a
#: layer's pool keeps its activations and its backward's buffers allocated between steps (about
#: one GB a layer of m7c_125m at 16k tokens, `python bench/nsa_vs_dense.py --parts model`); past
#: the share, or where free memory is short, a layer stays eager
MEMORY_SHARE = 0.25

#: device index -> bytes held by the captured graphs alive, and the last capture's bytes (what
#: the next one is expected to take)
_held: dict[int, int] = {}
_typical: dict[int, int] = {}
#: device index -> the one stream every layer captures on: cuBLAS keeps a workspace per stream it
#: has run on for the life of the process, so a stream per capture would leave one behind each
_capture_streams: dict[int, torch.cuda.Stream] = {}


def _room(device: torch.device) -> bool:
    """Whether another capture fits MEMORY_SHARE and the memory free now (twice its expected size)."""
    need = _typical.get(device.index, 0)
    if _held.get(device.index, 0) + need > MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory:
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) >= 2 * need


def _hold(device: torch.device, entry: object, nbytes: int) -> None:
    """Count ``nbytes`` as held until ``entry`` is garbage."""
    _held[device.index] = _held.get(device.index, 0) + nbytes
    _typical[device.index] = nbytes
    weakref.finalize(entry, _release, device.index, nbytes)


def _release(index: int, nbytes: int) -> None:
    _held[index] -= nbytes

@dataclass
class _Captured:
    """One key's graphs and their static tensors: what a replay reads and writes."""
    fwd: torch.cuda.CUDAGraph
    bwd: torch.cuda.CUDAGraph
    x: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor] | None
    out: torch.Tensor
    grad_out: torch.Tensor
    #: the gradient of x the backward graph writes (None when x needs none)
    grad_x: torch.Tensor | None
    #: the parameters' gradients, packed by the backward graph into one buffer per dtype
    grad_params: _Packed
    #: the parameters' data_ptrs the graphs read: a sharded model's parameters are gathered
    #: anew before the backward, maybe elsewhere, and the backward graph cannot follow them
    param_ptrs: tuple[int, ...] = ()
    #: the autocast state captured (enabled, dtype), which a recomputation takes again
    autocast: tuple[bool, torch.dtype] = (False, torch.bfloat16)
    #: forward replays so far; a backward replays only for the latest, once
    generation: int = 0
    consumed: bool = True
    #: the autograd context of the latest replay while its backward is owed (see pending)
    owed: Callable[[], object] = field(default=lambda: None)

    def pending(self) -> bool:
        """Whether the latest replay's backward has not run and still can (its graph is alive)."""
        return not self.consumed and self.owed() is not None


@dataclass
class _Packed:
    """Gradients packed into one flat buffer per dtype, so that a replay hands out fresh copies
    of them all in one copy per dtype (a caller may keep a gradient past the next replay)."""
    flats: dict[torch.dtype, torch.Tensor]
    #: per gradient: None, or its dtype, offset and shape in that dtype's buffer
    where: list[tuple[torch.dtype, int, torch.Size] | None]

    @staticmethod
    def pack(grads: list[torch.Tensor | None]) -> _Packed:
        """Inside the capture: the flat buffers the backward graph fills."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        where: list[tuple[torch.dtype, int, torch.Size] | None] = []
        for g in grads:
            if g is None:
                where.append(None)
                continue
            parts = by_dtype.setdefault(g.dtype, [])
            where.append((g.dtype, sum(t.numel() for t in parts), g.shape))
            parts.append(g)
        return _Packed({d: torch.cat([t.reshape(-1) for t in parts]) for d, parts in by_dtype.items()}, where)

    def copies(self) -> list[torch.Tensor | None]:
        fresh = {d: flat.clone() for d, flat in self.flats.items()}
        return [None if w is None else fresh[w[0]][w[1]:w[1] + w[2].numel()].view(w[2]) for w in self.where]


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class LayerGraphs:
    """The CUDA graphs of one layer (see the module docstring), for inputs of up to ``max_tokens``
    tokens (0: none). The layer gives ``eager_forward(x, None, rope)``, ``parameters()``, its
    ``calls`` counter and ``count_calls``. A copy or a pickle of the layer starts without graphs."""

    def __init__(self, max_tokens: int = GRAPH_TOKENS):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"graph_tokens (the most tokens a layer graphs) must be an integer >= 0 (0: never), "
                             f"got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.captured: OrderedDict[tuple, _Captured] = OrderedDict()
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.captures = 0
        self.disabled = False
        #: whether the last capture this layer wanted did not fit (see MEMORY_SHARE)
        self.short_of_memory = False

    def __deepcopy__(self, memo) -> LayerGraphs:
        return LayerGraphs(self.max_tokens)

    def __getstate__(self) -> dict:
        return {"max_tokens": self.max_tokens}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_tokens"])

    def applies(self, x: torch.Tensor) -> bool:
        """Whether this call may replay or capture graphs at all."""
        return (not torch.compiler.is_compiling() and not self.disabled and x.is_cuda
                and 0 < x.shape[0] * x.shape[1] <= self.max_tokens
                and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
                and _get_current_dispatch_mode() is None and type(x) is torch.Tensor
                and not func_transform_active()
                and not torch.cuda.is_current_stream_capturing()
                and not saved_tensor_hooks_active())

    @staticmethod
    def _key(x: torch.Tensor, rope, params: list[torch.Tensor], counting: bool) -> tuple:
        from nsa.attention.kernel_branches import deterministic

        return (tuple(x.shape), x.dtype, x.device, x.requires_grad, _autocast_state("cuda"), deterministic(), counting,
                None if rope is None else tuple((t.shape, t.dtype, t.device) for t in rope),
                tuple((p.data_ptr(), p.dtype, p.requires_grad) for p in params))

    def __call__(self, layer, x: torch.Tensor, rope) -> torch.Tensor:
        params = list(layer.parameters())
        if not (x.requires_grad or any(p.requires_grad for p in params)):
            return layer.eager_forward(x, None, rope)
        key = self._key(x, rope, params, layer.count_calls)
        entry = self.captured.get(key)
        if entry is None:
            if key not in self.seen:  # the first call compiles and tunes the kernels, eagerly
                self.seen[key] = None
                if len(self.seen) > MAX_SEEN:
                    self.seen.popitem(last=False)
                return layer.eager_forward(x, None, rope)
            entry = self._capture(layer, key, x, rope, params)
            if entry is None:
                return layer.eager_forward(x, None, rope)
        if entry.pending():
            return layer.eager_forward(x, None, rope)
        self.captured.move_to_end(key)
        return _Replay.apply(layer, entry, x, *(rope or (None, None)), *params)

    def _capture(self, layer, key: tuple, x: torch.Tensor, rope, params: list[torch.Tensor]) -> _Captured | None:
        if self.captures >= MAX_CAPTURES:
            self._disable(f"{MAX_CAPTURES} captures made (its parameters or inputs keep changing)")
            return None
        device = torch.device("cuda", x.device.index if x.device.index is not None else torch.cuda.current_device())
        if not _room(device):
            self.short_of_memory = True
            return None
        while len(self.captured) >= MAX_KEPT:  # before the capture, so that its memory can be reused
            self.captured.popitem(last=False)
        self.captures += 1
        try:
            with torch.cuda.device(device):
                torch.cuda.empty_cache()  # as the capture does: what it reserves is then its pool
                before = torch.cuda.memory_reserved(device)
                entry = _record(layer, x, rope, params)
                _hold(device, entry, torch.cuda.memory_reserved(device) - before)
        except Exception as exc:  # a layer that cannot be captured runs eagerly, as without graphs
            self._disable(f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            return None
        self.short_of_memory = False
        self.captured[key] = entry
        return entry

    def _disable(self, why: str) -> None:
        self.disabled = True
        self.captured.clear()
        warnings.warn(f"NSA layer CUDA graphs off for this layer, which now runs eagerly: {why}", stacklevel=5)


def _record(layer, x: torch.Tensor, rope, params: list[torch.Tensor]) -> _Captured:
    """Warm up on a side stream, then capture the forward and the backward into one pool.

    The captured forward reads x and the parameters through views made inside it, and the
    backward stops at those views: the parameters' own gradient accumulators (made on the
    default stream by an earlier step, and alive while its graph is) take no part in the
    capture, where their stream would be synchronised with the capture stream."""
    enabled, dtype = _autocast_state("cuda")
    static_x = x.detach().clone().requires_grad_(x.requires_grad)
    static_rope = None if rope is None else tuple(t.detach().clone() for t in rope)
    names = [n for n, _ in layer.named_parameters()]

    def forward() -> tuple[torch.Tensor, list[torch.Tensor]]:
        x_in = static_x.view_as(static_x)
        views = {n: p.view_as(p) for n, p in zip(names, params) if p.requires_grad}
        # the autocast cache would keep casts made inside a capture alive past it; the layer's
        # own forward, not its __call__: a forward hook runs on the replay's output, once
        with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False), \
                _reparametrize_module(layer, views):
            out = layer.eager_forward(x_in, None, static_rope)
        return out, ([x_in] if x.requires_grad else []) + list(views.values())

    calls = layer.calls.clone()  # the warm-up's forwards are not the caller's
    stream = _capture_streams.get(x.device.index)
    if stream is None:
        stream = _capture_streams[x.device.index] = torch.cuda.Stream(x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream):
        for _ in range(2):  # cuBLAS and the allocator set up on the capture stream, outside it
            out, wrt = forward()
            torch.autograd.grad(out, wrt, torch.zeros_like(out), allow_unused=True)
        layer.calls.copy_(calls)
    torch.cuda.current_stream(x.device).wait_stream(stream)
    fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(fwd, stream=stream):
        out, wrt = forward()
    grad_out = torch.empty_like(out)
    with torch.cuda.graph(bwd, pool=fwd.pool(), stream=stream):
        got = iter(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
        grad_x = next(got) if x.requires_grad else None
        packed = _Packed.pack([next(got) if p.requires_grad else None for p in params])
    return _Captured(fwd, bwd, static_x, static_rope, out, grad_out, grad_x, packed,
                     param_ptrs=tuple(p.data_ptr() for p in params), autocast=(enabled, dtype))


class _Replay(torch.autograd.Function):
    """The replayed layer as autograd sees it: x, the rope tables and the parameters in, the
    layer's output out."""

    @staticmethod
    def forward(ctx, layer, entry: _Captured, x, cos, sin, *params):
        entry.x.copy_(x)
        if entry.rope is not None:
            entry.rope[0].copy_(cos)
            entry.rope[1].copy_(sin)
        entry.fwd.replay()
        entry.generation += 1
        entry.consumed = False
        entry.owed = weakref.ref(ctx)
        ctx.layer, ctx.entry, ctx.generation = layer, entry, entry.generation
        ctx.versions = [p._version for p in params]
        ctx.save_for_backward(x, cos, sin, *params)
        # the static output is overwritten by the next replay; the caller's must not be
        return entry.out.clone()

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True: a replay's gradients carry no graph of their own
            raise RuntimeError(f"an NSA layer replayed from its CUDA graphs {NO_DOUBLE_BACKWARD}")
        entry = ctx.entry
        moved = tuple(p.data_ptr() for p in ctx.saved_tensors[3:]) != entry.param_ptrs
        if moved:  # so on every step: each would replay a forward and then recompute it
            ctx.layer.graphs._disable("its parameters moved between its forward and its backward (a sharded model)")
        if ctx.generation == entry.generation and not entry.consumed and not moved:
            entry.consumed = True
            entry.grad_out.copy_(grad_out)
            entry.bwd.replay()
            gx = None if entry.grad_x is None else entry.grad_x.clone()  # the next replay overwrites it
            gparams = entry.grad_params.copies()
        else:
            gx, *gparams = _recompute(ctx, grad_out)
        return (None, None, gx, None, None, *gparams)


def _recompute(ctx, grad_out) -> list[torch.Tensor | None]:
    """The gradients of an earlier forward whose activations the graphs no longer hold: the layer
    run again, eagerly, on the saved input, and differentiated."""
    x, cos, sin, *params = ctx.saved_tensors
    if any(p._version != v for p, v in zip(params, ctx.versions)):
        raise RuntimeError("one of the NSA layer's parameters was modified in place after its forward and "
                           "before this backward, which needs their values of the forward")
    rope = None if cos is None else (cos, sin)
    enabled, dtype = ctx.entry.autocast
    with torch.enable_grad(), torch.autocast("cuda", dtype=dtype, enabled=enabled):
        xd = x.detach().requires_grad_(x.requires_grad)
        out = ctx.layer.eager_forward(xd, None, rope)
    wrt = ([xd] if x.requires_grad else []) + [p for p in params if p.requires_grad]
    got = iter(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
    return [next(got) if x.requires_grad else None, *(next(got) if p.requires_grad else None for p in params)]


def set_graph_tokens(model: torch.nn.Module, max_tokens: int) -> None:
    """Graph every NSA layer of ``model`` for inputs of up to ``max_tokens`` tokens (0: never),
    dropping the graphs they hold."""
    for module in model.modules():
        if isinstance(getattr(module, "graphs", None), LayerGraphs):
            module.graphs = LayerGraphs(max_tokens)
