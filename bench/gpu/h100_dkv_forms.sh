#!/usr/bin/env bash
# One device call (one H100, about 8 minutes): the dk/dv kernels of the selected branch and the
# window in both forms (query rows by keys, key-major) at a few tiles (variants_probe.py
# --parts dkv-forms), the bf16 parity tests against fp32 (S=1..65536), then the core benchmark.
#   OUT=<dir> bash bench/gpu/h100_dkv_forms.sh
. bench/gpu/device_prologue.sh
device_header "$OUT/dkv_forms.log"
timeout "${PROBE_TIMEOUT:-230}" python3 bench/gpu/variants_probe.py --parts dkv-forms --shapes 64k 16k 2>&1 \
  | tee -a "$OUT/dkv_forms.log"
timeout "${TESTS_TIMEOUT:-120}" python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_triton_gpu.py 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee "$OUT/tests.log"
TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-170} SHAPES="${SHAPES:-16k 64k}" OUT="$OUT" \
  bash bench/gpu/h100_kernels.sh > /dev/null 2>&1
grep -E "NSA core|SDPA cuDNN" "$OUT/kernels.log"
date -u | tee -a "$OUT/dkv_forms.log"
