"""What the backends' report says ran: the compressed branch's 'cudnn' route folds long prefills
only (nsa.kernels.cudnn_folds) and runs the Triton band kernel below them. The trainer's env.json,
and so every report, said 'cmp: cudnn' of the seeds' model at 4k to 32k tokens, where the band
kernel ran (4,096 x 12 heads x 64 = 3,145,728 query elements, under cuDNN's 2^25)."""
from __future__ import annotations

import pytest
import torch

from nsa.attention.backends import Route
from nsa.kernels import CUDNN_MIN_ELEMENTS, cudnn_folds
from nsa.model import NSATransformer, backend_report
from nsa.model.config import load_model_config
from nsa.model.telemetry import attention_modules

#: m7c_125m's attention: 12 query heads of 64; the compressed branch's l = 32, d = 16
M7C = dict(heads=12, head_dim=64, l=32, d=16)


@pytest.mark.parametrize("queries, heads, head_dim, q_start, deterministic, folds", [
    (4096, 12, 64, 0, False, False),      # m7c at 4k: 3.1M query elements
    (32768, 12, 64, 0, False, False),     # m7c at 32k: 25.2M, under 2^25
    (65536, 12, 64, 0, False, True),      # m7c at 64k: 50.3M
    (65536, 12, 64, 0, True, False),      # a fixed summation order asked for
    (65536, 12, 64, 64, False, False),    # chunked prefill, decode
    (16384, 64, 128, 0, False, True),     # the benchmark shape at 16k: 134M
    (8192, 64, 128, 0, False, False),     # under CUDNN_MIN_QUERIES however many elements
    (65536, 12, 256, 0, False, False),    # a head dim cuDNN's fused attention does not take
])
def test_cudnn_folds_long_prefills_of_enough_elements(queries, heads, head_dim, q_start, deterministic, folds):
    assert cudnn_folds(queries, heads, head_dim, M7C["l"], M7C["d"], q_start, deterministic) is folds


def _model_on_cudnn_route() -> NSATransformer:
    """The tiny model with its layers' compressed branch routed as on a GPU in bf16 ('auto' picks
    cuDNN's there; on this CPU the route is set by hand, nothing runs)."""
    model = NSATransformer(load_model_config("tiny"))
    for m in attention_modules(model):
        m.routes = {"cmp": Route("cmp", "cudnn", "cuDNN fused attention over folded query runs"),
                    "sel": Route("sel", "triton", "Triton")}
    return model


def test_the_report_names_the_band_kernel_where_the_cudnn_route_does_not_fold():
    model = _model_on_cudnn_route()
    m = attention_modules(model)[0]
    short = backend_report(model, 4096)
    assert short["cmp"]["backend"] == "triton", short
    elements = 4096 * m.n_heads * m.head_dim
    assert short["cmp"]["reason"] == (
        f"the Triton band kernel at 4,096 tokens: attn.backend_cmp's cuDNN route folds long prefills only, and these "
        f"have 4,096 tokens, under 16,384; {elements:,} query elements (4,096 x {m.n_heads} heads x {m.head_dim}), "
        f"under {CUDNN_MIN_ELEMENTS:,}")
    assert short["sel"]["backend"] == "triton" and short["cmp"]["fallback"] is False
    # long enough, too few elements: the m7c model from 16k to 32k tokens
    few = backend_report(model, 20000)["cmp"]["reason"]
    assert few.endswith(f"and these have {20000 * m.n_heads * m.head_dim:,} query elements (20,000 x {m.n_heads} heads "
                        f"x {m.head_dim}), under {CUDNN_MIN_ELEMENTS:,}"), few
    # long enough to fold: the route's own name and reason
    long = CUDNN_MIN_ELEMENTS // (m.n_heads * m.head_dim) + 16
    assert backend_report(model, long)["cmp"] == {"backend": "cudnn", "reason": "cuDNN fused attention over folded "
                                                  "query runs", "fallback": False, "calls": None}
    # no length given: the route as chosen
    assert backend_report(model)["cmp"]["backend"] == "cudnn"


def test_under_a_fixed_summation_order_the_report_says_the_band_kernel_runs():
    model = _model_on_cudnn_route()
    m = attention_modules(model)[0]
    long = CUDNN_MIN_ELEMENTS // (m.n_heads * m.head_dim) + 16
    torch.use_deterministic_algorithms(True)
    try:
        entry = backend_report(model, long)["cmp"]
    finally:
        torch.use_deterministic_algorithms(False)
    assert entry == {"backend": "triton", "reason": "the Triton band kernel: attn.backend_cmp's cuDNN route runs it where "
                     "a fixed summation order is asked for (torch.use_deterministic_algorithms)", "fallback": False,
                     "calls": None}
