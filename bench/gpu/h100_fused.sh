#!/usr/bin/env bash
# Issue 15, the selected and window branches and the gated sum as one op (one H100, about 6
# minutes): the GPU kernel tests that run it (bf16 parity S=1..65536 through the core, the op
# against the three separate ops, determinism, torch.compile), then bench/gpu/core_ab.py
# --switch fused (the whole core with the one op off and on, alternated) and
# bench/gpu/core_profile.py (the core's kernels by GPU time).
#   bash bench/gpu/h100_fused.sh        (results in $OUT: fused.log; TESTS_TIMEOUT, AB_SHAPES)
. bench/gpu/device_prologue.sh
device_header "$OUT/fused.log"
echo "## kernel tests on the GPU" | tee -a "$OUT/fused.log"
timeout ${TESTS_TIMEOUT:-230} python3 -m pytest -q tests/kernels/test_gated_branches.py tests/kernels/test_triton_gpu.py \
  tests/kernels/test_deterministic.py tests/kernels/test_compile.py -s -p no:cacheprovider 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/fused.log"
echo "## python3 bench/gpu/core_ab.py --switch fused --shapes ${AB_SHAPES:-2k m7c_125m 16k 32k 64k} --rounds 2" | tee -a "$OUT/fused.log"
timeout 200 python3 bench/gpu/core_ab.py --switch fused --shapes ${AB_SHAPES:-2k m7c_125m 16k 32k 64k} --rounds 2 2>&1 \
  | tee -a "$OUT/fused.log"
echo "## python3 bench/gpu/core_profile.py --shapes 16k 64k --top 24" | tee -a "$OUT/fused.log"
timeout 120 python3 bench/gpu/core_profile.py --shapes 16k 64k --top 24 2>&1 | tee -a "$OUT/fused.log"
