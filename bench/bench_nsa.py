"""Benchmark of the NSA core and its kernels against full causal attention (PyTorch SDPA, cuDNN
and flash), FlexAttention with the 512-token sliding window and fla-core's parallel_nsa
(compression + selection) when importable. The ops come from one registry (bench/ops.py), the
inputs from bench/inputs.py: random, or the q/k/v a trained model makes on real text
(bench/trained_inputs.py), side by side, each with the locality of its selection (distinct
blocks per 16, 32 and 64 tokens). Forward and forward+backward, triton.testing.do_bench medians,
achieved TFLOP/s and GB/s (bench/kernel_work.py: lower bounds), peak memory of one
forward+backward, the host time to enqueue one (close to the measured time: launch-bound), and
the ratio to SDPA cuDNN of the same run and inputs.

    python bench/bench_nsa.py                                      # the benchmark shapes
    python bench/bench_nsa.py --shapes m7c@16k m7c@64k g4@64k g8@64k --ops nsa_core sdpa_cudnn
    python bench/bench_nsa.py --shapes m7c@64k --ops sel nsa_core --sel-forms tiles blocks \
        --inputs random trained:/tmp/trained                     # the selected forward's forms
    python bench/bench_nsa.py --breakdown --shapes 16k              # also a table per kernel
    python bench/bench_nsa.py --json out.json                       # also write the rows as JSON
    python bench/bench_nsa.py --shapes 64k --ops nsa_core --sel kept_tokens=32768   # another selected-branch tuning

Shapes: the benchmark shape B=1, HQ=64, H=4, K=128 at 2k/8k/16k/32k/64k; m7c_125m (B=8, HQ=12,
H=2, K=64, S=2048); and FAMILY@LENGTH for B=1: bench (HQ=64, H=4, K=128), m7c (the seeds'
attention: HQ=12, H=2, K=64, G=6), g4 (HQ=8, H=2, K=64), g8 (HQ=16, H=2, K=64). NSA
hyper-parameters are the paper defaults (l=32, d=16, l'=64, n=16, w=512).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import kernel_work as kw  # noqa: E402
from bench.inputs import describe_locality, random_inputs, selection, trained_inputs  # noqa: E402
from bench.ops import OPS  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import (  # noqa: E402
    cudnn_cmp_attention,
    triton_cmp_attention,
    triton_sel_attention,
    triton_select_blocks,
    triton_win_attention,
)
from nsa.kernels import tuning  # noqa: E402
from nsa.kernels.tuning import SELECTION, BandTiles, SelectionTuning, TopkTuning  # noqa: E402

SHAPES = {  # name: (B, S, HQ, H, K)
    "2k": (1, 2048, 64, 4, 128),
    "8k": (1, 8192, 64, 4, 128),
    "16k": (1, 16384, 64, 4, 128),
    "32k": (1, 32768, 64, 4, 128),
    "64k": (1, 65536, 64, 4, 128),
    "m7c_125m": (8, 2048, 12, 2, 64),
}
#: FAMILY@LENGTH shapes, batch 1: (HQ, H, K)
FAMILIES = {"bench": (64, 4, 128), "m7c": (12, 2, 64), "g4": (8, 2, 64), "g8": (16, 2, 64)}
#: the ops of the main table unless --ops says otherwise (SDPA cuDNN is the ratios' baseline)
DEFAULT_OPS = ["nsa_core", "nsa_core_triton", "sdpa_flash", "sdpa_cudnn", "flex_window", "fla_nsa"]


def shape_of(name: str) -> tuple[int, int, int, int, int]:
    """(B, S, HQ, H, K) of a shape name: one of SHAPES or FAMILY@LENGTH (16k = 16384)."""
    if name in SHAPES:
        return SHAPES[name]
    family, _, length = name.partition("@")
    if family not in FAMILIES or not length:
        raise argparse.ArgumentTypeError(f"shape {name!r}: one of {', '.join(SHAPES)} or FAMILY@LENGTH with "
                                         f"FAMILY in {', '.join(FAMILIES)}")
    S = int(length[:-1]) * 1024 if length.endswith("k") else int(length)
    return (1, S, *FAMILIES[family])


def _bench(fn) -> float:
    """Median ms; warm-up and repetitions scaled to the op's own duration."""
    import triton

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=max(25, 2 * est), rep=max(100, 8 * est), return_mode="median")


