#!/usr/bin/env bash
# One device call (one H100, about 9 minutes): the top-n's score kernel in its two forms (rows,
# key-major) at a few launches (topk_probe.py --forms), the key-major dk/dv kernel of the
# selected branch at a few launches (variants_probe.py --parts sel-dkv), the GPU kernel tests of
# top-n and the bf16 parity against fp32 (S=1..65536), then the core benchmark.
#   OUT=<dir> bash bench/gpu/h100_forms.sh       (SHAPES="16k 64k" by default)
. bench/gpu/device_prologue.sh
device_header "$OUT/forms.log"
timeout "${TOPK_TIMEOUT:-150}" python3 bench/gpu/topk_probe.py --forms --shapes 64k 16k 2k m7c_125m 2>&1 \
  | tee -a "$OUT/forms.log"
timeout "${DKV_TIMEOUT:-120}" python3 bench/gpu/variants_probe.py --parts sel-dkv --shapes 64k 16k 2>&1 \
  | tee -a "$OUT/forms.log"
timeout "${TESTS_TIMEOUT:-110}" python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_triton_gpu.py \
  tests/kernels/test_triton_topk.py 2>&1 | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee "$OUT/tests.log"
TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-150} SHAPES="${SHAPES:-16k 64k}" OUT="$OUT" \
  bash bench/gpu/h100_kernels.sh > /dev/null 2>&1
grep -E "NSA core|SDPA cuDNN" "$OUT/kernels.log"
date -u | tee -a "$OUT/forms.log"
