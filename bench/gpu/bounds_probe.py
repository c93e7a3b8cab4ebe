"""Probe: how far issue 15's long-context kernels are from what bounds them, and two changes of
the glue around them, each timed alone on random inputs (as bench/bench_nsa.py makes them):

  gather     the selected forward against a kernel that only loads the same K/V blocks (the
             same descriptors or pointers, the same pipeline) and sums them: the time the
             gather alone takes, on the top-n of random inputs and on a selection that keeps
             its blocks in L2 (every token picks blocks 0..n-1);
  cudnn-gqa  the compressed branch on cuDNN with each KV head copied for its G query heads
             (cudnn_compressed._fold_kv today) against cuDNN's own grouped-query attention
             (K/V with H heads): outputs and gradients against each other, fwd and fwd+bwd;
  dkv-ds     the selected branch's dk/dv pass with and without storing the dS tiles for the
             dq pass, and that dq pass alone.

A part dkv-order (commit c01f1db, docs/measurements/2026-11-23-g/order_c01f1db.log) timed that
dk/dv pass with a gate multiplied into its register tiles and the order of its dP and dV
products; the gate is folded into the log-sum-exp since (nsa.kernels.gated_branches) and the
part was removed.

    python3 bench/gpu/bounds_probe.py [--shapes 16k 64k] [--parts gather cudnn-gqa dkv-ds]

Prints one line a variant: the median ms (triton.testing.do_bench) and its ratio to the first
line of its group, in the same run. Needs a CUDA GPU (sm_90 for the descriptors).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nsa.attention.config import NSAConfig  # noqa: E402
from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks  # noqa: E402
from nsa.kernels import cudnn_compressed as CC  # noqa: E402
from nsa.kernels import selection as S  # noqa: E402
from nsa.kernels._tma import kv_desc  # noqa: E402

SHAPES = {"16k": (1, 16384, 64, 4, 128), "32k": (1, 32768, 64, 4, 128), "64k": (1, 65536, 64, 4, 128)}


def timed(label: str, fn, base: float | None) -> float:
    t = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")
    ratio = f"{t / base:6.3f}x" if base else "  base"
    print(f"  {label:58s} {t:9.3f} ms  {ratio}", flush=True)
    return t


@triton.jit
def _gather_only_kernel(k, v, idx, out, Tq, Tk, H: tl.constexpr, K: tl.constexpr, LS: tl.constexpr,
                        N: tl.constexpr, NP: tl.constexpr, TMA: tl.constexpr):
    """One program per (token, KV head), as the selected forward at one token a program: loads
    the token's selected blocks of K and V (S._load_block) and sums them, no attention."""
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs = tl.arange(0, LS)
    offk = tl.arange(0, K)
    ubase = idx + ((b.to(tl.int64) * Tq + t) * H + h) * N
    n_valid = tl.sum((tl.load(ubase + tl.arange(0, NP), mask=tl.arange(0, NP) < N, other=-1) >= 0).to(tl.int32), 0)
    acc = tl.zeros([LS, K], tl.float32)
    for i in range(0, n_valid):
        j = tl.load(ubase + i)
        kload = (j * LS + offs) < Tk
        kt = S._load_block(k, b, h, j, offs, offk, kload, offk < K, Tk, H, K, LS, TMA)
        vt = S._load_block(v, b, h, j, offs, offk, kload, offk < K, Tk, H, K, LS, TMA)
        acc += kt.to(tl.float32) + vt.to(tl.float32)
    tl.store(out + (b * Tq + t) * H + h, tl.sum(tl.sum(acc, 1), 0))


def gather(q, k, v, idx, LS: int) -> None:
    B, Tq, H, n = idx.shape
    K = k.shape[-1]
    out = torch.empty(B, Tq, H, device=q.device, dtype=torch.float32)
    own = torch.arange(Tq, device=q.device) // LS  # blocks 0..n-1 for every token (causal), -1 padded
    ar = torch.arange(n, device=q.device)
    shared = torch.where(ar[None, :] <= own[:, None], ar[None, :], -1)[None, :, None, :].expand_as(idx).contiguous()
    for name, sel in (("top-n of random inputs", idx), ("blocks 0..n-1 (L2-resident)", shared)):
        print(f"  -- {name}", flush=True)
        base = timed("sel fwd (TMA, the default)", lambda: S._sel_fwd(q, k, v, sel, LS, 0, False), None)
        for tma in (True, False):
            kv = (kv_desc(k, LS), kv_desc(v, LS)) if tma else (k, v)
            stages = S.TUNE["tma_stages"] if tma else S.TUNE["fwd_stages"]
            fn = lambda: _gather_only_kernel[(Tq, B * H)](  # noqa: E731
                *kv, sel, out, Tq, k.shape[1], H=H, K=K, LS=LS, N=n, NP=triton.next_power_of_2(n), TMA=tma,
                num_warps=S.TUNE["fwd_warps"], num_stages=stages)
            t = timed(f"loads only, {'TMA' if tma else 'pointers'} ({stages} stages)", fn, base)
            blocks = (sel >= 0).sum().item()
            print(f"    {blocks} (token, head, block) loads, {blocks * 2 * LS * K * k.element_size() / 1e9:.1f} GB: "
                  f"{blocks * 2 * LS * K * k.element_size() / t / 1e9:.2f} TB/s", flush=True)


