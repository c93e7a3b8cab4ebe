"""An NSA layer on the kernels against the same layer in float64 on the PyTorch path, under launch
variants, each in a process of its own (a kernel that faults leaves its CUDA context unusable):
which setting a failing GPU case depends on, and whether a change of it computes the right values.

    python bench/layer_variants.py                       # every variant of the default case
    python bench/layer_variants.py --variants base stages1 tf32

The default case is tests/kernels/test_triton_layer.py's mlp-G5-K48-B3 prefill (float32, B 3,
T 23, 5 query heads on one KV head, head dim 48). Each variant prints its largest error of the
output and of dx against the float64 layer, or the error it raised.
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # nsa and tests/ importable from a checkout

#: the test's prefill case (tests/kernels/test_triton_layer.py's PREFILL) and its model width
CASE, DIM = "mlp-G5-K48-B3", 24

#: variant -> what it changes (see _apply)
VARIANTS = {
    "base": "nothing: the test's case",
    "stages1": "the selected forward/dq kernels' pipeline: one stage (SelectionTuning.fwd_stages=1)",
    "tf32": "float32 products in TF32 instead of tf32x3 (torch allows TF32)",
    "tt1": "one query token a program (SelectionTuning.tt=1)",
    "warps8": "the selected forward/dq kernels at 8 warps (SelectionTuning.fwd_warps=8)",
    "k64": "head dim 64",
    "g4": "4 query heads a KV head",
    "bf16": "bfloat16 autocast",
}


def _apply(variant: str, case: dict) -> None:
    import torch
    from nsa.kernels import tuning
    if variant == "stages1":
        tuning.SELECTION = dataclasses.replace(tuning.SELECTION, fwd_stages=1)
    elif variant == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    elif variant == "tt1":
        tuning.SELECTION = dataclasses.replace(tuning.SELECTION, tt=1)
    elif variant == "warps8":
        tuning.SELECTION = dataclasses.replace(tuning.SELECTION, fwd_warps=8)
    elif variant == "k64":
        case["K"] = 64
    elif variant == "g4":
        case["HQ"] = 4


def run_one(variant: str) -> str:
    import torch
    from tests.kernels.test_triton_layer import PREFILL, _layers
    cfg, B, T, HQ, H, K, _ = PREFILL[CASE]
    case = dict(B=B, T=T, HQ=HQ, H=H, K=K)
    _apply(variant, case)
    ref, layer = _layers(torch.device("cuda"), cfg, DIM, case["HQ"], case["H"], case["K"], seed=T)
    x = torch.randn(B, T, DIM, dtype=torch.float64)
    x_ref, x32 = x.clone().requires_grad_(), x.float().cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=variant == "bf16"):
        y = layer(x32)
    (dx,) = torch.autograd.grad(y.float().sum(), x32)
    torch.cuda.synchronize()
    y_ref = ref(x_ref)
    (dx_ref,) = torch.autograd.grad(y_ref.sum(), x_ref)
    err_y = (y.double().cpu() - y_ref).abs().max().item()
    err_dx = (dx.double().cpu() - dx_ref).abs().max().item()
    return f"max |y - y64| {err_y:.2e}, max |dx - dx64| {err_dx:.2e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # the child process
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per variant")
    args = ap.parse_args()
    if args.one:
        print(run_one(args.one))
        return
    for v in args.variants:
        try:
            p = subprocess.run([sys.executable, __file__, "--one", v], capture_output=True, text=True,
                               timeout=args.timeout)
            lines = (p.stdout + p.stderr).strip().splitlines()
            last = lines[-1] if lines else ""
            result = f"ok: {last}" if p.returncode == 0 else f"exit {p.returncode}: {last[:300]}"
        except subprocess.TimeoutExpired:
            result = f"timed out after {args.timeout:.0f} s"
        print(f"{v:8s} ({VARIANTS[v]}): {result}", flush=True)


if __name__ == "__main__":
    main()
