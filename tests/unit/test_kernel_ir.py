"""What Triton's compiler makes of a kernel's source, for sm_90 and without a GPU: the top-n score
kernel (nsa.kernels.topk) multiplies only where its source calls tl.dot; the RoPE and split kernel
(nsa.kernels.rope) picks a key/value stream's tensor at run time and reads or writes each row
once; the band kernels and the selected dk/dv pass, at their tuned tiles, spill at most two thirds
of the registers with int32 tile offsets that they do with int64 ones. Triton rewrites
sum(a[:, :, None] * b[None, :, :], 1) into a tl.dot of its default float32 precision, which is
TF32 on some versions: the score kernel's hand-over from one selection block to the next, written
so, lost 13 mantissa bits and chose wrong blocks in float32 on an H200. The interpreter computes
that sum exactly, so only the compiled kernel shows it. The compile runs in a process of its own:
this test session's kernels may be the interpreter's (tests/kernels/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nsa.kernels import topk

kernel = topk._score_kernel
signature = {n: "*fp32" for n in ("q", "kc", "lse", "scores")} | {n: "i32" for n in ("Tq", "Nc", "NB", "q_start")}
G, GP, BT = map(int, sys.argv[1:])
constexprs = dict(H=2, G=G, GP=GP, K=64, BK=64, L=32, D=16, LS=64, BJ=16, BT=BT, RP=4, DOT="tf32x3")
source = ASTSource(fn=kernel, signature=signature | {"sm_scale": "fp32"} | {n: "constexpr" for n in constexprs},
                   constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8, num_stages=2))
print(compiled.asm["ttir"].count("tt.dot "))
"""


ROPE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nsa.kernels import rope

kernel = rope._rope_split_kernel
pointers = ("q_in", "q_out", "packed", "s0", "s1", "s2", "s3", "s4", "s5", "g_in", "g_saved", "g_out", "bias")
ints = ("n_tokens", "T", "q_in_stride", "q_out_stride", "kv_packed_stride", "g_in_stride", "g_out_stride")
signature = ({n: "*bf16" for n in pointers} | {"cos": "*fp32", "sin": "*fp32", "sign": "fp32"}
             | {n: "i32" for n in ints})
constexprs = dict(HQ=12, H=2, P=3, HALF=32, BH=32, BT=32, PACK=sys.argv[1] == "backward", NG=36, PAD=4, BG=64)
source = ASTSource(fn=kernel, signature=signature | {n: "constexpr" for n in constexprs},
                   constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
ttir = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ttir"]
print(ttir.count("tt.load"), ttir.count("tt.store"))
"""


def _compile(tmp_path, program: str, *args: str) -> str:
    """stdout of ``program`` (a compile for sm_90) run in a process of its own; skips where this
    machine has no ptxas."""
    return _run(tmp_path, ["-c", program, *args])


def _run_bench(tmp_path, script: str, *args: str) -> str:
    """stdout of bench/``script`` (a compile for sm_90), as _compile's."""
    return _run(tmp_path, [str(ROOT / "bench" / script), *args])


def _run(tmp_path, argv: list[str]) -> str:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode and "ptxas" in run.stderr:
        pytest.skip(f"no ptxas to compile for sm_90 here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.parametrize("G,GP,BT", [(2, 2, 64), (6, 8, 16)], ids=["G2", "G6"])
def test_the_score_kernel_multiplies_only_where_it_calls_tl_dot(tmp_path, G, GP, BT):
    # its two q . kc products (the chunks every row sees whole, then the masked ones)
    assert int(_compile(tmp_path, COMPILE, str(G), str(GP), str(BT)).split()[-1]) == 2


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_the_rope_kernel_moves_each_row_once_whichever_stream_it_picks(tmp_path, direction):
    """One load and one store of a row wherever it goes (a query head, the key/value stream
    picked among s0 .. s5, the gates), beside the angle tables' two loads and the gates' second
    input (their bias forward, the saved gates backward): the stream's pointer is chosen before
    the row moves, not the row moved once per candidate stream."""
    loads, stores = map(int, _compile(tmp_path, ROPE, direction).split()[-2:])
    assert (loads, stores) == (6, 3)


@pytest.mark.parametrize("kernel", ["band_fwd", "band_dq", "sel_dkv"])
def test_int32_tile_offsets_spill_at_most_two_thirds_of_int64_ones(tmp_path, kernel):
    """An int64 offset per element of a [rows, head dim] tile takes two registers a lane: at the
    m7c shape (bf16, G = 6, K = 64) and the tuned tiles these kernels spill several times as much
    with them (nsa.kernels._launch.wide_offsets, the kernels' WIDE), so they take int32 offsets
    from an int64 base wherever a sequence's span fits (`python bench/kernel_spills.py` prints the
    registers and spills of each)."""
    narrow, wide = (int(_run_bench(tmp_path / form, "kernel_spills.py", kernel, form).split()[-2])
                    for form in ("narrow", "wide"))
    assert wide > 0 and narrow <= wide * 2 / 3, f"spill stores: {narrow} bytes with int32 offsets, {wide} with int64"
