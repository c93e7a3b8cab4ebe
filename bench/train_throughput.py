#!/usr/bin/env python
"""Training throughput and peak memory of a model config over micro-batch sizes x sequence
lengths, on one GPU, for each attention kind asked for: NSA and the dense causal attention of the
same shape (model.attn.kind=dense: same model, same projections and RoPE, SDPA; see
nsa/attention/dense.py), one after the other in the same run.

    python bench/train_throughput.py                                  # m7c_125m, B in 1 2 4, T in 1024 2048 4096
    python bench/train_throughput.py --batch-sizes 1 2 --seq-lens 2048 --baseline --json out.json
    python bench/train_throughput.py --kinds nsa dense --batch-sizes 1 --seq-lens 4096 16384 65536 \
        --cuda-graphs --override train.grad_accum=1                   # long context, both kinds
    python bench/train_throughput.py --config tiny --device cpu --batch-sizes 1 --seq-lens 64 --steps 2 --warmup 1

Each cell builds a fresh model, runs ``--warmup`` untimed optimizer steps, then ``--steps``
timed ones (forward, backward, clip, AdamW step; bf16 autocast by default; gradient
accumulation as configured) with a device synchronisation around the timed region. Tokens/s =
batch x seq_len x grad_accum x steps / seconds. A cell that runs out of memory is reported as
OOM and the sweep goes on. Which backend each NSA stage used is printed once per cell.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from nsa.attention import set_graph_tokens  # noqa: E402
from nsa.model import NSATransformer, backend_report  # noqa: E402
from nsa.train.config import load_run_config  # noqa: E402
from nsa.train.optim import build_optimizer, fused_adamw  # noqa: E402
from nsa.train.graphs import StepGraph  # noqa: E402
from nsa.train.parallelize import apply_activation_checkpointing, apply_compile  # noqa: E402
from nsa.train.profile import busy_fraction, device_events, device_intervals  # noqa: E402

GB = 1024**3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_cell(kind: str, cfg, batch: int, seq_len: int, args, device: torch.device) -> dict:
    """One cell. With --cuda-graphs the forward and backward of the step's micro-batches run
    as one CUDA graph through the trainer's own StepGraph (nsa/train/graphs.py), on its side
    stream, captured after the warm-up steps; clip and optimizer stay eager, as in the trainer."""
    stream = torch.cuda.Stream(device) if args.cuda_graphs else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        return _run_cell(kind, cfg, batch, seq_len, args, device, stream)


def _run_cell(kind, cfg, batch, seq_len, args, device, stream) -> dict:
    tc = cfg.train
    torch.manual_seed(0)
    model_cfg = dataclasses.replace(cfg.model, attn=dataclasses.replace(cfg.model.attn, kind=kind))
    model = NSATransformer(model_cfg).to(device)
    set_graph_tokens(model, 0)  # as the trainer: whole steps are graphed, or none
    if tc.activation_checkpointing:
        apply_activation_checkpointing(model)
    if tc.compile:
        apply_compile(model, device, torch.bfloat16 if tc.dtype == "bfloat16" else torch.float32)
    opt = build_optimizer(model, tc, fused_adamw(tc.fused_adamw, device))
    dtype = torch.bfloat16 if tc.dtype == "bfloat16" else None
    x = torch.randint(0, cfg.model.vocab_size, (batch, seq_len + 1), device=device)
    batches = [(x[:, :-1], x[:, 1:])] * tc.grad_accum
    graph = StepGraph(stream) if stream is not None else None

    def forward_backward(micro_batches) -> None:
        for inp, tgt in micro_batches:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(inp)
            loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()) / tc.grad_accum
            loss.backward()

    def step(graphed: bool) -> None:
        if graphed:
            graph.run(batches, forward_backward)
        else:
            forward_backward(batches)
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        if graph is None or not graph.owns_grads:  # a captured backward writes the gradients in place
            opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step(graphed=False)
    timed = functools.partial(step, graphed=graph is not None)
    if graph is not None:
        timed()  # the capture step
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        timed()
    sync(device)
    secs = time.perf_counter() - t0
    out = {
        "model": kind, "batch": batch, "seq_len": seq_len, "grad_accum": tc.grad_accum,
        "toks_per_s": batch * seq_len * tc.grad_accum * args.steps / secs,
        "step_ms": 1000 * secs / args.steps,
        "peak_alloc_gb": torch.cuda.max_memory_allocated(device) / GB if device.type == "cuda" else None,
        "peak_reserved_gb": torch.cuda.max_memory_reserved(device) / GB if device.type == "cuda" else None,
        "status": "ok",
        "cuda_graphs": graph is not None and graph.owns_grads,
    }
    out["backends"] = {s: b["backend"] for s, b in backend_report(model, seq_len).items()}
    if args.profile:
        out["gpu_busy_frac"] = profile_steps(timed, args.profile, device, f"{kind} B={batch} S={seq_len}",
                                             args.profile_rows)
    return out


#: kernel families of a step's profile, first match wins: the attention kernels of either kind
#: (cuDNN's and flash's fused attention, this project's Triton kernels, named _..._kernel), the
#: matrix products (cuBLAS, CUTLASS), and the rest (elementwise, norms, reductions, copies)
FAMILIES = (
    ("attention: cuDNN / flash SDPA", re.compile(r"cudnn|fmha|flash|sdpa", re.I)),
    ("attention: NSA Triton kernels", re.compile(r"^_\w+_kernel")),
    ("matrix products (cuBLAS/CUTLASS)", re.compile(r"gemm|nvjet|xmma|cutlass|sm90_|sm80_", re.I)),
    ("optimizer (AdamW, grad clip)", re.compile(r"adam|multi_tensor|foreach", re.I)),
)
OTHER = "other (elementwise, norms, copies)"


def kernel_table(events, n_steps: int) -> list[tuple[str, str, float, float]]:
    """(family, kernel, device ms per step, launches per step) of a profile's device events, by
    FAMILIES, the longest first."""
    per_kernel: dict[str, list[float]] = {}
    for e in device_events(events):
        t = per_kernel.setdefault(e.name, [0.0, 0])
        t[0] += (e.time_range.end - e.time_range.start) / 1e3 / n_steps
        t[1] += 1 / n_steps
    rows = [(next((f for f, rx in FAMILIES if rx.search(name)), OTHER), name, ms, calls)
            for name, (ms, calls) in per_kernel.items()]
    return sorted(rows, key=lambda r: -r[2])


def profile_steps(step, n_steps: int, device: torch.device, label: str, rows: int = 25) -> float | None:
    """Profile ``n_steps`` more steps: print the kernels with the most device time, their sum by
    family (attention, matrix products, the rest) per step, and return the share of the profiled
    wall time the device was busy (nsa.train.profile.busy_fraction; low: the step is launch-bound)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        with record_function("bench.steps"):
            for _ in range(n_steps):
                step()
            sync(device)
    if device.type != "cuda":
        print(f"# profile of {n_steps} steps, {label}: top ops by CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70))
        return None
    events = prof.events()
    table = kernel_table(events, n_steps)
    print(f"# profile of {n_steps} steps, {label}: device ms per step by kernel family")
    families: dict[str, list] = {}
    for family, _, ms, _ in table:
        t = families.setdefault(family, [0.0, 0])
        t[0] += ms
        t[1] += 1
    for family, (ms, n) in sorted(families.items(), key=lambda kv: -kv[1][0]):
        print(f"#   {family}: {ms:.2f} ms ({n} kernels)")
    print(f"# the {rows} longest kernels, {label}")
    print("| ms/step | launches/step | family | kernel |\n|---:|---:|---|---|")
    for family, name, ms, calls in table[:rows]:
        print(f"| {ms:.3f} | {calls:g} | {family} | {name[:100]} |")
    window = next(e for e in events if e.name == "bench.steps" and e.device_type != torch.autograd.DeviceType.CUDA
                  ).time_range
    busy = busy_fraction(device_intervals(events), (window.start, window.end))
    print(f"# device busy {busy:.1%} of {(window.end - window.start) / 1e3:.1f} ms wall")
    return busy


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="m7c_125m", help="preset or YAML (model + train sections are used)")
    p.add_argument("--override", action="append", default=[], help="dotted overrides, e.g. 'train.grad_accum=1'")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4], help="micro-batch sizes")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per cell")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps per cell (compile, autotune)")
    p.add_argument("--kinds", nargs="+", default=["nsa"], choices=["nsa", "dense"],
                   help="attention kinds to time (model.attn.kind), each cell in this order")
    p.add_argument("--baseline", action="store_true", help="also time the dense kind (same as --kinds nsa dense)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each step's forward and backward as one CUDA graph (both models; CUDA only)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test only)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N more steps per cell: top kernels, device ms per step "
                        "by kernel family, device-busy fraction")
    p.add_argument("--profile-rows", type=int, default=25, help="kernels listed by --profile")
    args = p.parse_args(argv)

    cfg, _ = load_run_config(args.config, args.override, env={})
    device = torch.device(args.device)
    if args.cuda_graphs and device.type != "cuda":
        p.error("--cuda-graphs needs --device cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda but CUDA is not available (use --device cpu for a smoke test)")
        torch.cuda.set_device(device.index or 0)
        print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    tc = cfg.train
    print(f"# config {args.config}: dim {cfg.model.dim}, {cfg.model.n_layers} layers, dtype {tc.dtype}, "
          f"grad_accum {tc.grad_accum}, activation_checkpointing {tc.activation_checkpointing}, "
          f"compile {tc.compile}, fused_adamw {tc.fused_adamw} (fused: {fused_adamw(tc.fused_adamw, device)}), cuda_graphs {args.cuda_graphs}; "
          f"{args.warmup} warm-up + {args.steps} timed steps")
    kinds = list(dict.fromkeys(args.kinds + (["dense"] if args.baseline else [])))
    rows = []
    print("| model | batch | seq_len | toks/s | step ms | peak alloc GB | peak reserved GB | status |")
    print("|---|---|---|---|---|---|---|---|")
    for seq_len in args.seq_lens:
        for batch in args.batch_sizes:
            for kind in kinds:
                try:
                    row = run_cell(kind, cfg, batch, seq_len, args, device)
                except torch.OutOfMemoryError:
                    row = {"model": kind, "batch": batch, "seq_len": seq_len, "toks_per_s": None,
                           "step_ms": None, "peak_alloc_gb": None, "peak_reserved_gb": None, "status": "OOM"}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                rows.append(row)
                print(f"| {kind} | {batch} | {seq_len} | {fmt(row['toks_per_s'], ',.0f')} | "
                      f"{fmt(row['step_ms'], '.1f')} | {fmt(row['peak_alloc_gb'], '.2f')} | "
                      f"{fmt(row['peak_reserved_gb'], '.2f')} | {row['status']} |", flush=True)
    for kind in kinds:
        backends = next((r["backends"] for r in rows if r["model"] == kind and "backends" in r), None)
        if backends:
            print(f"# {kind} backends: {backends}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
