"""Benchmark of the NSA core (Triton kernels: compressed + selection + window branches and the
gates) against full causal attention (PyTorch SDPA, flash and cuDNN backends), FlexAttention
with a 512-token sliding window, and fla-core's parallel_nsa (compression + selection, its
defaults) when importable. Forward and forward+backward, one set of random inputs per shape,
triton.testing.do_bench medians, achieved TFLOP/s and GB/s, peak memory of one forward+backward,
and the host time to enqueue one forward+backward (close to the measured time: launch-bound).
--breakdown adds a table per kernel (top-n, compressed, selected fwd / dq / dk-dv, window): time,
TFLOP/s and GB/s. FLOPs and bytes come from the shape (bench/kernel_work.py: the matrix products
over the visible pairs, and every tensor read or written once), so they are lower bounds.

    python bench/bench_nsa.py                       # all shapes
    python bench/bench_nsa.py --shapes 2k m7c_125m   # some of them
    python bench/bench_nsa.py --breakdown           # also the per-kernel table
    python bench/bench_nsa.py --json out.json       # also write the rows as JSON
    python bench/bench_nsa.py --sweep --sweep-only "sel tt" --shapes 2k m7c_125m 8k
                                                    # selection token tiles (TUNE tt*)

Shapes: B=1, HQ=64, H=4, K=128, bf16, S in 2k/8k/16k/32k/64k; and m7c_125m (B=8, HQ=12, H=2,
K=64, S=2048). NSA hyper-parameters are the paper defaults (l=32, d=16, l'=64, n=16, w=512).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import kernel_work as kw  # noqa: E402
from nsa.attention.backends import Route, resolve_route  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.core import nsa_core  # noqa: E402
from nsa.attention.kernel_branches import (  # noqa: E402
    cudnn_cmp_attention,
    flex_win_attention,
    triton_cmp_attention,
    triton_sel_attention,
    triton_select_blocks,
    triton_win_attention,
)
from nsa.attention.torch_branches import visible_compressed  # noqa: E402

SHAPES = {  # name: (B, S, HQ, H, K)
    "2k": (1, 2048, 64, 4, 128),
    "8k": (1, 8192, 64, 4, 128),
    "16k": (1, 16384, 64, 4, 128),
    "32k": (1, 32768, 64, 4, 128),
    "64k": (1, 65536, 64, 4, 128),
    "m7c_125m": (8, 2048, 12, 2, 64),
}


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
    """Median host time (ms) to enqueue one call, the device left to run behind: when it is
    close to the measured time, the call is bound by its launches, not by the GPU."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
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


def _inputs(B, S, HQ, H, K, cfg, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dt).requires_grad_()

    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    x = dict(q=rnd(B, S, HQ, K), kc=rnd(B, Nc, H, K), vc=rnd(B, Nc, H, K),
             k_sel=rnd(B, S, H, K), v_sel=rnd(B, S, H, K), k_win=rnd(B, S, H, K), v_win=rnd(B, S, H, K))
    x["gates"] = torch.sigmoid(torch.randn(B, S, HQ, 3, generator=g, device=dev)).to(dt).requires_grad_()
    x["do"] = torch.randn(B, S, HQ, K, generator=g, device=dev, dtype=torch.float32).to(dt)
    return x


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


