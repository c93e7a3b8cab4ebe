#!/usr/bin/env bash
# The m7c model's training step, NSA against dense, peak memory reserved and allocated: with the
# default caching allocator and with expandable segments; first the GPU tests of what decides
# the NSA layer's memory and launches (TESTS names their files, TESTS_K picks among them).
# Back in $OUT: nsa_memory_peaks.log and nsa_memory_peaks_tests.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_memory_peaks.log"
device_header "$LOG"
device_tests ${TESTS_S:-150} "$OUT/nsa_memory_peaks_tests.log" "$LOG" \
  ${TESTS:-tests/kernels/test_cudnn_compressed.py tests/kernels/test_launches.py tests/kernels/test_compile.py} \
  -k "${TESTS_K:-not nothing}"
timeout ${TABLE_S:-200} python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-32k 64k 128k} --parts model 2>&1 \
  | tee -a "$LOG"
echo "# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" | tee -a "$LOG"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout ${EXPANDABLE_S:-150} python3 bench/nsa_vs_dense.py \
  --lengths ${EXPANDABLE_LENGTHS:-32k 128k} --parts model 2>&1 | tee -a "$LOG"
