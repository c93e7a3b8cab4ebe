"""NSA attention against dense attention of the same shape, as a user of the module sees them:
one attention layer (projections, RoPE and gates included) and the whole model's training step,
on one GPU, batch 1, bf16 autocast, NSA and dense measured in the same run.

For each length: the layer's forward + backward in eager mode (NSAAttention against
DenseAttention, SDPA on its 'dense' route) with the peak memory of each, the NSA layer as it runs
by default (replaying its own CUDA graphs up to nsa.attention.graphed.GRAPH_TOKENS tokens) and
without its graphs; the model's training
step (forward, backward, fused AdamW) eager and ``torch.compile(model, fullgraph=True)`` (no
CUDA graphs) with the peak memory of each; the host time to enqueue one NSA layer forward +
backward (the device left to run behind), with and without its graphs; and the kernel launches
of one NSA layer forward + backward without its graphs (torch.profiler's device kernels, memsets and copies counted apart). Times are
triton.testing.do_bench medians after a warm-up; ratios are dense time over NSA time (above 1:
NSA is faster).

    python bench/nsa_vs_dense.py                                  # 4k 16k 32k 64k 128k
    python bench/nsa_vs_dense.py --lengths 4k 16k --compile-lengths 16k
    python bench/nsa_vs_dense.py --lengths 16k --parts launches --kernels 40   # the launches by kernel
    python bench/nsa_vs_dense.py --lengths 16k 32k --parts layer host --nsa-set model.attn.backend_cmp=triton
    python bench/nsa_vs_dense.py --lengths 128k --parts layer --topk select_warps=4   # another top-n launch
    python bench/nsa_vs_dense.py --lengths 32k --parts compiled --sel partials_budget=268435456   # smaller chunks

The shape is a model preset's (m7c_125m: 12 query heads, 2 KV heads, head dim 64, 12 layers).
"""
from __future__ import annotations

import argparse
import collections
import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_nsa import _bench as _median_ms  # noqa: E402
from bench.bench_nsa import _host_ms, tuning_arg  # noqa: E402
from nsa.attention import NSAAttention, compress, graphed  # noqa: E402
import nsa.kernels  # noqa: E402
from nsa.kernels import tuning  # noqa: E402
from nsa.attention.dense import DenseAttention  # noqa: E402
from nsa.model.config import load_model_config  # noqa: E402
from nsa.model.model import NSATransformer  # noqa: E402

PARTS = ("layer", "model", "compiled", "host", "launches")
KINDS = ("nsa", "dense")


def length(text: str) -> int:
    """'16k' -> 16384; plain integers as they are."""
    try:
        return int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"length {text!r}: an integer, or one with a k suffix (16k)") from None


def model_step_args(ap: argparse.ArgumentParser, lengths: str) -> None:
    """The options of a script that measures ``model_step``: --lengths (default ``lengths``),
    --compiled and --model."""
    ap.add_argument("--lengths", nargs="+", type=length, default=[length(s) for s in lengths.split()])
    ap.add_argument("--compiled", action="store_true", help="torch.compile(model, fullgraph=True), no CUDA graphs")
    ap.add_argument("--model", default="m7c_125m", help="the model preset whose shape is measured")