def _methods(x, cfg, win_backend):
    """name -> (forward closure, leaves, (forward work, backward work) or None) for every
    method that can run here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, gates = x["q"], x["gates"]
    B, S, HQ, K = q.shape
    shape = kw.Shape(B, S, HQ, x["k_sel"].shape[2], K)
    from nsa.kernels.selection import _ds_path
    ds = _ds_path(q, x["k_sel"], cfg.n_selected, cfg.sel_block)  # dq of the selected branch from dS tiles
    core_leaves = [x[n] for n in ("q", "kc", "vc", "k_sel", "v_sel", "k_win", "v_win", "gates")]
    out = {}
    # the routes 'auto' picks (cmp and select: cudnn on a GPU), then every stage on Triton
    for label, cmp in (("auto", resolve_route("cmp", "auto", q.device, q.dtype).backend), ("triton", "triton")):
        routes = {s: Route(s, cmp if s in ("cmp", "select") else "triton", "bench") for s in ("cmp", "select", "sel")}
        routes["win"] = Route("win", win_backend, "bench")
        out[f"NSA core ({label}: cmp={cmp})"] = (
            lambda routes=routes: nsa_core(*core_leaves[:7], gates, cfg, routes), core_leaves,
            (kw.core_fwd(shape, cfg), kw.core_bwd(shape, cfg, ds)))

    qt, kt, vt = (t.transpose(1, 2) for t in (q, x["k_sel"], x["v_sel"]))
    gqa = q.shape[2] != x["k_sel"].shape[2]
    for name, backend in (("SDPA flash (full causal)", SDPBackend.FLASH_ATTENTION),
                          ("SDPA cuDNN (full causal)", SDPBackend.CUDNN_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa).transpose(1, 2)
        out[name] = (sdpa, [q, x["k_sel"], x["v_sel"]], (kw.causal_fwd(shape), kw.causal_bwd(shape)))

    wcfg = NSAConfig(window=512)
    out["FlexAttention (window 512)"] = (
        lambda: flex_win_attention(q, x["k_win"], x["v_win"], wcfg), [q, x["k_win"], x["v_win"]],
        (kw.win_fwd(shape, wcfg), kw.win_bwd(shape, wcfg)))

    try:
        from fla.ops.nsa import parallel_nsa
    except ImportError as e:
        print(f"# fla-core not importable ({e}); its rows are skipped")
    else:
        g_cmp, g_slc = gates[..., 0].detach().clone().requires_grad_(), gates[..., 1].detach().clone().requires_grad_()
        out["fla parallel_nsa (cmp+sel)"] = (
            lambda: parallel_nsa(q, x["k_sel"], x["v_sel"], g_cmp=g_cmp, g_slc=g_slc,
                                 block_counts=cfg.n_selected, block_size=cfg.sel_block, window_size=0),
            [q, x["k_sel"], x["v_sel"], g_cmp, g_slc], None)
    return out


def _stage_inputs(name, cfg):
    """Random inputs of shape `name` plus the lse and selected blocks the later stages take."""
    x = _inputs(*SHAPES[name], cfg)
    with torch.no_grad():
        _, lse = triton_cmp_attention(x["q"], x["kc"], x["vc"], cfg)
        idx = triton_select_blocks(x["q"], x["kc"], lse, cfg)
    return x, x["q"], x["do"], lse, idx


def _sel_split(x, q, do, idx, cfg) -> tuple[int, bool, dict[str, float]]:
    """Medians (ms) of the selected branch's pieces at the current selection.TUNE: forward
    kernel; backward as _inverse_selection (keys kernel, sort, work-item kernel), the dk/dv
    kernel and dq: at long contexts (selection._ds_path) the delta pass, the dk/dv kernel
    keeping its dS tiles (all tokens in one pass, as the backward does within its dS budget;
    without the float32-to-bf16 casts of dk/dv), and dq from them; otherwise the dq kernel (it
    writes delta) and the dk/dv kernel. The forward and the dq kernel each first build the token-tile block lists
    ('union', one small kernel, nothing when TT = 1); their times include it. Returns TT,
    whether dq comes from dS tiles, and the times."""
    from nsa.kernels import selection as S

    ls = cfg.sel_block
    q, k, v = (t.detach() for t in (q, x["k_sel"], x["v_sel"]))
    (Tq, HQ), (Tk, H), n = q.shape[1:3], k.shape[1:3], idx.shape[-1]
    NB = -(-Tk // ls)
    TT = S._tokens_per_tile(HQ // H, n, NB, Tq)
    o, lse = S._sel_fwd(q, k, v, idx, ls, 0, False)
    qc = S._dkv_qc(q.device, Tq, False)
    work = S._inverse_selection(idx, Tk, ls, qc)
    times = dict(union=_bench(lambda: S._tile_union(idx, TT, NB)),
                 fwd=_bench(lambda: S._sel_fwd(q, k, v, idx, ls, 0, False)),
                 inverse=_bench(lambda: S._inverse_selection(idx, Tk, ls, qc)))
    ds_path = S._ds_path(q, k, n, ls)
    if ds_path:
        delta = S._row_delta(o, do)
        ds = torch.empty(idx.numel() * (HQ // H) * ls, device=q.device, dtype=q.dtype)  # one chunk: all tokens
        dk, dv = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0)
        times.update(delta=_bench(lambda: S._row_delta(o, do)),
                     dkv=_bench(lambda: S._dkv_pass(q, k, v, do, lse, delta, work, ls, 0, dk, dv, ds)),
                     dq=_bench(lambda: S._sel_dq_from_ds(q, k, idx, ds, ls)))
    else:
        _, delta = S._sel_bwd_dq(q, k, v, idx, o, lse, do, ls, 0)
        times.update(dq=_bench(lambda: S._sel_bwd_dq(q, k, v, idx, o, lse, do, ls, 0)),
                     dkv=_bench(lambda: S._sel_bwd_dkv(q, k, v, do, lse, delta, work, ls, 0)))
    return TT, ds_path, times


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
        B, S, HQ, H, K = SHAPES[name]
        shape = kw.Shape(B, S, HQ, H, K)
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

        TT, ds, split = _sel_split(x, q, do, idx, cfg)
        delta_work = kw.Work(0, 2 * shape.tokens(shape.HQ) * shape.elem + shape.B * shape.S * shape.HQ * kw.F32)
        timed = [  # (kernel, ms, work)
            ("top-n", _bench(lambda: triton_select_blocks(q, x["kc"], lse, cfg)), kw.topn(shape, cfg)),
            ("cmp fwd", _bench(_no_grad(cmp)), kw.cmp_fwd(shape, cfg)),
            ("cmp fwd+bwd", _bench(_fwd_bwd(cmp, cmp_leaves, do)), kw.cmp_fwd(shape, cfg) + kw.cmp_bwd(shape, cfg)),
            ("cmp-cudnn fwd", _bench(_no_grad(cmp_cudnn)), kw.cmp_fwd(shape, cfg)),
            ("cmp-cudnn fwd+bwd", _bench(_fwd_bwd(cmp_cudnn, cmp_leaves, do)),
             kw.cmp_fwd(shape, cfg) + kw.cmp_bwd(shape, cfg)),
            (f"sel fwd (TT={TT})", split["fwd"], kw.sel_fwd(shape, cfg)),
            ("sel dq from dS" if ds else "sel dq", split["dq"], kw.sel_dq(shape, cfg, ds)),
            ("sel dkv (+dS)" if ds else "sel dkv", split["dkv"], kw.sel_dkv(shape, cfg, ds)),
            *([("sel delta", split["delta"], delta_work)] if ds else []),
            ("sel union", split["union"], None),
            ("sel inverse", split["inverse"], None),
            ("sel fwd+bwd", _bench(_fwd_bwd(sel, sel_leaves, do)), kw.sel_fwd(shape, cfg) + kw.sel_bwd(shape, cfg, ds)),
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
    defaults; prints each variant's median. The winners become the defaults in the kernels'
    TILES / TUNE tables. `only`: sweep just the groups whose label contains one of these."""
    from nsa.kernels import band_attention, selection, topk

    cfg = NSAConfig()
    for name in shapes:
        x, q, do, lse, idx = _stage_inputs(name, cfg)
        cmp_fb = _fwd_bwd(lambda: triton_cmp_attention(q, x["kc"], x["vc"], cfg)[0], [q, x["kc"], x["vc"]], do)
        win_fb = _fwd_bwd(lambda: triton_win_attention(q, x["k_win"], x["v_win"], cfg), [q, x["k_win"], x["v_win"]], do)
        sel_f = _no_grad(lambda: triton_sel_attention(q, x["k_sel"], x["v_sel"], idx, cfg))
        sel_fb = _fwd_bwd(lambda: triton_sel_attention(q, x["k_sel"], x["v_sel"], idx, cfg), [q, x["k_sel"], x["v_sel"]], do)
        tk = lambda: triton_select_blocks(q, x["kc"], lse, cfg)  # noqa: E731
        i = 0 if SHAPES[name][4] <= 64 else 1  # head dim
        cmp_tiles, win_tiles = band_attention.TILES["cmp"], band_attention.TILES["win"]
        groups = [
            ("band fwd", cmp_tiles, "fwd", [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3)],
             [cmp_fb]),
            ("band dq", cmp_tiles, "dq", [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3)], [cmp_fb]),
            ("band dkv", cmp_tiles, "dkv", [(64, 64, 8, 2), (32, 128, 8, 2), (64, 128, 8, 2), (128, 64, 8, 2)],
             [cmp_fb]),
            ("win fwd", win_tiles, "fwd", [(128, 64, 8, 3), (128, 32, 4, 4), (256, 64, 8, 3), (64, 64, 4, 3)],
             [win_fb]),
            ("win dq", win_tiles, "dq", [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3)], [win_fb]),
            ("win dkv", win_tiles, "dkv", [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 2)], [win_fb]),
        ]
        for label, table, key, variants, fns in groups:
            if only and not any(o in label for o in only):
                continue
            base = table[key]
            for v in variants:
                table[key] = tuple(v if j == i else c for j, c in enumerate(base))
                try:
                    ts = [f"{_bench(f):.2f}" for f in fns]
                except Exception as e:
                    ts = [f"failed: {type(e).__name__}"]
                print(f"# sweep {name} {label} {v}: fwd+bwd = {', '.join(ts)}", flush=True)
            table[key] = base
        # token tiles of the selection forward/dq: forced TT (tt > 0), then the rule (tt = 0) at
        # several rows per program; tt_nb only moves the short/long-context boundary (the rule
        # tiles when NB <= tt_nb * n): raise it if a forced TT > 1 wins on a long shape
        sel_tt = [dict(tt=1), dict(tt=2), dict(tt=4), dict(tt=8), dict(tt=16),
                  dict(tt=1, fwd_stages=2), dict(tt=4, fwd_stages=2), dict(tt=8, fwd_stages=2),
                  dict(tt=0, tt_rows=32), dict(tt=0, tt_rows=64), dict(tt=0, tt_rows=128, tt_max=16),
                  dict(tt=0, tt_nb=8.0)]
        for label, tune, variants, fns in [
            ("sel tt (fwd, fwd+bwd)", selection.TUNE, sel_tt, [sel_f, sel_fb]),
            ("sel bwd", selection.TUNE, [dict(qc=256), dict(qc=128), dict(qc=1024), dict(dkv_cells=4096),
                                         dict(dkv_cells=16384), dict(dkv_warps=8), dict(dkv_stages=3)], [sel_fb]),
            ("sel fwd", selection.TUNE, [dict(fwd_warps=4, fwd_stages=3), dict(fwd_warps=2, fwd_stages=3),
                                         dict(fwd_warps=4, fwd_stages=2), dict(fwd_warps=8, fwd_stages=3)], [sel_f]),
            ("topk", topk.TUNE, [dict(rows=128, warps=8), dict(rows=256, warps=8), dict(rows=64, warps=4),
                                 dict(rows=128, warps=4)], [tk]),
        ]:
            if only and not any(o in label for o in only):
                continue
            base = dict(tune)
            for v in variants:
                tune.update(v)
                try:
                    t = ", ".join(f"{_bench(fn):.2f}" for fn in fns)
                    if label.startswith("sel tt"):
                        TT, ds, split = _sel_split(x, q, do, idx, cfg)
                        t += (f" | split (ms): TT={TT}{' dq from dS' if ds else ''} "
                              + " ".join(f"{a} {b:.3f}" for a, b in split.items()))
                except Exception as e:
                    t = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                print(f"# sweep {name} {label} {v}: {t}", flush=True)
                tune.clear()
                tune.update(base)
        x = q = do = lse = idx = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()


