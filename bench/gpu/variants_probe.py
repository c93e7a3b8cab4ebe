"""Probe: variants of two kernels issue 15's tables point at, each timed alone on random inputs
(q/k/v as bench/bench_nsa.py makes them, the top-n of random inputs):

  sel-bwd    the selected branch's backward with dq from the dS tiles the dk/dv pass keeps
             (selection.TUNE['dq_from_ds'], the default at one token a tile) against the dq
             kernel that gathers each token's K and V blocks again;
  ds-budget  that backward with its dS tiles bounded to fewer bytes (TUNE['ds_budget']), so
             that it takes the query tokens in 1, 4 and 16 chunks;
  win-tiles  the window branch (band kernel, WINDOW=True) at other (BM, BN, warps, stages) for
             its forward, dq and dk/dv kernels (band_attention.TILES["win"]), one kernel's tiles
             varied at a time from the defaults;
  sel-dkv    the selected branch's backward with its (key-major) dk/dv kernel at other
             (query rows per step, warps, stages); the gradients against the first variant's;
  sel-tma    the selected forward (and the backward after it) with the forward's K/V blocks
             gathered by pointers or through TMA descriptors (selection.TUNE['tma']) at other
             (warps, stages); outputs and gradients against the pointer path's. (Its first run,
             344fb95, also sent the dS dq kernel's loads through TMA: 0.99-1.0x, removed.)

    python3 bench/gpu/variants_probe.py [--shapes 64k 16k] [--parts sel-bwd ds-budget win-tiles sel-dkv]

Prints one line a variant: the median ms (triton.testing.do_bench) and its ratio to the
default's median of the same run. On CPU (TRITON_INTERPRET=1) it is a dry run at a tiny shape
that only checks every variant runs.

Its first run (commit 7d47893, docs/measurements/2026-11-23-d/) timed another sel-bwd variant,
dq added by the dk/dv pass with float32 atomics per token and block: 41.2 ms against 33.6 for
the dq kernel at S=64k, 9.08 against 8.04 at 16k, so that variant was removed. A later part
(commit 6e43bc5, docs/measurements/2026-11-23-e/dkv_forms_6e43bc5.log) timed the dk/dv kernels
of the selected branch and the window in two forms, S = Q K^T with P and dS transposed for dV
and dK, and key-major S^T = K Q^T: key-major won for the selected branch (at 64 rows and
4 warps) and lost for the window (11.45 against 11.05 ms at 64k), which kept its form. A part
band-offsets (commit d198f62, docs/measurements/2026-11-23-e/band_offsets_d198f62.log) timed the
band forward and dq kernels with their key-tile offsets as an int64 base plus int32 offsets
(fewer spills in an sm_90 compile: 384 against 1372 bytes for the window's dq kernel): the
window within 1-2% either way, the compressed branch's band forward 1.15-1.18x slower; removed.
A part band-tma (commit 3f671dd, docs/measurements/2026-11-23-f/tma_3f671dd.log) timed the band
kernels' forward and dq key tiles through TMA descriptors: the window 0.957x / 0.968x (fwd /
bwd) at 64k, no gain at 16k and 2k; the compressed branch's band kernel 1.98x / 2.47x slower at
the m7c_125m shape; and tma_ab.py (now core_ab.py) measured 0.64-1.13 ms more host time a step with them in
five of six runs: removed. The sel-tma part of commit d345f4e (pair_d345f4e.log there) timed a
forward that ran two tokens a program and loaded the blocks both may be forced to select once:
1.24-1.30x the one-token TMA forward's time at 16k-64k (202 registers against 126 in an sm_90
compile, half the programs an SM holds); removed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks  # noqa: E402
from nsa.kernels import band_attention as BA  # noqa: E402
from nsa.kernels import selection as S  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = {"tiny": (1, 256, 8, 2, 32), "2k": (1, 2048, 64, 4, 128), "m7c_125m": (8, 2048, 12, 2, 64),
          "16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128), "64k": (1, 65536, 64, 4, 128)}
WIN_TILES = {  # (BM, BN, warps, stages), K=128; the first run's best and their neighbours
    "fwd": [(128, 32, 4, 4), (128, 32, 4, 3), (128, 32, 4, 5), (128, 32, 8, 4), (256, 64, 8, 3),
            (256, 32, 8, 4), (256, 32, 8, 3), (64, 32, 4, 4), (128, 16, 4, 4)],
    "dq": [(64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 4), (32, 32, 4, 3)],
    "dkv": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2), (64, 32, 4, 3), (32, 64, 4, 2), (64, 64, 8, 2),
            (32, 128, 4, 2), (128, 32, 4, 2)],
}


def bench(fn) -> float:
    if DEV == "cpu":
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")


def timed(label: str, fn, base: float | None) -> float:
    try:
        t = bench(fn)
    except Exception as e:  # a variant that does not compile (shared memory, registers) is a result too
        print(f"  {label:44s} failed: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}",
              flush=True)
        return float("nan")
    ratio = f"{t / base:6.3f}x" if base else "  base"
    print(f"  {label:44s} {t:9.3f} ms  {ratio}", flush=True)
    return t


def sel_bwd(q, k, v, idx, do, LS: int) -> None:
    with torch.no_grad():
        o, lse = S._sel_fwd(q, k, v, idx, LS, 0, False)
    saved = S.TUNE["dq_from_ds"]
    grads = {}
    try:
        base = None
        for from_ds in (False, True):
            S.TUNE["dq_from_ds"] = from_ds
            used = S._ds_path(q, k, idx.shape[-1], LS)
            label = f"sel bwd, dq {'from dS tiles' if used else 'kernel'} (dq_from_ds={from_ds})"
            t = timed(label, lambda: S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False), base)
            base = base or t
            grads[from_ds] = [g.float() for g in S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False)]
    finally:
        S.TUNE["dq_from_ds"] = saved
    for name, a, b in zip(("dq", "dk", "dv"), grads[False], grads[True]):
        print(f"  {name}: relative difference between the two {((a - b).norm() / a.norm()).item():.2e}", flush=True)


def ds_budget(q, k, v, idx, do, LS: int) -> None:
    with torch.no_grad():
        o, lse = S._sel_fwd(q, k, v, idx, LS, 0, False)
    saved = S.TUNE["ds_budget"]
    tiles = idx.numel() * (q.shape[2] // k.shape[2]) * LS * q.element_size()  # all tokens' dS tiles
    base = None
    try:
        for chunks in (1, 4, 16):
            S.TUNE["ds_budget"] = -(-tiles // chunks)
            n = -(-q.shape[1] // S._ds_chunk(q, idx.shape[-1], LS))
            if DEV == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t = timed(f"sel bwd, dS tiles in {n} chunk(s) of <= {S.TUNE['ds_budget'] / 2**30:.2f} GiB",
                      lambda: S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False), base)
            base = base or t
            if DEV == "cuda":
                print(f"    peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated", flush=True)
    finally:
        S.TUNE["ds_budget"] = saved


def win_tiles(q, k, v, do, W: int) -> None:
    i = 1  # head dim > 64
    tiles_now = BA.TILES["win"]
    saved = dict(tiles_now)
    fwd = lambda: BA._band_fwd(q, k, v, 0, 1, 1, W, True, False)  # noqa: E731
    o, lse = fwd()
    bwd = lambda: BA._band_bwd(q, k, v, o, lse, do, 0, 1, 1, W, True, False)  # noqa: E731
    try:
        for kernel, variants in WIN_TILES.items():
            fn = fwd if kernel == "fwd" else bwd
            what = "win fwd" if kernel == "fwd" else "win bwd (dq + dkv)"
            base = timed(f"{what}, {kernel} {saved[kernel][i]} (default)", fn, None)
            for tiles in variants:
                tiles_now[kernel] = tuple(tiles if j == i else c for j, c in enumerate(saved[kernel]))
                timed(f"{what}, {kernel} {tiles}", fn, base)
            tiles_now[kernel] = saved[kernel]
    finally:
        tiles_now.update(saved)


SEL_DKV = [(64, 4, 2), (64, 4, 3), (32, 4, 2), (32, 4, 3), (128, 4, 2), (64, 8, 2), (128, 8, 2)]  # (rows per step, warps, stages)


def sel_dkv(q, k, v, idx, do, LS: int) -> None:
    with torch.no_grad():
        o, lse = S._sel_fwd(q, k, v, idx, LS, 0, False)
    saved = dict(S.TUNE)
    base, ref = None, None
    try:
        for rows, warps, stages in SEL_DKV:
            S.TUNE.update(dkv_cells=rows * S._meta(q, k, LS)["BK"], dkv_warps=warps, dkv_stages=stages)
            fn = lambda: S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False)  # noqa: E731
            t = timed(f"sel bwd, dk/dv rows={rows} warps={warps} stages={stages}", fn, base)
            base = base or t
            grads = fn()
            ref = ref or grads
            print("    relative difference to the first: " + " ".join(
                f"{n}={((a.float() - b.float()).norm() / b.float().norm()).item():.1e}"
                for n, a, b in zip(("dq", "dk", "dv"), grads, ref)), flush=True)
    finally:
        S.TUNE.update(saved)


# (tma, warps, stages of the forward: fwd_stages by pointers, tma_stages through TMA); the first
# run (344fb95, docs/measurements/2026-11-23-f/tma_344fb95.log) also had 8 warps (1.26-2.2x)
SEL_TMA = [(False, 4, 2), (True, 4, 3), (True, 4, 2), (True, 4, 4)]


def sel_tma(q, k, v, idx, do, LS: int) -> None:
    saved = dict(S.TUNE)
    base_f = base_b = None
    ref = None
    try:
        for tma, warps, stages in SEL_TMA:
            S.TUNE.update(tma=tma, fwd_warps=warps, **{"tma_stages" if tma else "fwd_stages": stages})
            TT = S._tokens_per_tile(q.shape[2] // k.shape[2], idx.shape[-1], -(-k.shape[1] // LS), q.shape[1])
            used = "tma" if S._tma(k, v, LS, TT) else "pointers"
            fwd = lambda: S._sel_fwd(q, k, v, idx, LS, 0, False)  # noqa: E731
            tf = timed(f"sel fwd, {used} warps={warps} stages={stages}", fwd, base_f)
            o, lse = fwd()
            bwd = lambda: S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False)  # noqa: E731
            tb = timed(f"sel bwd, {used} warps={warps} stages={stages}", bwd, base_b)
            base_f, base_b = base_f or tf, base_b or tb
            outs = [o, *bwd()]
            ref = ref or outs
            print("    max abs difference to the first: " + " ".join(
                f"{n}={(a.float() - b.float()).abs().max().item():.1e}"
                for n, a, b in zip(("o", "dq", "dk", "dv"), outs, ref)), flush=True)
    finally:
        S.TUNE.update(saved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["64k", "16k"], choices=sorted(SHAPES))
    ap.add_argument("--parts", nargs="+", default=["sel-bwd", "ds-budget", "win-tiles"],
                    choices=["sel-bwd", "ds-budget", "win-tiles", "sel-dkv", "sel-tma"])
    args = ap.parse_args()
    if DEV == "cpu":  # the interpreter runs every tile size; keep the dry run to the tiny shape
        WIN_TILES.update({key: [(32, 16, 4, 1)] for key in WIN_TILES})
        SEL_DKV[:] = SEL_DKV[:2]
        SEL_TMA[:] = SEL_TMA[:2]
    cfg = NSAConfig()
    print(f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu (dry run)'}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    for name in args.shapes:
        B, S_, HQ, H, K = SHAPES[name]
        g = torch.Generator(device=DEV).manual_seed(0)
        dt = torch.bfloat16 if DEV == "cuda" else torch.float32
        q, do = (torch.randn(B, S_, HQ, K, generator=g, device=DEV).to(dt) for _ in range(2))
        k, v = (torch.randn(B, S_, H, K, generator=g, device=DEV).to(dt) for _ in range(2))
        print(f"## {name} (B={B} S={S_} HQ={HQ} H={H} K={K})", flush=True)
        if {"sel-bwd", "ds-budget", "sel-dkv", "sel-tma"} & set(args.parts):
            Nc = (S_ - cfg.cmp_block) // cfg.cmp_stride + 1
            kc, vc = (torch.randn(B, Nc, H, K, generator=g, device=DEV).to(dt) for _ in range(2))
            with torch.no_grad():
                idx = triton_select_blocks(q, kc, triton_cmp_attention(q, kc, vc, cfg)[1], cfg)
            if DEV == "cpu":  # the tiny shape tiles tokens; time the one-token-a-tile path
                S.TUNE["tt"] = 1
            if "sel-bwd" in args.parts:
                sel_bwd(q, k, v, idx, do, cfg.sel_block)
            if "ds-budget" in args.parts:
                ds_budget(q, k, v, idx, do, cfg.sel_block)
            if "sel-dkv" in args.parts:
                sel_dkv(q, k, v, idx, do, cfg.sel_block)
            if "sel-tma" in args.parts:
                sel_tma(q, k, v, idx, do, cfg.sel_block)
            del kc, vc, idx
        if "win-tiles" in args.parts:
            win_tiles(q, k, v, do, cfg.window)
        del q, k, v, do
        if DEV == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
