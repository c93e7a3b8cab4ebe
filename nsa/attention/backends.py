"""Per-stage backends and the rule that routes each NSA stage to one.

Stages: 'cmp' (compressed attention, returns o and lse), 'select' (importance scores and top-n;
its backend follows attn.backend_cmp), 'sel' (selected attention) and 'win' (sliding window);
and 'dense', the causal attention of a dense model of the same shape (attn.kind=dense), which
has no NSA stage.
``BACKENDS`` lists every implementation of every stage by name, as importable functions (the
PyTorch path of torch_branches, the kernels through kernel_branches), each with the test that
says whether it can run on a device and dtype.

``resolve_route`` turns a requested backend ('auto' or a name) into a Route with the reason it
was chosen. A backend asked for by name that cannot run is an error (BackendUnavailable), never
a silent fallback. 'auto' tries the backends of ``auto_order`` in turn and takes the first that
can run; passing over one is a fallback and the reason names it and why.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

from nsa.kernels import CUDNN_MIN_ELEMENTS, CUDNN_MIN_QUERIES

from . import kernel_branches as kb
from . import sdpa
from . import torch_branches as tb
from .config import NSAConfig

#: the stages of the NSA core (the dense stage is a model of its own, attn.kind=dense)
STAGES = ("cmp", "select", "sel", "win")
#: which config key picks the backend of each stage
STAGE_CONFIG_KEY = {"cmp": "backend_cmp", "select": "backend_cmp", "sel": "backend_sel", "win": "backend_win",
                    "dense": "backend_dense"}

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HALF = (torch.float16, torch.bfloat16)  # what cuDNN's fused attention and flash-attn take


class BackendUnavailable(RuntimeError):
    """A backend was requested by name but cannot run here; the message says why."""


Availability = Callable[[torch.device, torch.dtype], "tuple[bool, str]"]


@dataclass(frozen=True)
class Backend:
    fn: Callable
    available: Availability
    """(device, dtype) -> (usable, reason); the reason says why not when unusable."""
    kernels: bool = True
    """Runs nsa.kernels code, which routing imports ahead of the first call (see preload)."""
    runs: str | None = None
    """The backend whose code runs, where it is not the one named: the select stage follows
    attn.backend_cmp, and its 'cudnn' is the Triton top-n fed by cuDNN's compressed branch. Its
    Route names what runs (env.json, the report), never a cuDNN top-n that does not exist."""


@dataclass(frozen=True)
class Route:
    stage: str
    backend: str
    reason: str
    fallback: bool = False
    """'auto' had to pass over a faster backend meant for this device (the reason names it and
    why): the run is slower than it should be."""


def _always(device, dtype):
    return True, "portable PyTorch path"


def _triton_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if dtype not in _KERNEL_DTYPES:
        return False, f"the Triton kernels take float16/bfloat16/float32, not {dtype}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return True, "Triton kernels on CUDA"
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "Triton kernels need CUDA (or TRITON_INTERPRET=1 on CPU)"
        if dtype == torch.bfloat16:
            return False, "the Triton interpreter computes bfloat16 wrongly; use float32 or float16 on CPU"
        return True, "Triton interpreter (TRITON_INTERPRET=1)"
    return False, f"Triton kernels do not run on {device.type}"


def _cudnn_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "cuDNN fused attention is a backend for CUDA only"
    if not torch.backends.cudnn.is_available() or (torch.backends.cudnn.version() or 0) < 90000:
        return False, f"cuDNN fused attention needs cuDNN >= 9 (found {torch.backends.cudnn.version()})"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return False, "cuDNN fused attention needs compute capability >= 8.0"
    if dtype not in _HALF:
        return False, f"cuDNN fused attention takes float16/bfloat16, not {dtype}"
    ok, why = _triton_available(device, dtype)  # short sequences, the tail, decode: band kernel
    if not ok:
        return False, f"the cuDNN compressed branch needs the Triton band kernel too: {why}"
    return True, (f"cuDNN fused attention over folded query runs for prefills of >= {CUDNN_MIN_QUERIES} queries "
                  f"holding >= {CUDNN_MIN_ELEMENTS} elements, the Triton band kernel otherwise")


def _flex_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "FlexAttention is a backend for CUDA only"
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False, "this torch has no torch.nn.attention.flex_attention"
    if dtype not in _KERNEL_DTYPES:
        return False, f"FlexAttention takes float16/bfloat16/float32, not {dtype}"
    return True, "FlexAttention sliding-window block mask"


def _flash_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _flash_available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    if not _flash_installed():
        return False, "flash_attn is not installed"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "flash-attn needs CUDA"
    if dtype not in _HALF:
        return False, f"flash-attn takes float16/bfloat16, not {dtype}"
    return True, "flash-attn local attention"


def _sdpa_kernel_available(name: str, enabled: Callable[[], bool]) -> Availability:
    """The availability test of one of SDPA's fused kernels (cuDNN, flash): CUDA, sm_80 on,
    bf16/fp16, and not switched off by torch.backends.cuda (the trainer's sdpa.* toggles)."""
    def available(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
        if device.type != "cuda" or not torch.cuda.is_available():
            return False, f"SDPA's {name} kernel is a backend for CUDA only"
        if torch.cuda.get_device_capability(device) < (8, 0):
            return False, f"SDPA's {name} kernel needs compute capability >= 8.0"
        if dtype not in _HALF:
            return False, f"SDPA's {name} kernel takes float16/bfloat16, not {dtype}"
        if not enabled():
            return False, f"SDPA's {name} kernel is switched off (torch.backends.cuda; sdpa.* toggles)"
        return True, f"SDPA's {name} kernel"
    return available


#: every implementation of every stage, by the name attn.backend_* uses
BACKENDS: dict[str, dict[str, Backend]] = {
    "cmp": {
        "torch": Backend(tb.torch_cmp_attention, _always, kernels=False),
        "triton": Backend(kb.triton_cmp_attention, _triton_available),
        "cudnn": Backend(kb.cudnn_cmp_attention, _cudnn_available),
    },
    "select": {  # follows backend_cmp: cuDNN's compressed branch feeds the Triton top-n
        "torch": Backend(tb.torch_select_blocks, _always, kernels=False),
        "triton": Backend(kb.triton_select_blocks, _triton_available),
        "cudnn": Backend(kb.triton_select_blocks, _cudnn_available, runs="triton"),
    },
    "sel": {
        "torch": Backend(tb.torch_sel_attention, _always, kernels=False),
        "triton": Backend(kb.triton_sel_attention, _triton_available),
    },
    "win": {
        "torch": Backend(tb.torch_win_attention, _always, kernels=False),
        "triton": Backend(kb.triton_win_attention, _triton_available),
        "flex": Backend(kb.flex_win_attention, _flex_available),
        "flash_attn": Backend(kb.flash_attn_win_attention, _flash_available),
    },
    "dense": {
        "torch": Backend(sdpa.torch_dense_attention, lambda d, t: (True, "SDPA, torch's choice of kernel"),
                         kernels=False),
        "cudnn": Backend(sdpa.cudnn_dense_attention,
                         _sdpa_kernel_available("cuDNN", lambda: torch.backends.cuda.cudnn_sdp_enabled()),
                         kernels=False),
        "flash": Backend(sdpa.flash_dense_attention,
                         _sdpa_kernel_available("flash", lambda: torch.backends.cuda.flash_sdp_enabled()),
                         kernels=False),
    },
}


def torch_gate_combine(gates, o_cmp, o_sel, o_win):
    """o = g_cmp * o_cmp + g_sel * o_sel + g_win * o_win (gates [..., 3], per query head)."""
    g = gates.to(o_cmp.dtype)
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_sel + g[..., 2:3] * o_win


def auto_order(stage: str, device: torch.device, dtype: torch.dtype) -> tuple[str, ...]:
    """The backends 'auto' tries for a stage, fastest first (bench/bench_nsa.py compares them);
    the PyTorch path last, so it always ends the list.

    Off CUDA that is the PyTorch path alone: the Triton interpreter runs on CPU, but only when a
    test asks for it by name. Backends not meant for this dtype (cuDNN without bf16/fp16) or not
    installed (flash-attn, an optional extra) are left out, so passing over them is no fallback."""
    if device.type != "cuda":
        return ("torch",)
    half = dtype in _HALF
    order = {
        "cmp": ("cudnn",) * half + ("triton",),
        "select": ("cudnn",) * half + ("triton",),
        "sel": ("triton",),
        "win": ("triton",) + ("flash_attn",) * _flash_installed() + ("flex",),
        # cuDNN's fused attention before flash: the faster of the two for the dense baseline's
        # fwd+bwd and training step (bench/bench_nsa.py --ops sdpa_cudnn sdpa_flash)
        "dense": ("cudnn",) * half,
    }[stage]
    return order + ("torch",)


def resolve_route(stage: str, requested: str, device: torch.device, dtype: torch.dtype) -> Route:
    impls = BACKENDS[stage]
    if requested != "auto":
        if requested not in impls:
            raise BackendUnavailable(
                f"attn.{STAGE_CONFIG_KEY[stage]}={requested!r} is not a backend of the {stage} "
                f"stage; backends: {', '.join(sorted(impls))}"
            )
        ok, why = impls[requested].available(device, dtype)
        if not ok:
            runnable = ["auto"] + [name for name, impl in impls.items() if impl.available(device, dtype)[0]]
            raise BackendUnavailable(
                f"attn.{STAGE_CONFIG_KEY[stage]}={requested!r} cannot run on {device.type}/{dtype}: {why}; "
                f"what runs here: {', '.join(runnable)}"
            )
        return _route(stage, requested, f"requested by config ({why})")
    skipped = []
    for name in auto_order(stage, device, dtype):
        ok, why = impls[name].available(device, dtype)
        if ok:
            note = f"; skipped {', '.join(skipped)}" if skipped else ""
            return _route(stage, name, f"auto: {why}{note}", fallback=bool(skipped))
        skipped.append(f"{name} ({why})")
    raise BackendUnavailable(f"no backend can run the {stage} stage on {device.type}/{dtype}")


def _route(stage: str, name: str, reason: str, fallback: bool = False) -> Route:
    """The route to backend ``name`` of ``stage``, named by the backend whose code runs
    (``Backend.runs``): select's 'cudnn' is 'triton', its reason saying whose scores it reads."""
    runs = BACKENDS[stage][name].runs
    if runs is None:
        return Route(stage, name, reason, fallback)
    return Route(stage, runs, f"the {runs} code of attn.{STAGE_CONFIG_KEY[stage]}={name} ({reason})", fallback)


def check_requested(cfg: NSAConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Raise BackendUnavailable for a backend the config names that cannot run on ``device`` and
    ``dtype``, as the first forward's routing would; a trainer calls it before it builds the model."""
    for stage in ("dense",) if cfg.kind == "dense" else STAGES:
        resolve_route(stage, getattr(cfg, STAGE_CONFIG_KEY[stage]), device, dtype)


def implementation(route: Route) -> Callable:
    return BACKENDS[route.stage][route.backend].fn


def gated_branches(routes: dict[str, Route]) -> Callable | None:
    """The one op for the selected and window branches and the gated sum (nsa.kernels.gated_branches)
    when the routes allow it (both branches on Triton), else None: the stages run one by one. The
    one op leaves out the glue between the three ops' backwards and their launches. It returns o,
    the selected and window branches' outputs and the window's lse."""
    if routes["sel"].backend == "triton" and routes["win"].backend == "triton":
        return kb.triton_gated_branches_outputs
    return None


def fused_window_again(routes: dict[str, Route]) -> Callable:
    """The window branch's forward inside the op of ``gated_branches(routes)``, alone: its
    (o_win, lse_win) again, bit for bit."""
    return kb.triton_window_again


def gate_combine(route: Route) -> Callable:
    """The gated sum that goes with the selected branch's route: fused when it runs on Triton."""
    return kb.triton_gate_combine if route.backend == "triton" else torch_gate_combine


def ahead() -> list[tuple[torch.device, torch.dtype]]:
    """The (device, dtype) pairs an attention layer resolves its routes for when it is built: CUDA
    in the kernels' dtypes, where CUDA is available. A model that torch.compile traces before any
    eager call then finds its routes resolved: routing reads the device (cuDNN's version, the
    compute capability, installed packages) through calls a trace cannot hold in one graph, and
    imports the kernels, which must not first happen inside a trace (see preload)."""
    if not torch.cuda.is_available():
        return []
    return [(torch.device("cuda"), dtype) for dtype in _KERNEL_DTYPES]


def rope_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an attention layer on ``device`` in ``dtype`` rotates and splits its projections
    with the RoPE kernel (nsa.kernels.rope): on CUDA, where the Triton kernels run, for the
    kernels' dtypes. The kernel is imported here, ahead of a first call that torch.compile may
    trace (see preload)."""
    if device.type != "cuda" or not _triton_available(device, dtype)[0]:
        return False
    kb.import_kernels()
    return True


def phi_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the compressors' MLP can run on its Triton kernels (nsa.kernels.phi_mlp) for
    streams on ``device`` in ``dtype``: where the Triton kernels run. An NSA layer asks for them
    where its own kernels run (RoPE's, see NSAAttention._routes_for), which imports them."""
    return _triton_available(device, dtype)[0]


def preload(route: Route) -> None:
    """Import the route's kernels now: the kernel functions import their modules on first call,
    and that first call must not happen while torch.compile traces (a graph break at every NSA
    stage; seen as recompile-limit warnings)."""
    if BACKENDS[route.stage][route.backend].kernels:
        kb.import_kernels()
