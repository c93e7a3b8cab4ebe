"""Where the model's training step spends the GPU's time, NSA against dense of the same shape: the
device time of one step (bf16 autocast forward, cross entropy, backward, fused AdamW, batch 1; the
step of ``bench/nsa_vs_dense.py``) by kind of kernel, from torch.profiler, beside the step's median
time (do_bench). The NSA kernels' rows say which branch or stage each is; the rest (matmuls,
inductor's fused kernels, torch's own) is the work around the attention core that both models do,
and that NSA does more of (three key/value projections, the compressors, the gates, what a layer
makes again in its backward from 32k).

    python bench/model_split.py --lengths 32k --compiled
    python bench/model_split.py --lengths 16k 32k          # eager, the NSA layers' graphs as by default
    python bench/model_split.py --lengths 32k --compiled --kernels 15   # also the longest kernels
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_nsa import _bench as _median_ms  # noqa: E402
from bench.nsa_vs_dense import KINDS, _free, model_step, model_step_args  # noqa: E402

#: (part, pattern of a device kernel's name), the first that matches names the part
PARTS = (
    ("NSA band kernel (compressed, window)", r"^_band_"),
    ("NSA selected branch", r"^_(sel|blocks|combine|row_delta|tile_union|work_items|sorted_tokens|selection_keys)_"),
    ("NSA top-n", r"^_(score|select)_kernel"),
    ("NSA RoPE and split", r"^_rope_"),
    ("cuDNN / flash attention (dense's, NSA's compressed fold)", r"cudnn|flash|fmha|sdpa"),
    ("matmuls (cuBLAS)", r"gemm|nvjet|xmma|cutlass|cublas|Kernel2"),
    ("optimizer (fused AdamW)", r"(?i)adam|multi_tensor"),
    ("inductor's fused kernels", r"^triton_"),
    ("copies and memsets", r"^(Memcpy|Memset)"),
    ("torch's other kernels", r""),
)


def part_of(name: str) -> str:
    return next(part for part, pattern in PARTS if re.search(pattern, name))


def device_ms(run, steps: int = 3) -> tuple[dict[str, float], collections.Counter]:
    """Device time per step by part (ms), and by kernel name, over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    by_part: dict[str, float] = collections.defaultdict(float)
    by_name: collections.Counter = collections.Counter()
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = e.device_time_total / 1e3 / steps
        by_part[part_of(e.name)] += ms
        by_name[e.name] += ms
    return dict(by_part), by_name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_step_args(ap, "32k")
    ap.add_argument("--kernels", type=int, default=0, help="also each model's N kernels of the most device time")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    device = torch.device("cuda")
    how = "compiled" if args.compiled else "eager"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.model}, batch 1, bf16 autocast, "
          f"{how}; device ms per step by part (torch.profiler, 3 steps), step ms (do_bench median)")
    for S in args.lengths:
        parts, step_ms = {}, {}
        for kind in KINDS:
            torch._dynamo.reset()
            model, run = model_step(kind, S, args.model, device, args.compiled)
            run()
            step_ms[kind] = _median_ms(run)
            parts[kind], names = device_ms(run)
            if args.kernels:
                print(f"# S={S // 1024}k {how} {kind}: the {args.kernels} kernels of the most device time, ms a step")
                for name, ms in names.most_common(args.kernels):
                    print(f"#   {ms:8.2f}  {name[:140]}")
            del model, run
            _free()
        print(f"\n| S={S // 1024}k {how} | NSA ms | dense ms |\n|---|---:|---:|")
        for part, _ in PARTS:
            if any(part in parts[k] for k in KINDS):
                print(f"| {part} | {parts['nsa'].get(part, 0):.2f} | {parts['dense'].get(part, 0):.2f} |")
        print(f"| device time, all kernels | {sum(parts['nsa'].values()):.2f} | {sum(parts['dense'].values()):.2f} |")
        print(f"| step (do_bench median) | {step_ms['nsa']:.2f} | {step_ms['dense']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
