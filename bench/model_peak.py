"""The preset model's training step (bf16 autocast forward, cross entropy, backward, fused AdamW,
batch 1): its peak memory, allocated and reserved, for the kinds and lengths asked, with no timing.
The question it answers fast is whether a checkout's model holds more than another's: it takes the
step of ``bench/nsa_vs_dense.py`` from whichever checkout's ``bench`` is first on the path, so the
same script measures an earlier commit unpacked beside this one (bench/gpu/checkout_peaks.sh).

    python bench/model_peak.py --lengths 128k --compiled             # NSA, torch.compile
    python bench/model_peak.py --lengths 32k 64k --kinds nsa dense   # eager, both
    python bench/model_peak.py --compiled --sel kept_tokens=131072   # the selected branch's launch
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_nsa import tuning_arg  # noqa: E402
from bench.nsa_vs_dense import _free, _peak_gb, model_step, model_step_args  # noqa: E402
from nsa.kernels import tuning  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_step_args(ap, "128k")
    ap.add_argument("--kinds", nargs="+", default=["nsa"], choices=("nsa", "dense"))
    ap.add_argument("--sel", type=tuning_arg(tuning.SelectionTuning), default=tuning.SelectionTuning(),
                    metavar="KEY=VALUE,...", help="the selected branch's tuning (nsa.kernels.tuning.SelectionTuning)")
    args = ap.parse_args(argv)
    tuning.SELECTION = args.sel
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    device = torch.device("cuda")
    for S in args.lengths:
        for kind in args.kinds:
            torch._dynamo.reset()
            t0 = time.perf_counter()
            model, run = model_step(kind, S, args.model, device, args.compiled)
            run()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            reserved, allocated = _peak_gb(run)
            print(f"# S={S // 1024}k {'compiled' if args.compiled else 'eager'} {kind}"
                  f"{' ' + args.sel.as_arg() if args.sel.as_arg() else ''}: first step {first:.1f} s, "
                  f"{allocated:.2f} GB allocated, {reserved:.2f} GB reserved", flush=True)
            del model, run
            _free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