def _host_ms(fn, n: int = 20) -> float:
    """Median host time (ms) to enqueue one call onto an idle device (no queue to wait behind):
    when it is close to the measured time, the call is bound by its launches, not by the GPU."""
    times = host_times(fn, n)
    return times[n // 2]


def host_times(fn, n: int = 20) -> list[float]:
    """The host times (ms, sorted) of n calls of fn, each enqueued onto an idle device. Their
    least is the call's own host work where other work on a shared machine slows some calls."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(times)


#: GPU clock cycles a millisecond of torch.cuda._sleep, per device (measured once, _sleep_cycles)
_CYCLES_PER_MS: dict[int, float] = {}


def _sleep_cycles(ms: float) -> int:
    """The cycles for which torch.cuda._sleep keeps the current GPU busy for about ``ms``."""
    dev = torch.cuda.current_device()
    if dev not in _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(10**6)  # its first call loads the kernel
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS[dev] = 10**7 / start.elapsed_time(end)
    return int(ms * _CYCLES_PER_MS[dev])


def host_behind_busy_gpu(fn, busy_ms: float = 50.0, n: int = 5) -> float:
    """Median host time (ms) to enqueue one call of fn behind ``busy_ms`` of work already queued
    on the GPU (a sleep kernel). Where fn never waits for the GPU this is its own host work, as
    on an idle device; where something in it synchronises (a copy to the host, ``.item()``, the
    caching allocator returning memory with cudaFree), it waits out the queue and takes about
    ``busy_ms`` more, which an idle device hides (host_times: the wait is then for fn's own
    kernels and looks like host work)."""
    fn()
    torch.cuda.synchronize()
    cycles = _sleep_cycles(busy_ms)
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(times)[n // 2]


def _peak_gib(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def _fwd_bwd(fwd, leaves, do):
    def run():
        o = fwd()
        torch.autograd.grad(o, leaves, do)
    return run


def _no_grad(fwd):
    def run():
        with torch.no_grad():
            fwd()
    return run


def _stage_inputs(name, cfg):
    """Random inputs of shape `name` (as a dict) plus the lse and selected blocks the later
    stages take."""
    inputs = random_inputs(*shape_of(name), cfg)
    x = {n: getattr(inputs, n) for n in ("q", "kc", "vc", "k_sel", "v_sel", "k_win", "v_win", "gates", "do")}
    with torch.no_grad():
        _, lse = triton_cmp_attention(x["q"], x["kc"], x["vc"], cfg)
        idx = triton_select_blocks(x["q"], x["kc"], lse, cfg)
    return x, x["q"], x["do"], lse, idx


def _sel_split(x, q, do, idx, cfg, tune: SelectionTuning = SELECTION) -> tuple[int, str, dict[str, float]]:
    """Medians (ms) of the selected branch's pieces at the launches and variants ``tune``: forward
    kernel; backward as inverse_selection (keys kernel, sort, work-item kernel), the dk/dv
    kernel and dq: at long contexts (selection._dq_from_pass) the delta pass, the dk/dv kernel
    keeping its dq partials or dS tiles (selection._dq_source; all tokens in one pass, as the
    backward does within its budget; without the float32-to-bf16 casts of dk/dv), and dq from
    them; otherwise the dq kernel (it writes delta) and the dk/dv kernel. The forward and the dq
    kernel each first build the token-tile block lists ('union', one small kernel, nothing when
    TT = 1); their times include it. Returns TT, what the dk/dv pass keeps for dq ('' when the
    dq kernel runs) and the times."""
    from nsa.kernels import selection as S
    from nsa.kernels._inverse import inverse_selection

    ls = cfg.sel_block
    q, k, v = (t.detach() for t in (q, x["k_sel"], x["v_sel"]))
    (Tq, HQ), (Tk, H), n = q.shape[1:3], k.shape[1:3], idx.shape[-1]
    NB = -(-Tk // ls)
    TT = S._tokens_per_tile(HQ // H, n, NB, Tq, tune)
    o, lse, _ = S._sel_fwd(q, k, v, idx, ls, 0, False, cfg.sel_form, tune)
    qc = S._dkv_qc(q.device, Tq, False, tune)
    work = inverse_selection(idx, Tk, ls, qc)
    times = dict(union=_bench(lambda: S._tile_union(idx, TT, NB)),
                 fwd=_bench(lambda: S._sel_fwd(q, k, v, idx, ls, 0, False, cfg.sel_form, tune)),
                 inverse=_bench(lambda: inverse_selection(idx, Tk, ls, qc)))
    keep = S._dq_source(q.shape[3], ls, tune) if S._dq_from_pass(q, k, n, ls, tune) else ""
    if keep:
        delta = S._row_delta(o, do)
        # one chunk: all tokens
        width = S._kept_width(q.shape[3], ls, keep)
        kept = torch.empty(idx.numel() * (HQ // H) * width, device=q.device, dtype=q.dtype)
        dk, dv = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0)
        dq_of_kept = ((lambda: S._sel_dq_from_parts(q, idx, kept)) if keep == "dq"
                      else (lambda: S._sel_dq_from_ds(q, k, idx, kept, ls, tune)))
        times.update(delta=_bench(lambda: S._row_delta(o, do)),
                     dkv=_bench(lambda: S._dkv_pass(q, k, v, do, lse, delta, work, ls, 0, dk, dv, tune, keep, kept)),
                     dq=_bench(dq_of_kept))
    else:
        _, delta = S._sel_bwd_dq(q, k, v, idx, o, lse, do, ls, 0, tune)
        times.update(dq=_bench(lambda: S._sel_bwd_dq(q, k, v, idx, o, lse, do, ls, 0, tune)),
                     dkv=_bench(lambda: S._sel_bwd_dkv(q, k, v, do, lse, delta, work, ls, 0, tune)))
    return TT, keep, times


def _rates(ms: float, work: kw.Work | None) -> tuple[str, str]:
    """Achieved TFLOP/s and GB/s as table cells ('-' where the work is not counted)."""
    if work is None:
        return "-", "-"
    return f"{work.tflops(ms):.1f}", f"{work.gbps(ms):.0f}"


def breakdown(shapes) -> list[dict]:
    """Per-kernel medians (ms) of the NSA stages with achieved TFLOP/s and GB/s: where the time
    goes and how far each kernel is from the GPU's limits. Returns the rows."""
    cfg = NSAConfig()
    rows = []
    print("| shape     | kernel                   |       ms | TFLOP/s |    GB/s |")
    print("|-----------|--------------------------|----------|---------|---------|")
    for name in shapes:
        x, q, do, lse, idx = _stage_inputs(name, cfg)
        shape = kw.Shape(*shape_of(name))
        cmp_leaves, win_leaves, sel_leaves = ([q, x[a], x[b]] for a, b in (("kc", "vc"), ("k_win", "v_win"),
                                                                        ("k_sel", "v_sel")))

        def cmp():
            return triton_cmp_attention(q, x["kc"], x["vc"], cfg)[0]

        def cmp_cudnn():
            return cudnn_cmp_attention(q, x["kc"], x["vc"], cfg)[0]

        def sel():
            return triton_sel_attention(q, x["k_sel"], x["v_sel"], idx, cfg)

        def win():
            return triton_win_attention(q, x["k_win"], x["v_win"], cfg)

        TT, keep, split = _sel_split(x, q, do, idx, cfg)
        delta_work = kw.Work(0, 2 * shape.tokens(shape.HQ) * shape.elem + shape.B * shape.S * shape.HQ * kw.F32)
        timed = [  # (kernel, ms, work)
            ("top-n", _bench(lambda: triton_select_blocks(q, x["kc"], lse, cfg)), kw.topn(shape, cfg)),
            ("cmp fwd", _bench(_no_grad(cmp)), kw.cmp_fwd(shape, cfg)),
            ("cmp fwd+bwd", _bench(_fwd_bwd(cmp, cmp_leaves, do)), kw.cmp_fwd(shape, cfg) + kw.cmp_bwd(shape, cfg)),
            ("cmp-cudnn fwd", _bench(_no_grad(cmp_cudnn)), kw.cmp_fwd(shape, cfg)),
            ("cmp-cudnn fwd+bwd", _bench(_fwd_bwd(cmp_cudnn, cmp_leaves, do)),
             kw.cmp_fwd(shape, cfg) + kw.cmp_bwd(shape, cfg)),
            (f"sel fwd (TT={TT})", split["fwd"], kw.sel_fwd(shape, cfg)),
            (f"sel dq from kept {keep}" if keep else "sel dq", split["dq"], kw.sel_dq(shape, cfg, keep)),
            (f"sel dkv (+{keep})" if keep else "sel dkv", split["dkv"], kw.sel_dkv(shape, cfg, keep)),
            *([("sel delta", split["delta"], delta_work)] if keep else []),
            ("sel union", split["union"], None),
            ("sel inverse", split["inverse"], None),
            ("sel fwd+bwd", _bench(_fwd_bwd(sel, sel_leaves, do)), kw.sel_fwd(shape, cfg) + kw.sel_bwd(shape, cfg, keep)),
            ("win fwd", _bench(_no_grad(win)), kw.win_fwd(shape, cfg)),
            ("win fwd+bwd", _bench(_fwd_bwd(win, win_leaves, do)), kw.win_fwd(shape, cfg) + kw.win_bwd(shape, cfg)),
        ]
        for kernel, ms, work in timed:
            tf, gb = _rates(ms, work)
            print(f"| {name:9} | {kernel:24} | {ms:8.3f} | {tf:>7} | {gb:>7} |", flush=True)
            rows.append(dict(shape=name, kernel=kernel, ms=ms, flops=work and work.flops, bytes=work and work.bytes))
        x = q = do = lse = idx = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()
    return rows


def sweep(shapes, only=()):
    """Launch-parameter sweep of the Triton stages, one knob group at a time from the
    defaults, each variant passed to the kernels as an argument (nsa.kernels.tuning); prints
    each variant's median. The winners become the defaults: band_attention.TILES and the
    dataclasses of nsa.kernels.tuning. `only`: sweep just the groups whose label contains one of
    these."""
    cfg = NSAConfig()
    for name in shapes:
        x, q, do, lse, idx = _stage_inputs(name, cfg)

        def cmp_fb(tiles):
            return _fwd_bwd(lambda: triton_cmp_attention(q, x["kc"], x["vc"], cfg, tuning=tiles)[0],
                            [q, x["kc"], x["vc"]], do)

        def win_fb(tiles):
            return _fwd_bwd(lambda: triton_win_attention(q, x["k_win"], x["v_win"], cfg, tuning=tiles),
                            [q, x["k_win"], x["v_win"]], do)

        def sel_f(tune):
            return _no_grad(lambda: triton_sel_attention(q, x["k_sel"], x["v_sel"], idx, cfg, tuning=tune))

        def sel_fb(tune):
            return _fwd_bwd(lambda: triton_sel_attention(q, x["k_sel"], x["v_sel"], idx, cfg, tuning=tune),
                            [q, x["k_sel"], x["v_sel"]], do)

        def tk(tune):
            return lambda: triton_select_blocks(q, x["kc"], lse, cfg, tuning=tune)

        # (label, tuning of each variant, what to time under it): one knob group at a time
        # each group's first row is the defaults' (BandTiles()), the baseline of its variants
        band = [
            ("band fwd", [BandTiles()] + [BandTiles(fwd=t) for t in [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3),
                                                                     (128, 64, 4, 3)]], [cmp_fb]),
            ("band dq", [BandTiles()] + [BandTiles(dq=t) for t in [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 3),
                                                                   (64, 32, 4, 3), (64, 64, 4, 3)]], [cmp_fb]),
            ("band dkv", [BandTiles(dkv=t) for t in [(64, 64, 8, 2), (32, 128, 8, 2), (64, 128, 8, 2),
                                                     (128, 64, 8, 2)]], [cmp_fb]),
            ("band split", [BandTiles(dkv_waves=w) for w in (2, 4, 8, 16, 32)], [cmp_fb]),
            ("win fwd", [BandTiles()] + [BandTiles(fwd=t) for t in [(128, 64, 8, 3), (128, 32, 4, 4), (256, 64, 8, 3),
                                                                    (64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2)]],
             [win_fb]),
            ("win dq", [BandTiles()] + [BandTiles(dq=t) for t in [(128, 64, 8, 2), (64, 32, 4, 3), (128, 64, 4, 2),
                                                                  (64, 64, 4, 3), (64, 32, 4, 2)]], [win_fb]),
            ("win fwd+dq", [BandTiles()] + [BandTiles(fwd=f, dq=d) for f, d in [
                ((64, 64, 4, 3), (64, 64, 4, 3)), ((64, 64, 4, 3), (64, 32, 4, 3)), ((64, 32, 4, 3), (64, 64, 4, 3))]],
             [win_fb]),
            ("win dkv", [BandTiles(dkv=t) for t in [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 64, 4, 3),
                                                    (128, 64, 4, 2), (64, 128, 4, 2)]], [win_fb]),
        ]
        # token tiles of the selection forward/dq: forced TT (tt > 0), then the rule (tt = 0) at
        # several rows per program; tt_nb only moves the short/long-context boundary (the rule
        # tiles when NB <= tt_nb * n): raise it if a forced TT > 1 wins on a long shape
        sel_tt = [dict(tt=1), dict(tt=2), dict(tt=4), dict(tt=8), dict(tt=16),
                  dict(tt=1, fwd_stages=2), dict(tt=4, fwd_stages=2), dict(tt=8, fwd_stages=2),
                  dict(tt=0, tt_rows=32), dict(tt=0, tt_rows=64), dict(tt=0, tt_rows=128, tt_max=16),
                  dict(tt=0, tt_nb=8.0)]
        sel_bwd = [dict(dq_keep="dq"), dict(dq_keep="ds"), dict(qc=256), dict(qc=128), dict(qc=1024),
                   dict(dkv_cells=4096), dict(dkv_cells=16384), dict(dkv_warps=8), dict(dkv_stages=3),
                   dict(dkv_stages=1)]
        # fwd_warps / fwd_stages: both forms; blocks_rows: the key-block-major forward's rows a step;
        # combine_values / combine_warps: the kernel combining its partials
        sel_fwd = [dict(fwd_warps=4, fwd_stages=3), dict(fwd_warps=2, fwd_stages=3), dict(fwd_warps=4, fwd_stages=2),
                   dict(fwd_warps=8, fwd_stages=3), dict(blocks_rows=32), dict(blocks_rows=128),
                   dict(blocks_rows=128, fwd_warps=8), dict(combine_values=4096), dict(combine_values=16384),
                   dict(combine_warps=2), dict(combine_warps=8), dict(combine_values=16384, combine_warps=8)]
        groups = band + [
            ("sel tt (fwd, fwd+bwd)", [SelectionTuning(**v) for v in sel_tt], [sel_f, sel_fb]),
            ("sel bwd", [SelectionTuning(**v) for v in sel_bwd], [sel_fb]),
            ("sel fwd", [SelectionTuning(**v) for v in sel_fwd], [sel_f]),
            ("topk", [TopkTuning(rows=r, warps=w) for r, w in [(128, 8), (256, 8), (64, 4), (128, 4)]]
             + [TopkTuning(chunk_blocks=8), TopkTuning(chunk_blocks=8, stages=3), TopkTuning(stages=3)]
             + [TopkTuning(select_warps=w) for w in (1, 2, 4, 8)], [tk]),
        ]
        for label, tunings, timed in groups:
            if only and not any(o in label for o in only):
                continue
            for tune in tunings:
                try:
                    t = ", ".join(f"{_bench(make(tune)):.2f}" for make in timed)
                    if label.startswith(("sel tt", "sel bwd")):
                        TT, keep, split = _sel_split(x, q, do, idx, cfg, tune)
                        t += (f" | split (ms): TT={TT}{f' dq from kept {keep}' if keep else ''} "
                              + " ".join(f"{a} {b:.3f}" for a, b in split.items()))
                except Exception as e:
                    t = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                print(f"# sweep {name} {label} {tune.as_arg() or 'defaults'}: {t}", flush=True)
        x = q = do = lse = idx = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()