def run(shapes, win_backend="triton", skip=()):
    """The table of the whole NSA core against the baselines; returns its rows."""
    cfg = NSAConfig()
    rows = []
    hdr = (f"| {'shape':9} | {'method':28} | {'fwd ms':>8} | {'TFLOP/s':>7} | {'GB/s':>5} | {'fwd+bwd ms':>10} "
           f"| {'TFLOP/s':>7} | {'GB/s':>5} | {'peak GiB':>8} | {'host ms':>7} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for name in shapes:
        B, S, HQ, H, K = SHAPES[name]
        x = _inputs(B, S, HQ, H, K, cfg)
        for meth, (fwd, leaves, work) in _methods(x, cfg, win_backend).items():
            if any(s in meth for s in skip):
                continue
            try:
                t_f = _bench(_no_grad(fwd))
                fb = _fwd_bwd(fwd, leaves, x["do"])
                t_fb = _bench(fb)
                mem = _peak_gib(fb)
                host = _host_ms(fb)
            except Exception as e:  # a baseline that cannot run here is reported, not fatal
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                print(f"| {name:9} | {meth:28} | {'n/a':>8} | {'-':>7} | {'-':>5} | {'n/a':>10} | {'-':>7} | {'-':>5} "
                      f"| {'n/a':>8} | {'n/a':>7} | {msg}")
                rows.append(dict(shape=name, method=meth, error=msg))
                torch.cuda.empty_cache()
                continue
            (tf_f, gb_f), (tf_fb, gb_fb) = _rates(t_f, work and work[0]), _rates(t_fb, work and work[0] + work[1])
            print(f"| {name:9} | {meth:28} | {t_f:8.2f} | {tf_f:>7} | {gb_f:>5} | {t_fb:10.2f} | {tf_fb:>7} | {gb_fb:>5} "
                  f"| {mem:8.2f} | {host:7.2f} |", flush=True)
            rows.append(dict(shape=name, B=B, S=S, HQ=HQ, H=H, K=K, method=meth,
                             fwd_ms=t_f, fwd_bwd_ms=t_fb, peak_gib=mem, host_fwd_bwd_ms=host,
                             fwd_flops=work and work[0].flops, bwd_flops=work and work[1].flops))
        x = None  # free this shape's tensors before the next one
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--win", default="triton", choices=["triton", "flex", "flash_attn"],
                    help="window backend inside the NSA core")
    ap.add_argument("--skip", nargs="*", default=[], help="skip methods whose name contains this")
    ap.add_argument("--json", default=None)
    ap.add_argument("--breakdown", action="store_true", help="also time each Triton stage alone")
    ap.add_argument("--sweep", action="store_true", help="only sweep the kernels' launch parameters")
    ap.add_argument("--sweep-only", nargs="*", default=[],
                    help="sweep only the groups whose label contains one of these (e.g. 'sel tt')")
    a = ap.parse_args(argv)
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
    rows = run(a.shapes, a.win, a.skip)
    if a.json:
        _write_json(Path(a.json), dict(device=dev, torch=torch.__version__, rows=rows, kernels=kernels))


def _write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()
