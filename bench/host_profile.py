"""Where the host time of one NSA core forward+backward goes, for the launch-bound shapes.

For each shape: the median host time to enqueue one fwd+bwd, its measured time (do_bench),
the time of the same fwd+bwd replayed as one CUDA graph (the GPU's own time, no launch cost),
whether a call waits for the GPU (its host time behind 50 ms of queued GPU work: a host time
close to the GPU's on an idle device is either host work or such a wait), and torch.profiler's
table of host time per op (self CPU time, top rows) of 20 fwd+bwd calls.

    python bench/host_profile.py                       # 2k and m7c_125m
    python bench/host_profile.py --shapes 2k --rows 40
    python bench/host_profile.py --shapes 2k --cprofile   # also Python functions (cProfile)
    python bench/host_profile.py --shapes m7c_125m --batch 32 --cuda   # GPU time per kernel
    python bench/host_profile.py --layer --shapes 4k 16k --cprofile    # the whole m7c layer, bf16 autocast
    python bench/host_profile.py --layer --shapes 4k 32k --graph-tokens 0   # the layer without its graphs
    python bench/host_profile.py --layer --shapes 32k --graph-tokens 0 --origins   # launches by source line
    python bench/host_profile.py --layer --shapes 32k --graph-tokens 0 --gaps   # where the GPU waits for the host
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_nsa import _bench, _fwd_bwd, host_behind_busy_gpu, host_times, shape_of  # noqa: E402
from bench.inputs import random_inputs  # noqa: E402
from bench.ops import OPS  # noqa: E402
from nsa.attention.config import NSAConfig  # noqa: E402


def graph_ms(fn) -> float:
    """Median time of fn replayed as a CUDA graph (captured after a warm-up on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return _bench(g.replay)


def op_overhead(x, cfg, n: int = 200):
    """Host us per call of each backward/selection custom op against its plain implementation
    (same arguments): the price of the custom-op dispatcher path."""
    import time

    from nsa.kernels import band_attention as BA
    from nsa.kernels import selection as SE
    from nsa.kernels import topk as TK

    q, kc, vc, do = (getattr(x, n_).detach() for n_ in ("q", "kc", "vc", "do"))
    o, lse = BA.band_forward(q, kc, vc, 0, cfg.cmp_block, cfg.cmp_stride, 0, False)
    args_tk = (q, kc, lse, 0, cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.n_selected, "")
    idx = TK.select_blocks_op(*args_tk)
    ks, vs = x.k_sel.detach(), x.v_sel.detach()
    so, slse, _ = SE._sel_fwd(q, ks, vs, idx, cfg.sel_block, 0, False, "auto")
    cases = {
        "band_bwd": (BA.band_op.bwd, BA._band_bwd,
                     (q, kc, vc, o, lse, do, 0, cfg.cmp_block, cfg.cmp_stride, 0, False, False, "")),
        "sel_bwd": (SE.sel_op.bwd, SE._sel_bwd, (q, ks, vs, idx, so, slse, *SE.as_outputs(None, q.device), do,
                                                 cfg.sel_block, 0, False, "auto", "")),
        "select_blocks": (TK.select_blocks_op, TK._select_blocks_op, args_tk),
    }
    for name, (op, impl, args) in cases.items():
        row = []
        for label, fn in (("op", op), ("direct", impl)):
            if fn is None:
                continue
            fn(*args)
            torch.cuda.synchronize()
            t = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn(*args)
                t.append(time.perf_counter() - t0)
                if len(t) % 20 == 0:
                    torch.cuda.synchronize()  # keep the launch queue short
            row.append(f"{label} {sorted(t)[n // 2] * 1e6:.0f} us")
        print(f"# host per call, {name}: " + ", ".join(row))


#: the GPU work (ms) queued ahead of a call to find whether the call waits for the GPU
BUSY_MS = 50.0


def print_waits(fb, behind: float):
    """Whether one call of fb waits for the GPU (bench.bench_nsa.host_behind_busy_gpu: its host
    time behind BUSY_MS of queued work, against BUSY_MS / 2) and, where it does, the synchronising
    calls torch's sync debug mode reports in one more call (a cudaFree of the allocator is not
    among them)."""
    import warnings

    waits = behind > BUSY_MS / 2
    print(f"# host time behind {BUSY_MS:.0f} ms of queued GPU work: {behind:.3f} ms "
          f"({'waits for the GPU' if waits else 'never waits for the GPU'})")
    if not waits:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fb()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
    print(f"#   synchronising calls torch reports: {len(syncs)}" + "".join(f"\n#   {m}" for m in syncs[:10]))


def print_kernels(prof, calls: int, rows: int):
    """GPU kernels by their own device time, per fwd+bwd call."""
    def dev_us(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    kernels = [e for e in prof.key_averages() if dev_us(e) > 0 and e.device_type.name == "CUDA"]
    total = sum(dev_us(e) for e in kernels)
    print("| kernel | ms per fwd+bwd | share | launches per fwd+bwd |\n|---|---:|---:|---:|")
    for e in sorted(kernels, key=dev_us, reverse=True)[:rows]:
        print(f"| {e.key[:70]} | {dev_us(e) / calls / 1e3:.3f} | {dev_us(e) / total:.1%} | {e.count / calls:g} |")
    print(f"| total | {total / calls / 1e3:.3f} | | |")


#: ops that allocate or only describe memory: no kernel
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias",
              "lift_fresh", "_local_scalar_dense", "set_", "resize_", "_unsafe_view"}


def _nsa_frame(frames) -> str | None:
    """The innermost frame of this repository's nsa/ package among ``frames`` (traceback's
    FrameSummary objects, or the lines traceback.format_stack gives), as 'nsa/path.py:line
    function'."""
    import re

    found = None
    for f in frames:
        if isinstance(f, str):
            m = re.search(r'File "([^"]+)", line (\d+), in (\S+)', f)
            if m is None:
                continue
            filename, lineno, name = m.group(1), m.group(2), m.group(3)
        else:
            filename, lineno, name = f.filename, f.lineno, f.name
        if "/nsa/" in filename:
            found = f"{filename[filename.rindex('/nsa/') + 1:]}:{lineno} {name}"
    return found


def op_origins(fb, calls: int = 5) -> tuple[dict[str, int], dict[str, int]]:
    """The aten ops that run kernels (no views, no allocations) in ``calls`` runs of fb, per
    call, keyed by the op and the innermost frame of this repository's nsa/ package that called
    it; an op of the backward that autograd's engine runs is keyed by its autograd node and the
    frame whose forward made that node (anomaly mode records it). And the autograd nodes that ran
    any op, per call, by node and that frame: each costs the engine host time, a view's too.
    Triton launches are not aten ops: the profiler's kernel table counts them. The ops are
    watched by a WatchingMode, under which the kernels take their eager path (under any other
    dispatch mode they would run as custom ops, as a traced graph holds them)."""
    import traceback

    from nsa.kernels._autograd import WatchingMode

    counts: dict[str, int] = {}
    nodes: dict[int, str] = {}  # id of a node that ran -> its key (nodes are kept alive below)
    alive = []

    def node_key(node) -> str:
        made = node.metadata.get("traceback_")
        return f"{node.name()} of {_nsa_frame(made) if made else '(no forward stack)'}"

    class Origins(WatchingMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            node = torch._C._current_autograd_node()
            if node is not None and id(node) not in nodes:
                nodes[id(node)] = node_key(node)
                alive.append(node)
            if not func.is_view and name not in _NO_KERNEL:
                where = _nsa_frame(traceback.extract_stack())
                if where is None and node is not None:
                    where = node_key(node)
                key = f"{name} < {where}"
                counts[key] = counts.get(key, 0) + 1
            return func(*args, **(kwargs or {}))

    with Origins(), torch.autograd.detect_anomaly(check_nan=False):
        for _ in range(calls):
            fb()
    per_node: dict[str, int] = {}
    for key in nodes.values():
        per_node[key] = per_node.get(key, 0) + 1
    return ({k: n // calls for k, n in counts.items()}, {k: n // calls for k, n in per_node.items()})


def print_origins(fb, rows: int):
    ops, nodes = op_origins(fb)
    for title, counts in (("aten ops per fwd+bwd", ops), ("autograd nodes per fwd+bwd", nodes)):
        print(f"| {title} | op < where |\n|---:|---|")
        for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[:rows]:
            print(f"| {n} | {key[:160]} |")
        print(f"| {sum(counts.values())} | total |")


@dataclass
class Idle:
    """The GPU's idle time in a profiled window: the window (first kernel's start to the last
    one's end), the time kernels ran, and each gap before a kernel by the host ops that launched
    it (the innermost three, launch calls left out), all in us."""
    window: float
    busy: float
    gaps: dict[str, list[float]]


def device_work(prof) -> list[tuple[float, float, int]]:
    """A torch.profiler profile's CUDA kernels, memsets and copies as (start us, end us, the
    launching CPU event's id), from its kineto events (FunctionEvent does not carry that id in
    every torch version)."""
    return [(k.start_ns() / 1e3, k.end_ns() / 1e3, k.linked_correlation_id())
            for k in prof.profiler.kineto_results.events() if k.device_type().name == "CUDA"]


def gpu_idle(cpu_events, work: list[tuple[float, float, int]]) -> Idle | None:
    """Idle of the device ``work`` (device_work), each gap named by the CPU ops among
    ``cpu_events`` (a profile's events()) that launched its kernel; None without two device events."""
    by_id = {e.id: e for e in cpu_events if e.device_type.name == "CPU"}
    work = sorted(work)
    if len(work) < 2:
        return None

    def owner(launch_id: int) -> str:
        chain, e = [], by_id.get(launch_id)
        while e is not None and len(chain) < 3:
            if not e.name.startswith(("cuda", "cu")):
                chain.append(e.name[:60])
            e = e.cpu_parent
        return " < ".join(chain) or "(no host op)"

    gaps: dict[str, list[float]] = {}
    first, end = work[0][0], work[0][1]
    busy = end - first
    for start, stop, launch_id in work[1:]:
        if start > end:
            gaps.setdefault(owner(launch_id), []).append(start - end)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return Idle(end - first, busy, gaps)


def print_gaps(prof, calls: int, rows: int):
    """Where the GPU waited for the host in ``calls`` back-to-back calls (gpu_idle), per call."""
    idle = gpu_idle(prof.events(), device_work(prof))
    if idle is None:
        print("# gaps: fewer than two kernels profiled")
        return
    total = sum(sum(g) for g in idle.gaps.values())
    print(f"# gaps: GPU busy {idle.busy / idle.window:.1%} of {idle.window / calls / 1e3:.3f} ms a call; idle "
          f"{total / calls / 1e3:.3f} ms a call")
    print("| idle ms a call | gaps a call | kernel launched by |\n|---:|---:|---|")
    for name, gaps in sorted(idle.gaps.items(), key=lambda kv: -sum(kv[1]))[:rows]:
        print(f"| {sum(gaps) / calls / 1e3:.3f} | {len(gaps) / calls:g} | {name} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2k", "m7c_125m"], help="bench/bench_nsa.py's shape names")
    ap.add_argument("--rows", type=int, default=30, help="profiler table rows")
    ap.add_argument("--batch", type=int, default=None, help="batch size instead of the shape's own")
    ap.add_argument("--cuda", action="store_true",
                    help="profile the GPU kernels instead of the host ops (table by CUDA time)")
    ap.add_argument("--op-overhead", action="store_true",
                    help="also time each custom op against its plain implementation (host us per call)")
    ap.add_argument("--layer", action="store_true",
                    help="profile one m7c_125m NSAAttention layer (projections included, bf16 autocast, "
                         "bench/nsa_vs_dense.py's layer) instead of the core; --shapes are then lengths (4k)")
    ap.add_argument("--graph-tokens", type=int, default=None,
                    help="with --layer: the layer's own CUDA graphs up to this many tokens (0: none; default: the "
                         "layer's)")
    ap.add_argument("--origins", action="store_true",
                    help="also the aten ops that run kernels grouped by the source line they come from")
    ap.add_argument("--gaps", action="store_true",
                    help="also where the GPU waits for the host in 10 back-to-back calls (idle time before a "
                         "kernel, by the host ops that launched it)")
    ap.add_argument("--cprofile", action="store_true",
                    help="also print cProfile's Python functions by own time (Triton's launcher included)")
    ap.add_argument("--cprofile-dump", metavar="DIR",
                    help="with --cprofile: also write each shape's cProfile statistics to DIR/<shape>.pstats")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("host_profile.py needs a CUDA GPU")
    cfg = NSAConfig()
    for name in a.shapes:
        if a.layer:
            from bench.nsa_vs_dense import GRAPH_TOKENS, layer_step, length

            if a.graph_tokens is not None:
                GRAPH_TOKENS[0] = a.graph_tokens
            B, (_, fb) = 1, layer_step("nsa", length(name), "m7c_125m", torch.device("cuda"))
        else:
            B, S, HQ, H, K = shape_of(name)
            x = random_inputs(a.batch or B, S, HQ, H, K, cfg)
            fwd, leaves = OPS["nsa_core"].build(x, cfg)
            fb = _fwd_bwd(fwd, leaves, x.do)
        times = host_times(fb, n=50)
        host, host_min, dev = times[25], times[0], _bench(fb)
        behind = host_behind_busy_gpu(fb, BUSY_MS)
        try:
            graph = f"{graph_ms(fb):.3f}"
        except Exception as e:  # a capture failure is a finding, not a crash
            graph = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        if a.op_overhead and not a.layer:
            op_overhead(x, cfg)
        print(f"# {name} (B={a.batch or B}): host {host:.3f} ms (least {host_min:.3f}) | do_bench {dev:.3f} ms | "
              f"CUDA graph replay {graph} ms")
        print_waits(fb, behind)
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.cuda else [])
        if a.origins:
            print_origins(fb, rows=a.rows)
        if a.gaps:
            fb()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fb()
                torch.cuda.synchronize()
            print_gaps(prof, calls=10, rows=a.rows)
        with profile(activities=acts) as prof:
            for _ in range(20):
                fb()
            torch.cuda.synchronize()
        if a.cuda:
            print_kernels(prof, calls=20, rows=a.rows)
        else:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))
        if a.cprofile:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(20):
                fb()
            torch.cuda.synchronize()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(a.rows)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(a.rows)
            if a.cprofile_dump:
                Path(a.cprofile_dump).mkdir(parents=True, exist_ok=True)
                pr.dump_stats(Path(a.cprofile_dump) / f"{name}.pstats")
        x = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
