"""Registers and register spills of the NSA kernels that take most of an NSA layer's GPU time, as
ptxas reports them for sm_90 at the tuned tiles (bf16 inputs; m7c_125m's shape, 2 KV heads of 6
query heads and head dim 64, or the benchmark shape, 4 KV heads of 16 and head dim 128), with the
int32 tile offsets the kernels take and with the int64 ones they take for a sequence of 2^31
elements or more (WIDE, nsa.kernels._launch.wide_offsets). Runs on this machine, no GPU: Triton
compiles for sm_90 and its bundled ptxas assembles the PTX.

    python bench/kernel_spills.py                      # the table, every kernel and offset width
    python bench/kernel_spills.py --shape bench        # at the benchmark shape
    python bench/kernel_spills.py sel_dkv narrow       # one line: registers, spill stores, spill loads
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: kernel -> what its launch is (the m7c layer's)
KERNELS = {
    "band_fwd": "band forward, the compressed branch's launch",
    "band_dq": "band dq, the window's launch",
    "sel_dkv": "selected branch's dk/dv pass",
}
FORMS = ("narrow", "wide")
#: shape -> (KV heads, query heads a KV head, head dim)
SHAPES = {"m7c": (2, 6, 64), "bench": (4, 16, 128)}


def _launch(name: str, wide: bool, shape: str):
    """The kernel, its signature and constexprs, and its launch options, as a layer of ``shape``
    runs it."""
    from nsa.kernels import band_attention as band
    from nsa.kernels import selection
    from nsa.kernels.tuning import SELECTION

    H, G, K = SHAPES[shape]
    heads = dict(H=H, G=G, K=K, BK=K, DOT="tf32", WIDE=wide)
    tile = 0 if K <= 64 else 1  # band_attention.TILES: by head dim
    if name == "band_fwd":
        kernel = band._band_fwd_kernel
        bm, bn, warps, stages = band.TILES["cmp"]["fwd"][tile]
        pointers = dict(q="*bf16", k="*bf16", v="*bf16", o="*bf16", lse="*fp32")
        constexprs = dict(heads, L=32, D=16, W=0, WINDOW=False, BM=bm, BN=bn)
    elif name == "band_dq":
        kernel = band._band_bwd_dq_kernel
        bm, bn, warps, stages = band.TILES["win"]["dq"][tile]
        pointers = dict(q="*bf16", k="*bf16", v="*bf16", o="*bf16", do="*bf16", lse="*fp32", delta="*fp32",
                        dq="*bf16")
        constexprs = dict(heads, L=1, D=1, W=512, WINDOW=True, BM=bm, BN=bn, DELTA_GIVEN=True)
    else:
        kernel = selection._sel_bwd_dkv_kernel
        warps, stages = SELECTION.dkv_warps, SELECTION.dkv_stages
        pointers = dict(q="*bf16", k="*bf16", v="*bf16", do="*bf16", lse="*fp32", delta="*fp32", tokens="*i32",
                        perm="*i64", item_seg="*i32", item_start="*i32", item_end="*i32", dk="*fp32", dv="*fp32",
                        kept="*bf16")
        constexprs = dict(heads, LS=64, BS=64, ROWS=min(SELECTION.dkv_cells // K, 128), KEEP="dq")
    ints = ("Tq", "Tk", "NB", "q_start")
    signature = {p: pointers.get(p) or ("constexpr" if p in constexprs else "i32" if p in ints else "fp32")
                 for p in kernel.arg_names}
    return kernel, signature, constexprs, dict(num_warps=warps, num_stages=stages)


def usage(name: str, form: str, shape: str = "m7c") -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) of one kernel compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, signature, constexprs, options = _launch(name, form == "wide", shape)
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        Path(path).write_text(ptx)
        said = ""
        # Triton bundles more than one ptxas; the one that knows this PTX version assembles it
        for ptxas in sorted(p for p in bin_dir.iterdir() if p.name.startswith("ptxas")):
            run = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                                 capture_output=True, text=True)
            said = run.stdout + run.stderr
            if run.returncode == 0:
                regs = int(re.search(r"Used (\d+) registers", said).group(1))
                stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", said).groups())
                return regs, stores, loads
    raise SystemExit(f"no ptxas under {bin_dir} takes this PTX: {said.strip()[-300:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", choices=list(KERNELS), help="one kernel (default: all)")
    ap.add_argument("form", nargs="?", choices=FORMS, help="narrow (int32 tile offsets) or wide (int64)")
    ap.add_argument("--shape", choices=list(SHAPES), default="m7c", help="m7c_125m's heads or the benchmark's")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # an interpreted kernel compiles to nothing
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if args.kernel and args.form:
        print(*usage(args.kernel, args.form, args.shape))
        return
    import triton

    H, G, K = SHAPES[args.shape]
    print(f"Triton {triton.__version__}, sm_90, {H} KV heads of {G} query heads, head dim {K}, bf16")
    print("| kernel | offsets | registers | spill stores, bytes | spill loads, bytes |")
    print("|---|---|---:|---:|---:|")
    for name in [args.kernel] if args.kernel else KERNELS:
        for form in [args.form] if args.form else FORMS:
            regs, stores, loads = usage(name, form, args.shape)
            width = "int32" if form == "narrow" else "int64"
            print(f"| {KERNELS[name]} | {width} | {regs} | {stores} | {loads} |", flush=True)


if __name__ == "__main__":
    main()
