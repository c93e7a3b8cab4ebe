"""NSAAttention: projections, gates, RoPE, compression, backend routing and the decode cache.

Each branch has its own key/value projection (the paper's guard against shortcut learning);
they are stored as one fused Linear whose output is split six ways, which is the same function
with fewer kernel launches. Where the kernels run, RoPE and that split are one kernel each way
(nsa.kernels.rope): the per-call path of a layer is its matmuls and a few kernels per stage.
Gates are per query head and per branch: sigmoid(W_g x + b_g); their projection runs in the same
matmul as the query and key/value projections.
"""
from __future__ import annotations

import math
import numbers
import operator
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .autocast import autocast_dtype
from .autograd_state import count_call, func_transform_active, saved_tensor_hooks_active, unwrapped
from .backends import (
    STAGE_CONFIG_KEY, STAGES, BackendUnavailable, Route, ahead, preload, resolve_route, rope_kernel,
)
from .checkpointed import keep_selection_only
from .compress import Compressor, Recompute, blocks_in, compress, fc1_input, recompute_for
from .config import NSAConfig
from .core import CoreParts, nsa_core_parts
from .graphed import GRAPH_TOKENS, LayerGraphs
from .remade import Remaking
from .rope import apply_rope, rope_tables, table_dtype


def _check_int(name: str, value, minimum: int) -> None:
    """Refuse ``value`` unless it is an integer (of any integer type, numpy's among them) >= ``minimum``.
    A torch.SymInt, a size torch.compile traces dynamically, is compared as it is: operator.index
    would specialise the graph to its value."""
    number = value
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        try:
            number = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            number = None
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class NSACache:
    """Per-layer decode cache: every branch's per-token keys/values (rotated) and the
    compressed tokens made so far. ``length`` is the number of positions cached."""

    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    kc: torch.Tensor | None = None
    vc: torch.Tensor | None = None
    length: int = 0
    owner: weakref.ref | None = field(default=None, repr=False, compare=False)
    """The layer whose keys and values it holds (``claim``)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse fields that describe no cache, naming them: a new cache is ``NSACache()``, which
        the layer fills. A length that is not the cached keys' count (NSACache(length=-1), or a
        length reset by hand) would rotate the next tokens' queries and keys to wrong positions
        and failed, if at all, in a broadcast deep inside; compressed tokens without the keys they
        summarise were attended silently. A layer checks its cache at each call, as it finds it."""
        _check_int("NSACache.length (the positions cached; 0 for a new cache)", self.length, 0)
        if not (isinstance(self.tokens, dict)
                and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in self.tokens.values())):
            raise TypeError("NSACache.tokens must be a dict of name -> [batch, length, KV heads, head dim] tensors "
                            f"(empty for a new cache), got {type(self.tokens).__name__}")
        if not all(t is None or isinstance(t, torch.Tensor) for t in (self.kc, self.vc)) \
                or (self.kc is None) != (self.vc is None):
            raise TypeError("NSACache.kc and NSACache.vc must both be None (a new cache) or both tensors [batch, "
                            f"compressed tokens, KV heads, head dim], got {type(self.kc).__name__} and "
                            f"{type(self.vc).__name__}")
        held = [t.shape[1] for t in self.tokens.values()] or [0]
        if any(n != self.length for n in held):
            counts = ", ".join(map(str, sorted(set(held))))
            raise ValueError(f"NSACache.length={self.length}, but its tokens hold {counts} positions: a new cache is "
                             "NSACache(), which the layer fills (and each call extends)")
        if not self.tokens and self.kc is not None:
            raise ValueError("NSACache.kc and NSACache.vc hold compressed tokens, but the cache holds no keys: a new "
                             "cache is NSACache(), which the layer fills")

    def check_compressed(self, cfg: NSAConfig) -> None:
        """Refuse compressed tokens that are not those the cached keys make under ``cfg`` (the
        NSA layer's config), naming the field, what it holds and what the length implies: one per
        block of cmp_block positions every cmp_stride that fits whole in ``length``, of the keys'
        batch, KV heads and head dim. The layer compresses only the blocks after those held, so
        one too many was attended silently as a block of the wrong positions, and another batch or
        head count failed in a concatenation. None (with ``check`` passed) is a cache whose
        compressed tokens the layer makes at its next call, all of them."""
        if self.kc is None:
            return
        held = next(iter(self.tokens.values()))  # check() refused compressed tokens without keys
        n = blocks_in(cfg, self.length)
        want = [held.shape[0], n, *held.shape[2:]]
        for name, t in (("kc", self.kc), ("vc", self.vc)):
            if list(t.shape) != want:
                count = f" ({t.shape[1]} compressed tokens)" if t.dim() == 4 else ""
                raise ValueError(
                    f"NSACache.{name} holds {list(t.shape)}{count}, but NSACache.length={self.length} and its keys "
                    f"{list(held.shape)} imply {want}: {n} compressed tokens, the blocks of attn.cmp_block="
                    f"{cfg.cmp_block} positions every attn.cmp_stride={cfg.cmp_stride} that fit whole in "
                    f"{self.length} (the layer makes them: a new cache is NSACache())")

    def append(self, name: str, x: torch.Tensor) -> torch.Tensor:
        old = self.tokens.get(name)
        self.tokens[name] = x if old is None else torch.cat([old, x], dim=1)
        return self.tokens[name]

    def __getstate__(self) -> dict:
        """A saved or copied cache is no layer's until one uses it (a weak reference does not pickle)."""
        return {**self.__dict__, "owner": None}

    def claim(self, layer: nn.Module) -> None:
        """Make the cache ``layer``'s, or refuse it where another living layer filled it: a layer
        would attend the other's keys and values as its own, a wrong result that no shape shows
        where the two layers have the same shape (the layers of one model do)."""
        owner = self.owner() if self.owner is not None else None
        if owner is None:
            self.owner = weakref.ref(layer)
        elif owner is not layer:
            raise ValueError(f"the cache holds the keys and values of another layer ({type(owner).__name__} at "
                             f"{id(owner):#x}), not this one's: give each layer its own cache")


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x in the autocast dtype where autocast is on for x's device, else x. Autocast casts a
    Linear's activation input anew at each call (it caches only the casts of weights), and each
    Linear saves its own copy for the backward: a layer whose projections all read x keeps one
    copy instead of one per projection (`python bench/saved_memory.py` lists what a layer saves)."""
    dtype = autocast_dtype(x.device.type)
    return x.to(dtype) if dtype is not None and x.is_floating_point() else x


#: the reason of every route under a torch.func transform (RoutedAttention._resolve)
TORCH_FUNC_ROUTE = "under a torch.func transform: the PyTorch path, op by op (torch.func takes no kernel's autograd)"


class GateLinear(nn.Linear):
    """The gates' projection: a Linear whose bias starts at zero (every gate at 0.5). Its own
    reset_parameters zeros it, so that resetting every module of a model in turn (as a meta-device
    initialisation may, the parent before its children) keeps it; it draws the weight and bias
    from the RNG as nn.Linear does, and so keeps a seed's initial weights."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.bias)


