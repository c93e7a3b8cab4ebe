#!/usr/bin/env bash
# One device call (one H100, about 7 minutes): the whole NSA core with the window branch on its
# side stream against in line (bench/gpu/variants_probe.py --parts streams), the GPU kernel
# tests that run the core (parity, no host sync, side stream against in line), then the kernel
# benchmark (bench/gpu/h100_kernels.sh without its tests).
#   OUT=<dir> SHAPES="2k m7c_125m 16k 32k 64k" bash bench/gpu/h100_streams.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
{ cat SOURCE_SHA 2>/dev/null; date -u; } | tee "$OUT/streams.log"
timeout "${PROBE_TIMEOUT:-150}" python3 bench/gpu/variants_probe.py --parts streams --shapes 64k 32k 16k 2>&1 \
  | tee -a "$OUT/streams.log"
timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_triton_gpu.py 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED|assert" | tee "$OUT/tests.log"
TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-260} SHAPES="${SHAPES:-2k m7c_125m 16k 32k 64k}" OUT="$OUT" \
  bash bench/gpu/h100_kernels.sh > /dev/null 2>&1
tail -n 40 "$OUT/kernels.log"
date -u | tee -a "$OUT/streams.log"
