#!/usr/bin/env bash
# One device call (one H100, about 7 minutes), written for the session after the chunked dS path
# landed without a GPU run: the selected branch's GPU tests (parity S=1..65536 with dq from dS
# tiles, no host sync, deterministic backward), the selected backward with its dS tiles in 1, 4
# and 16 chunks (time and peak memory, bench/gpu/variants_probe.py --parts ds-budget), then the
# core benchmark at the long shapes.
#   OUT=<dir> bash bench/gpu/h100_ds_chunks.sh
. bench/gpu/device_prologue.sh
device_header "$OUT/ds_chunks.log"
timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_triton_gpu.py \
  tests/kernels/test_triton_selection.py tests/kernels/test_deterministic.py 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee "$OUT/tests.log"
timeout "${PROBE_TIMEOUT:-120}" python3 bench/gpu/variants_probe.py --parts ds-budget --shapes 64k 16k 2>&1 \
  | tee -a "$OUT/ds_chunks.log"
TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-200} SHAPES="${SHAPES:-16k 32k 64k}" OUT="$OUT" \
  bash bench/gpu/h100_kernels.sh > /dev/null 2>&1
grep -E "NSA core|SDPA cuDNN" "$OUT/kernels.log"
date -u | tee -a "$OUT/ds_chunks.log"