def _load(spec: str, name: str, cfg: NSAConfig, layer: int):
    """The inputs of shape ``name`` from ``spec``: 'random' or 'trained:DIR'."""
    B, S, HQ, H, K = shape_of(name)
    if spec == "random":
        return random_inputs(B, S, HQ, H, K, cfg)
    x = trained_inputs(spec.partition(":")[2], layer, S)
    if x.shape() != (B, S, HQ, H, K):
        raise SystemExit(f"{spec}: layer {layer} at S={S} has shape {x.shape()}, not {name}'s {(B, S, HQ, H, K)}")
    return x


def _variants(op: str, forms: list[str]) -> list[tuple[str, NSAConfig]]:
    """(row label, config) of each variant of an op: the selected forward's forms for the ops
    that run the selected branch, else the defaults."""
    if op in ("nsa_core", "nsa_core_triton", "sel"):
        return [(f"{op} [{form}]", NSAConfig(sel_form=form)) for form in forms]
    return [(op, NSAConfig())]


def run(shapes, ops, input_specs, forms, layer) -> list[dict]:
    """The main table: every op of ``ops`` (and form) on every shape and set of inputs; returns
    its rows."""
    from nsa.kernels.selection import _tokens_per_tile, forward_form

    rows = []
    hdr = (f"| {'shape':9} | {'inputs':16} | {'op':26} | {'fwd ms':>8} | {'TFLOP/s':>7} | {'fwd+bwd ms':>10} "
           f"| {'TFLOP/s':>7} | {'x cuDNN':>7} | {'peak GiB':>8} | {'host ms':>7} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for name in shapes:
        B, S, HQ, H, K = shape_of(name)
        cfg = NSAConfig()
        G, NB = HQ // H, -(-S // cfg.sel_block)
        auto = forward_form(G, _tokens_per_tile(G, cfg.n_selected, NB, S))
        for spec in input_specs:
            x = _load(spec, name, cfg, layer)
            print(f"# {name} {x.source}: selection locality, distinct blocks per tile (share of tile x n): "
                  f"{describe_locality(selection(x, cfg), cfg.n_selected)}; sel_form auto -> {auto}", flush=True)
            base = None
            for op in ops:
                for label, vcfg in _variants(op, forms):
                    row = dict(shape=name, B=B, S=S, HQ=HQ, H=H, K=K, inputs=x.source, op=label)
                    try:
                        fwd, leaves = OPS[op].build(x, vcfg)
                        t_f = _bench(_no_grad(fwd))
                        fb = _fwd_bwd(fwd, leaves, x.do) if OPS[op].backward else None
                        t_fb = _bench(fb) if fb else None
                        mem = _peak_gib(fb) if fb else None
                        host = _host_ms(fb) if fb else None
                    except Exception as e:  # a baseline that cannot run here is reported, not fatal
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                        print(f"| {name:9} | {x.source:16} | {label:26} | n/a | {row['error']}", flush=True)
                        rows.append(row)
                        torch.cuda.empty_cache()
                        continue
                    if op == "sdpa_cudnn":
                        base = t_fb
                    work = OPS[op].work(kw.Shape(B, S, HQ, H, K), vcfg) if OPS[op].work else None
                    tf_f = _rates(t_f, work and work[0])[0]
                    tf_fb = _rates(t_fb, work and work[0] + work[1])[0] if t_fb else "-"
                    ratio = f"{base / t_fb:.2f}x" if base and t_fb else "-"
                    print(f"| {name:9} | {x.source:16} | {label:26} | {t_f:8.2f} | {tf_f:>7} | "
                          f"{_fmt(t_fb, '10.2f')} | {tf_fb:>7} | {ratio:>7} | {_fmt(mem, '8.2f')} | "
                          f"{_fmt(host, '7.2f')} |", flush=True)
                    row.update(fwd_ms=t_f, fwd_bwd_ms=t_fb, peak_gib=mem, host_fwd_bwd_ms=host,
                               fwd_flops=work and work[0].flops, bwd_flops=work and work[1].flops)
                    rows.append(row)
            x = None  # free these inputs before the next
            torch.cuda.empty_cache()
    return rows


def tuning_arg(kind):
    """An argparse type: a KEY=VALUE,... string read as a ``kind`` tuning, a bad field or value
    reported as a usage error naming it."""
    def parse(text: str):
        try:
            return kind.from_arg(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = kind.__name__
    return parse


def _fmt(v, spec: str) -> str:
    return format(v, spec) if v is not None else format("-", f">{spec.split('.')[0]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="names of SHAPES or FAMILY@LENGTH")
    ap.add_argument("--ops", nargs="+", default=DEFAULT_OPS, choices=list(OPS),
                    help="ops of bench/ops.py; SDPA cuDNN, when among them, is the baseline of the ratios "
                         "and should come first")
    ap.add_argument("--inputs", nargs="+", default=["random"],
                    help="'random' and/or 'trained:DIR' (bench/trained_inputs.py's output)")
    ap.add_argument("--layer", type=int, default=6, help="the trained model's layer whose inputs to use")
    ap.add_argument("--sel-forms", nargs="+", default=["auto"], choices=["auto", "tiles", "blocks"],
                    help="the selected forward's forms (attn.sel_form) for the ops that run it")
    ap.add_argument("--sel", type=tuning_arg(SelectionTuning), default=SELECTION, metavar="KEY=VALUE,...",
                    help="the selected branch's launches and budgets instead of the defaults (nsa.kernels.tuning."
                         "SelectionTuning fields: kept_tokens=32768)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--breakdown", action="store_true", help="also time each Triton stage alone (random inputs)")
    ap.add_argument("--sweep", action="store_true", help="only sweep the kernels' launch parameters")
    ap.add_argument("--sweep-only", nargs="*", default=[],
                    help="sweep only the groups whose label contains one of these (e.g. 'sel tt')")
    a = ap.parse_args(argv)
    for name in a.shapes:
        shape_of(name)
    tuning.SELECTION = a.sel
    if not torch.cuda.is_available():
        sys.exit("bench_nsa.py needs a CUDA GPU")
    # FlexAttention recompiles per shape and grad mode; the default limit (8) would drop the
    # baseline to its unfused fallback part-way through the table
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.cache_size_limit = 64
    if a.sweep:
        sweep(a.shapes, a.sweep_only)
        return
    dev = torch.cuda.get_device_name()
    print(f"# {dev}; torch {torch.__version__}; python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    kernels = breakdown(a.shapes) if a.breakdown else []
    rows = run(a.shapes, a.ops, a.inputs, a.sel_forms, a.layer)
    if a.json:
        _write_json(Path(a.json), dict(device=dev, torch=torch.__version__, rows=rows, kernels=kernels))


def _write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()