def _peak_gb(fn) -> tuple[float, float]:
    """Peak memory the allocator reserves and that tensors hold during one call, the unused
    cache emptied first (GB, all of it: parameters and optimizer state too). Reserved is what
    the process takes from the GPU (a CUDA graph's pool holds its activations between replays,
    and while a replay writes them the allocator counts that memory as reserved only); allocated
    leaves out the allocator's unused cached blocks."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_reserved() / 1e9, torch.cuda.max_memory_allocated() / 1e9


def launches(fn) -> tuple[int, int, collections.Counter]:
    """(kernels, memsets and copies, kernels by name) the device ran for one call of fn."""
    fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = collections.Counter()
    other = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.startswith(("Memset", "Memcpy")):
            other += 1
        else:
            names[e.name] += 1
    return sum(names.values()), other, names


#: overrides of the NSA model's config (--nsa-set)
NSA_SET: list[str] = []
#: the NSA layers' graph_tokens (--graph-tokens)
GRAPH_TOKENS = [graphed.GRAPH_TOKENS]


def _config(model_name: str, kind: str):
    return load_model_config(model_name, [f"model.attn.kind={kind}"] + (NSA_SET if kind == "nsa" else []))


def layer_step(kind: str, S: int, model_name: str, device: torch.device, graphs: bool = True):
    """One attention layer of the preset's shape and its forward + backward under bf16 autocast
    (gradients of the input and every parameter, as a training step takes them). ``graphs``:
    whether the NSA layer replays its own CUDA graphs (nsa.attention.graphed) as it does by default."""
    cfg = _config(model_name, kind)
    args = (cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.attn, cfg.rope_theta)
    layer = (NSAAttention(*args, graph_tokens=GRAPH_TOKENS[0] if graphs else 0) if kind == "nsa"
             else DenseAttention(*args)).to(device)
    x = torch.randn(1, S, cfg.dim, device=device, requires_grad=True)
    do = torch.randn(1, S, cfg.dim, device=device, dtype=torch.bfloat16)
    leaves = [x, *layer.parameters()]

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = layer(x)
        torch.autograd.grad(o, leaves, do)

    return layer, run


def model_step(kind: str, S: int, model_name: str, device: torch.device, compiled: bool):
    """The preset's model and one training step on S random tokens: bf16 autocast forward,
    cross entropy, backward, fused AdamW."""
    cfg = _config(model_name, kind)
    torch.manual_seed(0)
    model = NSATransformer(cfg).to(device)
    graphed.set_graph_tokens(model, GRAPH_TOKENS[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model, fullgraph=True) if compiled else model
    tokens = torch.randint(0, cfg.vocab_size, (1, S + 1), device=device)

    def run():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()

    return model, run


@dataclass
class Row:
    S: int
    cells: dict[str, str] = field(default_factory=dict)


def _free():
    gc.collect()
    torch.cuda.empty_cache()


def _ratio(dense_ms: float, nsa_ms: float) -> str:
    return f"{dense_ms / nsa_ms:.2f}x ({nsa_ms:.2f} vs {dense_ms:.2f} ms)"


def measure(S: int, model_name: str, parts: set[str], compile_lengths: set[int], device, kernels: int) -> Row:
    row = Row(S)
    if "layer" in parts:
        ms, gb = {}, {}
        for kind in KINDS:
            _, run = layer_step(kind, S, model_name, device)
            ms[kind] = _median_ms(run)
            gb[kind] = _peak_gb(run)[0]
            del run
            _free()
        _, run = layer_step("nsa", S, model_name, device, graphs=False)
        eager_ms = _median_ms(run)
        del run
        _free()
        row.cells["layer fwd+bwd (dense/NSA)"] = _ratio(ms["dense"], ms["nsa"])
        row.cells["layer without its graphs (dense/NSA)"] = _ratio(ms["dense"], eager_ms)
        row.cells["layer peak GB reserved (NSA / dense)"] = f"{gb['nsa']:.2f} / {gb['dense']:.2f}"
    if "host" in parts:
        for graphs, label in ((True, "NSA layer host ms"), (False, "without its graphs")):
            _, run = layer_step("nsa", S, model_name, device, graphs)
            row.cells[label] = f"{_host_ms(run):.2f}"
            del run
            _free()
    if "launches" in parts:
        _, run = layer_step("nsa", S, model_name, device, graphs=False)  # the kernels, not graph launches
        n, other, names = launches(run)
        _, dense_run = layer_step("dense", S, model_name, device)
        dn, dother, _ = launches(dense_run)
        row.cells["launches NSA (dense)"] = f"{n}+{other} ({dn}+{dother})"
        if kernels:
            print(f"# S={S}: the NSA layer's fwd+bwd, {n} kernels and {other} memsets/copies; by name:")
            for name, count in names.most_common(kernels):
                print(f"#   {count:3d}  {name[:150]}")
        del run, dense_run
        _free()
    for compiled, part in ((False, "model"), (True, "compiled")):
        if part not in parts or (compiled and S not in compile_lengths):
            continue
        ms, gb = {}, {}
        label = "model compiled" if compiled else "model eager"
        try:
            for kind in KINDS:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                model, run = model_step(kind, S, model_name, device, compiled)
                run()
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                ms[kind] = _median_ms(run)
                gb[kind] = _peak_gb(run)
                print(f"# S={S} {label} {kind}: first step {first:.1f} s, {ms[kind]:.2f} ms, "
                      f"{gb[kind][0]:.2f} GB reserved, {gb[kind][1]:.2f} GB allocated", flush=True)
                del model, run
                _free()
        except Exception as exc:  # a compile that fails is a result of this table, not the end of it
            row.cells[f"{label} (dense/NSA)"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            _free()
            continue
        row.cells[f"{label} (dense/NSA)"] = _ratio(ms["dense"], ms["nsa"])
        for i, what in enumerate(("reserved", "allocated")):
            row.cells[f"{label} peak GB {what} (NSA / dense)"] = f"{gb['nsa'][i]:.2f} / {gb['dense'][i]:.2f}"
    return row


def table(rows: list[Row]) -> str:
    cols = []
    for r in rows:
        cols += [c for c in r.cells if c not in cols]
    lines = ["| S | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r.S // 1024}k | " + " | ".join(r.cells.get(c, "-") for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", nargs="+", type=length, default=[length(s) for s in ("4k", "16k", "32k", "64k",
                                                                                    "128k")])
    ap.add_argument("--compile-lengths", nargs="*", type=length, default=None,
                    help="lengths of the compiled model's rows (default: --lengths)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--model", default="m7c_125m", help="the model preset whose shape is measured")
    ap.add_argument("--kernels", type=int, default=0, help="print the NSA layer's N most launched kernels")
    ap.add_argument("--nsa-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides of the NSA model's config (model.attn.backend_cmp=triton)")
    ap.add_argument("--graph-tokens", type=int, default=graphed.GRAPH_TOKENS,
                    help="the NSA layers' own CUDA graphs up to this many tokens (0: none; "
                         "default %(default)s, the layer's)")
    ap.add_argument("--recompute-tokens", type=length, default=compress.RECOMPUTE_TOKENS,
                    help="the NSA layers recompute in the backward from this many tokens (nsa.attention.compress."
                         "RECOMPUTE_TOKENS; a length above --lengths' turns it off; default %(default)s)")
    ap.add_argument("--topk", type=tuning_arg(tuning.TopkTuning), default=tuning.TopkTuning(), metavar="KEY=VALUE,...",
                    help="the NSA layers' top-n launch parameters instead of the defaults (nsa.kernels.tuning."
                         "TopkTuning fields, as bench/bench_nsa.py --sweep prints them)")
    ap.add_argument("--band", type=tuning_arg(tuning.BandTiles), default=tuning.BandTiles(), metavar="KEY=VALUE,...",
                    help="the band kernels' launches instead of the defaults (nsa.kernels.tuning.BandTiles fields)")
    ap.add_argument("--sel", type=tuning_arg(tuning.SelectionTuning), default=tuning.SelectionTuning(),
                    metavar="KEY=VALUE,...", help="the selected branch's launches and budgets instead of the defaults "
                                                  "(nsa.kernels.tuning.SelectionTuning fields)")
    ap.add_argument("--cudnn-min-elements", type=int, default=nsa.kernels.CUDNN_MIN_ELEMENTS,
                    help="the compressed branch folds for cuDNN from this many query elements (nsa.kernels."
                         "CUDNN_MIN_ELEMENTS; default %(default)s)")
    args = ap.parse_args(argv)
    compress.RECOMPUTE_TOKENS = args.recompute_tokens
    tuning.TOPK = args.topk
    tuning.BAND = args.band
    tuning.SELECTION = args.sel
    nsa.kernels.CUDNN_MIN_ELEMENTS = args.cudnn_min_elements
    NSA_SET[:] = args.nsa_set
    GRAPH_TOKENS[0] = args.graph_tokens
    if not torch.cuda.is_available():
        ap.error("this benchmark needs a CUDA GPU")
    device = torch.device("cuda")
    compile_lengths = set(args.lengths if args.compile_lengths is None else args.compile_lengths)
    rows = []
    for S in args.lengths:
        rows.append(measure(S, args.model, set(args.parts), compile_lengths, device, args.kernels))
        print(table(rows[-1:]), flush=True)
    print(f"\n# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.model}, batch 1, bf16 autocast; "
          f"ratio = dense ms / NSA ms; NSA layers graphed up to {GRAPH_TOKENS[0]} tokens, recomputing from "
          f"{compress.RECOMPUTE_TOKENS}"
          f"{'; NSA with ' + ' '.join(NSA_SET) if NSA_SET else ''}"
          + "".join(f"; {name} {t.as_arg()}" for name, t in (("top-n", args.topk), ("band", args.band),
                                                              ("selected", args.sel)) if t.as_arg())
          + f"; cuDNN fold from {nsa.kernels.CUDNN_MIN_ELEMENTS} query elements")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
