#!/usr/bin/env bash
# What the NSA layer's recomputation from compress.RECOMPUTE_TOKENS costs in time and saves in
# memory, on one GPU: the GPU tests of what it remakes, the layer and model against dense with
# it (bench/nsa_vs_dense.py), the layer without it (--recompute-tokens above the lengths), where
# the layer's host time goes at 32k (bench/host_profile.py --layer --cprofile) and what the layer
# keeps per token (bench/saved_memory.py).
# Back in $OUT: recompute.log, recompute_tests.log and host_profile.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/recompute.log"
device_header "$LOG"
device_tests ${TESTS_S:-150} "$OUT/recompute_tests.log" "$LOG" tests/kernels/test_gated_branches.py \
  tests/kernels/test_cudnn_compressed.py tests/kernels/test_launches.py -k "${TESTS_K:-remakes or cudnn or launch}"
timeout ${TABLE_S:-200} python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-32k 64k 128k} --parts ${PARTS:-layer host model} \
  2>&1 | tee -a "$LOG"
echo "# without the recomputation" | tee -a "$LOG"
timeout ${OFF_S:-90} python3 bench/nsa_vs_dense.py --lengths ${OFF_LENGTHS:-32k 128k} --parts layer host \
  --recompute-tokens 1024k 2>&1 | tee -a "$LOG"
timeout ${SAVED_S:-60} python3 bench/saved_memory.py --lengths 32k --parts layer 2>&1 | tee -a "$LOG"
timeout ${PROFILE_S:-60} python3 bench/host_profile.py --layer --shapes 32k --cprofile --rows ${ROWS:-30} \
  >"$OUT/host_profile.log" 2>&1
head -c 400 "$OUT/host_profile.log" | tee -a "$LOG"
