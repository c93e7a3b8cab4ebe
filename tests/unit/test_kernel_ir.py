"""What Triton's compiler makes of a kernel's source, for sm_90 and without a GPU: the top-n score
kernel (nsa.kernels.topk) multiplies only where its source calls tl.dot. Triton rewrites
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


@pytest.mark.parametrize("G,GP,BT", [(2, 2, 64), (6, 8, 16)], ids=["G2", "G6"])
def test_the_score_kernel_multiplies_only_where_it_calls_tl_dot(tmp_path, G, GP, BT):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-c", COMPILE, str(G), str(GP), str(BT)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    if run.returncode and "ptxas" in run.stderr:
        pytest.skip(f"no ptxas to compile for sm_90 here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    # its two q . kc products (the chunks every row sees whole, then the masked ones)
    assert int(run.stdout.split()[-1]) == 2