def _gqa_fold_kv(x, G: int, d: int):
    R, H, K = x.shape
    return x.permute(1, 0, 2).unsqueeze(0).expand(d, H, R, K)


def cudnn_gqa(q, kc, vc, do, cfg: NSAConfig) -> None:
    leaves = [t.detach().requires_grad_() for t in (q, kc, vc)]
    saved = CC._fold_kv
    outs, base_f, base_b = {}, None, None
    try:
        for name, fold in (("per-head copies (today)", saved), ("cuDNN grouped-query", _gqa_fold_kv)):
            CC._fold_kv = fold
            run = lambda: CC.cudnn_cmp_attention(*leaves, 0, cfg.cmp_block, cfg.cmp_stride)  # noqa: E731
            try:
                with torch.no_grad():
                    tf = timed(f"cmp fwd, {name}", run, base_f)
                o, lse = run()
                outs[name] = [o, lse, *torch.autograd.grad(o, leaves, do)]
                tb = timed(f"cmp fwd+bwd, {name}", lambda: torch.autograd.grad(run()[0], leaves, do), base_b)
            except Exception as e:  # cuDNN refusing the grouped heads is a result too
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
                continue
            base_f, base_b = base_f or tf, base_b or tb
    finally:
        CC._fold_kv = saved
    if len(outs) == 2:
        a, b = outs.values()
        print("    relative difference (o, lse, dq, dkc, dvc): " + " ".join(
            f"{((x.float() - y.float()).norm() / y.float().norm()).item():.1e}" for x, y in zip(b, a)), flush=True)


def dkv_ds(q, k, v, idx, do, LS: int) -> None:
    with torch.no_grad():
        o, lse = S._sel_fwd(q, k, v, idx, LS, 0, False)
    delta = S._row_delta(o, do)
    G = q.shape[2] // k.shape[2]
    work = S._inverse_selection(idx, k.shape[1], LS, S._dkv_qc(q.device, q.shape[1], False))
    dk, dv = torch.zeros(2, *k.shape, device=k.device, dtype=torch.float32).unbind(0)
    ds = torch.empty(idx.numel() * G * LS, device=q.device, dtype=q.dtype)
    base = timed("sel bwd, whole (today)", lambda: S._sel_bwd(q, k, v, idx, o, lse, do, LS, 0, False), None)
    timed("row delta", lambda: S._row_delta(o, do), base)
    timed("inverse selection (keys, sort, work items)",
          lambda: S._inverse_selection(idx, k.shape[1], LS, S._dkv_qc(q.device, q.shape[1], False)), base)
    timed("dk/dv pass, storing dS", lambda: S._dkv_pass(q, k, v, do, lse, delta, work, LS, 0, dk, dv, ds), base)
    timed("dk/dv pass, no dS", lambda: S._dkv_pass(q, k, v, do, lse, delta, work, LS, 0, dk, dv), base)
    saved = dict(S.TUNE)
    try:
        S.TUNE["dkv_stages"] = 3
        timed("dk/dv pass, storing dS, 3 stages", lambda: S._dkv_pass(q, k, v, do, lse, delta, work, LS, 0, dk, dv, ds),
              base)
    finally:
        S.TUNE.update(saved)
    timed("dq from dS", lambda: S._sel_dq_from_ds(q, k, idx, ds, LS), base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["16k", "64k"], choices=sorted(SHAPES))
    ap.add_argument("--parts", nargs="+", default=["gather", "cudnn-gqa", "dkv-ds"],
                    choices=["gather", "cudnn-gqa", "dkv-ds"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bounds_probe.py needs a CUDA GPU")
    cfg = NSAConfig()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}", flush=True)
    for name in args.shapes:
        B, S_, HQ, H, K = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)  # noqa: E731
        q, do, k, v = r(B, S_, HQ, K), r(B, S_, HQ, K), r(B, S_, H, K), r(B, S_, H, K)
        Nc = (S_ - cfg.cmp_block) // cfg.cmp_stride + 1
        kc, vc = r(B, Nc, H, K), r(B, Nc, H, K)
        print(f"## {name} (B={B} S={S_} HQ={HQ} H={H} K={K})", flush=True)
        with torch.no_grad():
            idx = triton_select_blocks(q, kc, triton_cmp_attention(q, kc, vc, cfg)[1], cfg)
        if "gather" in args.parts:
            gather(q, k, v, idx, cfg.sel_block)
        if "cudnn-gqa" in args.parts:
            cudnn_gqa(q, kc, vc, do, cfg)
        if "dkv-ds" in args.parts:
            dkv_ds(q, k, v, idx, do, cfg.sel_block)
        del q, k, v, do, kc, vc, idx
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