class RoutedAttention(nn.Module):
    """What NSA and dense attention share: the shape (query heads, KV heads, head dim), the query
    projection and one fused projection of ``kv_streams`` key/value streams per KV head, a forward
    count for the backend audit, their backend routes and whether the layer's own kernels run (RoPE
    and the split of the projections as one kernel; NSA's compressors' MLP), resolved once per
    (device type, dtype), and the RoPE tables. A subclass gives ``_routes_for`` and builds the rest
    of its layers after ``__init__`` (in the order that keeps a seed's initial weights)."""

    def __init__(self, dim: int, n_heads: int, n_kv_groups: int, head_dim: int, cfg: NSAConfig,
                 rope_theta: float, kv_streams: int):
        super().__init__()
        for name, value in (("dim", dim), ("n_heads", n_heads), ("n_kv_groups", n_kv_groups), ("head_dim", head_dim)):
            _check_int(name, value, 1)
        if n_heads % n_kv_groups:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_groups={n_kv_groups}")
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even (RoPE rotates pairs)")
        if not isinstance(cfg, NSAConfig):
            raise TypeError(f"cfg must be an nsa.attention.NSAConfig, got {type(cfg).__name__}")
        if not (isinstance(rope_theta, numbers.Real) and not isinstance(rope_theta, bool) and math.isfinite(rope_theta)
                and rope_theta > 0):
            raise ValueError(f"rope_theta must be a finite number > 0, got {rope_theta!r}")
        self.cfg = cfg
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv_groups, head_dim
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(dim, kv_streams * n_kv_groups * head_dim, bias=False)
        # forward calls so far (each runs every stage once on its route), for the backend audit,
        # counted only while count_calls is on (nsa.model.telemetry.count_calls: off, a forward
        # launches nothing for it); a tensor, so that torch.compile neither guards on it nor
        # recompiles as it grows, and the layer's CUDA graphs count their replays
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=False)
        self.count_calls = False
        self._init_routes()

    def reset_parameters(self) -> None:
        """Every parameter and buffer as the constructor sets them, drawn from the RNG in the
        constructor's order: a layer built on the meta device, materialised with ``to_empty`` and
        reset so is the layer built directly under the same seed (on the same device)."""
        self.q_proj.reset_parameters()
        self.kv_proj.reset_parameters()
        self.calls.zero_()

    def check_input(self, x: torch.Tensor, cache: NSACache | None, rope) -> None:
        """Refuse what forward cannot take, naming it (a wrong shape would otherwise fail deep
        inside, in a matmul or a broadcast)."""
        dim = self.q_proj.in_features
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor [batch, tokens, {dim}], got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != dim:
            raise ValueError(f"x must be [batch, tokens, {dim}], got {list(x.shape)}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"x holds no tokens: {list(x.shape)}")
        weight = self.q_proj.weight
        if not x.is_floating_point() or (autocast_dtype(x.device.type) is None and x.dtype != weight.dtype):
            raise TypeError(f"x is {x.dtype}, the layer's parameters {weight.dtype}: give x in their dtype (or run "
                            "under torch.autocast)")
        # named here: torch's own error names neither x nor the layer ("Tensor on device cpu is not
        # on the expected device meta!")
        if x.device != weight.device:
            raise ValueError(f"x is on {x.device}, the layer's parameters on {weight.device}: move x or the layer "
                             "to one device")
        if cache is not None:
            self.check_cache(cache, x)
        if rope is not None:
            want = (x.shape[1], self.head_dim // 2)
            tables = isinstance(rope, (tuple, list)) and len(rope) == 2 and all(
                isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == want
                and t.device == x.device for t in rope)
            if not tables:
                def described(t) -> str:
                    if not isinstance(t, torch.Tensor):
                        return type(t).__name__
                    return f"{list(t.shape)} {t.dtype}" + (f" on {t.device}" if t.device != x.device else "")

                got = [described(t) for t in rope] if isinstance(rope, (tuple, list)) else type(rope).__name__
                raise ValueError(f"rope must be the (cos, sin) tables of x's positions, each a floating-point "
                                 f"{list(want)} on x's device ({x.device}) (the layer's rope(start, T, device)), "
                                 f"got {got}")

    def check_cache(self, cache: NSACache, x: torch.Tensor) -> None:
        """Refuse a cache this layer cannot continue with x, naming it: checked where the caller
        hands it in (check_input), as the layer finds it at each call; a call without a cache (a
        training step) does none of this."""
        if not isinstance(cache, NSACache):
            # a second positional argument is where another attention takes its mask
            hint = (" (the layer takes no attention mask or position ids: each row of x is a causal sequence "
                    "at positions 0..T-1 after the cached ones)" if isinstance(cache, torch.Tensor) else "")
            raise TypeError(f"cache must be an nsa.attention.NSACache or None, got {type(cache).__name__}{hint}")
        cache.check()
        if not torch.compiler.is_compiling():  # a traced decode keeps no Python object's identity
            cache.claim(self)
        held = next(iter(cache.tokens.values()), None)
        if held is not None and held.shape[0] != x.shape[0]:
            raise ValueError(f"x's batch of {x.shape[0]} continues a cache of batch {held.shape[0]}")
        # a cache is one layer's: another layer's shape would fail in a concatenation, unnamed
        if held is not None and tuple(held.shape[2:]) != (self.n_kv, self.head_dim):
            raise ValueError(f"the cache holds {held.shape[2]} KV heads of head dim {held.shape[3]}, this layer "
                             f"{self.n_kv} of {self.head_dim}: give each layer its own cache")

    def _init_routes(self) -> None:
        self.routes: dict[str, Route] = {}
        # (device type, dtype) -> the routes and whether the layer's own kernels run (see _resolve)
        self._resolved: dict[tuple[str, torch.dtype], tuple[dict[str, Route], bool]] = {}
        for device, dtype in ahead():
            try:
                self._resolved[(device.type, dtype)] = self._routes_for(device, dtype)
            except BackendUnavailable:  # a backend named that cannot run so: refused by the call that would
                pass

    def _routes_for(self, device: torch.device, dtype: torch.dtype) -> tuple[dict[str, Route], bool]:
        raise NotImplementedError

    def resolve_routes(self, device: torch.device, dtype: torch.dtype) -> dict[str, Route]:
        """The stages' routes for inputs on ``device`` in ``dtype``, resolved on the first call
        of each (device type, dtype) and kept: a later call compares one key."""
        return self._resolve(device, dtype)[0]

    def _resolve(self, device: torch.device, dtype: torch.dtype) -> tuple[dict[str, Route], bool]:
        """The routes, and whether the layer's own kernels run (RoPE and the split as one kernel,
        nsa.kernels.rope; NSA's compressors' MLP, nsa.kernels.phi_mlp): resolved once per (device
        type, dtype), when the layer is built for CUDA (backends.ahead) or at the first eager
        call. Nothing is kept while torch.compile traces: a value kept in a trace would fail that
        graph's guards on the next call and compile it again.

        Under a torch.func transform every stage takes the PyTorch path and no kernel of the
        layer's own runs: the kernels' autograd is an old-style autograd.Function (their custom
        ops' too), which torch.func refuses, and their gradients have no graph, so no double
        backward; op by op, the layer has both."""
        key = (device.type, dtype)
        found = self._resolved.get(key)
        if found is None:
            found = self._routes_for(device, dtype)
            if not torch.compiler.is_compiling():
                self._resolved[key] = found
        if not torch.compiler.is_compiling() and func_transform_active():
            found = {stage: Route(stage, "torch", TORCH_FUNC_ROUTE) for stage in found[0]}, False
        if not torch.compiler.is_compiling():
            self.routes = found[0]  # the last eager call's, for the backend audit
        return found

    def rope(self, start: int, T: int, device: torch.device, dtype: torch.dtype = torch.float64
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, K/2] of positions start..start+T-1 in ``dtype`` (table_dtype of the
        inputs' dtype is what RoPE computes in)."""
        _check_int("start (the first position)", start, 0)
        _check_int("T (the number of positions)", T, 1)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype (float32: what RoPE computes in, float64 for "
                            f"a float64 layer), got {dtype!r}")
        return rope_tables(start, T, self.head_dim, self.rope_theta, device, dtype)


class NSAAttention(RoutedAttention):
    """NSA attention. On CUDA, in eager mode, a training forward + backward of up to
    ``graph_tokens`` tokens replays as two CUDA graphs after its first call at a shape
    (nsa.attention.graphed; 0: never): the same kernels on the same inputs, without the host
    time of enqueueing them one by one. ``nsa.attention.graphed.set_graph_tokens`` sets it for
    every NSA layer of a model."""

    def __init__(self, dim: int, n_heads: int, n_kv_groups: int, head_dim: int,
                 cfg: NSAConfig, rope_theta: float = 10000.0, graph_tokens: int = GRAPH_TOKENS):
        if isinstance(cfg, NSAConfig) and cfg.kind != "nsa":
            raise ValueError(f"cfg.kind={cfg.kind!r}: NSAAttention is the NSA layer; the dense baseline of the same "
                             "shape is nsa.attention.dense.DenseAttention (nsa.model.NSATransformer picks by kind)")
        # k and v for each of cmp, sel, win: six separate projections fused into one matrix
        super().__init__(dim, n_heads, n_kv_groups, head_dim, cfg, rope_theta, kv_streams=6)
        cfg.check_head_dim(head_dim, key="head_dim")
        self.gate_proj = GateLinear(dim, n_heads * 3)
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.compress_k = Compressor(head_dim, cfg)
        self.compress_v = Compressor(head_dim, cfg)
        # (device, dtype) -> zero rows padding the stacked projection weights (_zero_rows)
        self._pads: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        # the mean gate per branch of the last forward (detached, no sync), kept only while
        # track_gates is on (nsa.model.telemetry.track_gates): off, a forward adds no work for it
        self.track_gates = False
        self.last_gate_mean: torch.Tensor | None = None
        self.graphs = LayerGraphs(graph_tokens)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.gate_proj.reset_parameters()
        self.o_proj.reset_parameters()
        self.compress_k.reset_parameters()
        self.compress_v.reset_parameters()
        self._pads.clear()

    def check_cache(self, cache: NSACache, x: torch.Tensor) -> None:
        """RoutedAttention's checks, and the compressed tokens against the cache's length under
        this layer's config (NSACache.check_compressed)."""
        super().check_cache(cache, x)
        cache.check_compressed(self.cfg)

    @property
    def compressors(self) -> tuple[Compressor, Compressor]:
        """The key and value streams' compressors, in the order ``compress`` takes them."""
        return self.compress_k, self.compress_v

    def _routes_for(self, device: torch.device, dtype: torch.dtype) -> tuple[dict[str, Route], bool]:
        routes = {s: resolve_route(s, getattr(self.cfg, STAGE_CONFIG_KEY[s]), device, dtype) for s in STAGES}
        for route in routes.values():
            preload(route)
        return routes, dtype != torch.float64 and (rope_kernel(device, dtype) or routes["sel"].backend == "triton")

    def project(self, x: torch.Tensor, start: int, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                fused_rope: bool | None = None, weight: torch.Tensor | None = None):
        """Rotated q [B,T,HQ,K], the six per-branch k/v [B,T,H,K] and gates [B,T,HQ,3].
        ``rope``: precomputed (cos, sin) of positions start..start+T-1 (see forward);
        ``fused_rope``: whether the RoPE kernel runs (None: as routed for x's device and dtype);
        ``weight``: the stacked weight to read (None: ``_stacked_weight``'s, made here). x and
        rope are checked as forward checks them, start is an integer >= 0."""
        self.check_input(x, None, rope)
        _check_int("start (the position of x's first token)", start, 0)
        return self._projected(x, start, rope, fused_rope, weight)

    def _projected(self, x: torch.Tensor, start: int, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                   fused_rope: bool | None = None, weight: torch.Tensor | None = None):
        """project's result, x unchecked (forward checked it)."""
        x = autocast_input(x)  # one copy for every projection
        q, kv, gates = self._project(x, start, rope, fused_rope, weight)
        B, T, _ = x.shape
        if gates is None:
            gates = torch.sigmoid(self.gate_proj(x))
        return q, kv, gates.view(B, T, self.n_heads, 3)

    def project_qkv(self, x: torch.Tensor, start: int, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                    fused_rope: bool | None = None, weight: torch.Tensor | None = None):
        """project's q and six key/value streams (what the backward makes again: the gates are
        kept); ``weight``: the stacked weight a forward read (``_stacked_weight``), to make its
        streams again from the same values."""
        return self._project(x, start, rope, fused_rope, weight)[:2]

    def _stacked_weight(self, x: torch.Tensor) -> torch.Tensor:
        """The query, key/value and gate projections' weights stacked, with the zero rows that pad
        them (``_zero_rows``), in the dtype the matmul reads under autocast: the cast autocast
        would make, made once here so that a recomputation reads the forward's own copy."""
        w = torch.cat((self.q_proj.weight, self.kv_proj.weight, self.gate_proj.weight,
                       self._zero_rows(self.q_proj.weight)))
        dtype = autocast_dtype(x.device.type)
        return w if dtype is None else w.to(dtype)

    def _project(self, x: torch.Tensor, start: int, rope: tuple[torch.Tensor, torch.Tensor] | None,
                 fused_rope: bool | None, weight: torch.Tensor | None = None):
        """Rotated q, the six key/value streams and the gates [B, T, 3 * HQ] from one matmul of x
        with the query, key/value and gate projections' weights stacked: one launch each way
        instead of two, and one gradient of x instead of two summed. Zero rows pad the stack to a
        multiple of 8, so that a token's row of the product keeps the 16-byte alignment the
        matmuls and the RoPE kernel read fastest (the gates' 3 * HQ columns alone would break
        it). Where the RoPE kernel runs, it also makes the gates (nsa.kernels.rope.project_split)
        and its backward writes the product's gradient whole. While torch.compile traces, the
        gates keep their own projection (None for them): the compiler fuses what the stack saves
        the eager layer, and with the gates in the stack the compiled model's backward peaks
        higher (docs/performance.md, the compiled model's memory)."""
        B, T, _ = x.shape
        HQ, H, K = self.n_heads, self.n_kv, self.head_dim
        x = autocast_input(x)
        cos, sin = rope if rope is not None else self.rope(start, T, x.device, table_dtype(x.dtype))
        if fused_rope is None:
            fused_rope = self._resolve(x.device, x.dtype)[1]
        if torch.compiler.is_compiling():
            q, kv = F.linear(x, torch.cat((self.q_proj.weight, self.kv_proj.weight))).split(
                (HQ * K, 6 * H * K), dim=-1)
            gates = None
        else:
            prod = F.linear(x, self._stacked_weight(x) if weight is None else weight)
            if fused_rope:
                from nsa.kernels.rope import project_split

                return project_split(prod, self.gate_proj.bias, cos, sin, HQ, H, 3, K)
            widths = (HQ * K, 6 * H * K, 3 * HQ)  # then the padding rows' columns
            q, kv, logits, _ = prod.split((*widths, prod.shape[-1] - sum(widths)), dim=-1)
            gates = torch.sigmoid(logits + self.gate_proj.bias.to(logits.dtype))
        q, kv = q.view(B, T, HQ, K), kv.view(B, T, 6, H, K)
        if fused_rope:
            from nsa.kernels.rope import rope_split

            q, kv = rope_split(q, kv, cos, sin)
            k_cmp, v_cmp, k_sel, v_sel, k_win, v_win = kv.unbind(0)
        else:
            q = apply_rope(q, cos, sin)
            k_cmp, v_cmp, k_sel, v_sel, k_win, v_win = kv.unbind(2)
            k_cmp, k_sel, k_win = (apply_rope(k, cos, sin) for k in (k_cmp, k_sel, k_win))
        return q, (k_cmp, v_cmp, k_sel, v_sel, k_win, v_win), gates

    def _zero_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The zero rows (maybe none) that pad the stacked projection weights to a multiple of 8
        rows, like ``weight``, made once per device and dtype (a plain attribute, not a buffer: a
        model built on the meta device and materialised with ``to_empty`` would leave a buffer's
        zeros uninitialised)."""
        rows = -(self.q_proj.out_features + self.kv_proj.out_features + self.gate_proj.out_features) % 8
        key = (weight.device, weight.dtype)
        pad = self._pads.get(key)
        if pad is None:
            with unwrapped():  # kept past a torch.func transform
                pad = self._pads[key] = torch.zeros(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
        return pad

    def forward(self, x: torch.Tensor, cache: NSACache | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]: eager_forward's result, replayed from this layer's CUDA
        graphs where they apply (see the class docstring)."""
        self.check_input(x, cache, rope)
        if cache is None and not self.track_gates and self.graphs.applies(x):
            return self.graphs(self, x, rope)
        return self.eager_forward(x, cache, rope)

    def eager_forward(self, x: torch.Tensor, cache: NSACache | None = None,
                      rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]. With a cache, x holds the positions after the cached
        ones (one token for decode) and the cache is extended in place. ``rope``: the (cos, sin)
        tables of these positions, from ``self.rope``. A model computes them once for all its
        layers (inductor otherwise recomputes the float64 angles per element of q and k in
        every layer); they are computed here when not given.

        From RECOMPUTE_TOKENS tokens a training forward keeps, instead of some tensors its ops
        save, how to make them again (``_keep_projections``, ``_keep_core``); the caller's own saved-tensor hooks
        (checkpointing, offloading) decide alone what is kept. While torch.compile traces, the
        compiler makes the same tensors again (nsa.attention.checkpointed)."""
        if self.count_calls:
            count_call(self.calls)
        x = autocast_input(x)  # outside a checkpoint's recomputation: the copy every projection reads
        recompute = recompute_for(x) if cache is None else Recompute.NONE
        if recompute is Recompute.RECIPES and not saved_tensor_hooks_active():
            with Remaking() as remaking:
                out, gates = self._forward(x, None, rope, remaking)
        elif recompute is Recompute.CHECKPOINT:
            out, gates = keep_selection_only(self._forward, self._resolve(x.device, x.dtype)[0], x, cache=None,
                                             rope=rope, remaking=None, one_op=False)
        else:
            out, gates = self._forward(x, cache, rope, None)
        if self.track_gates:
            self.last_gate_mean = gates.detach().float().mean(dim=(0, 1, 2))
        return out

    def _forward(self, x: torch.Tensor, cache: NSACache | None, rope: tuple[torch.Tensor, torch.Tensor] | None,
                 remaking: Remaking | None, one_op: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the gates (see eager_forward; ``one_op``: nsa.attention.core's)."""
        B, T, _ = x.shape
        start = cache.length if cache is not None else 0
        if rope is None:
            rope = self.rope(start, T, x.device, table_dtype(x.dtype))
        # a recomputing forward hands its backward's remake the stacked weight it read
        weight = self._stacked_weight(x) if remaking is not None else None
        q, kv, gates = self._projected(x, start, rope, weight=weight)
        k_cmp, v_cmp, k_sel, v_sel, k_win, v_win = kv
        routes, kernels = self._resolve(x.device, q.dtype)
        if cache is None:
            fc1 = [] if remaking is not None else None
            kc, vc = compress(self.compressors, (k_cmp, v_cmp), fc1_inputs=fc1, one_node=kernels)
            if remaking is not None:
                self._keep_projections(remaking, x, rope, weight, q, kv, fc1)
        else:
            names = ("k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win")
            k_cmp, v_cmp, k_sel, v_sel, k_win, v_win = (cache.append(n, t) for n, t in zip(names, kv))
            first = 0 if cache.kc is None else cache.kc.shape[1]
            new_k, new_v = compress(self.compressors, (k_cmp, v_cmp), first)
            cache.kc = new_k if cache.kc is None else torch.cat([cache.kc, new_k], dim=1)
            cache.vc = new_v if cache.vc is None else torch.cat([cache.vc, new_v], dim=1)
            cache.length += T
            kc, vc = cache.kc, cache.vc
        core = nsa_core_parts(q, kc, vc, k_sel, v_sel, k_win, v_win, gates, self.cfg, routes, q_start=start,
                              one_op=one_op)
        if remaking is not None:
            self._keep_core(remaking, core, q, kc, vc, k_win, v_win, gates)
        return self.o_proj(core.o.reshape(B, T, -1)), gates

    def _keep_projections(self, remaking: Remaking, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                          weight: torch.Tensor, q: torch.Tensor, kv: tuple[torch.Tensor, ...],
                          fc1: list[torch.Tensor]) -> None:
        """q and the six key/value streams are made again from x and the stacked weight (the
        projection's autocast input and weight, which its matmul keeps anyway, so that the
        weights are neither stacked nor cast again and the values are the forward's even if a
        parameter changed since): the projections' matmul and the RoPE kernel; and the
        compressors' fc1 input in ``fc1`` (none for mean pooling) from the key and value streams,
        in the same recipe, so that the streams are made once for both. (The gates are kept: their
        sigmoid keeps them for its own backward.)"""
        dtype = autocast_dtype(x.device.type)
        autocast = dict(device_type=x.device.type, dtype=dtype, enabled=dtype is not None)
        compressed = bool(fc1)  # the recipe holds no reference to fc1's tensors: they are what it frees

        def again() -> list[torch.Tensor]:
            with torch.autocast(**autocast):
                q2, kv2 = self.project_qkv(x, 0, rope, weight=weight)
            return [q2, *kv2, *([fc1_input(self.cfg, kv2[:2])] if compressed else [])]

        remaking.add(again, [q, *kv, *fc1], reads=[x, weight, *rope])

    @staticmethod
    def _keep_core(remaking: Remaking, core: CoreParts, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                   k_win: torch.Tensor, v_win: torch.Tensor, gates: torch.Tensor) -> None:
        """The compressed branch's output and lse are made again by its forward from q and the
        compressed tokens (which its backward keeps); the window branch's, where the fused op
        computed them, by its forward kernel from q, k_win, v_win; the gated sum o, the output
        projection's input, from the gates and the branches' outputs (the selected branch's
        backward keeps o_sel anyway)."""
        # the recipes hold functions and kept tensors, never `core`: it holds the outputs
        remaking.add_call(core.cmp_again, (q, kc, vc), [core.o_cmp, core.lse_cmp])
        if core.window_again is not None:
            remaking.add_call(core.window_again, (q, k_win, v_win), [core.o_win, core.lse_win])
        combine = core.combine
        remaking.add_call(lambda *parts: [combine(*parts)],
                          (gates, core.o_cmp.detach(), core.o_sel.detach(), core.o_win), [core.o])
