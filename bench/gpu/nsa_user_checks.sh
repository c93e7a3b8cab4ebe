#!/usr/bin/env bash
# NSA attention as a user's model runs it, on one GPU: the GPU tests of launches, reduce-overhead and
# float32 selection; selection against the exact top-n by group size (TF32 off and on); the
# first call's compile time at a new shape per dtype. Back in $OUT: nsa_user_checks.log and
# nsa_user_tests.log (pytest's whole output).
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_user_checks.log"
device_header "$LOG"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA --tb=short tests/kernels/test_launches.py \
  tests/kernels/test_selection_exact.py >"$OUT/nsa_user_tests.log" 2>&1
timeout ${SELECTION_S:-60} python3 bench/selection_exactness.py --seeds 1 --tf32 off 2>&1 | tee -a "$LOG"
timeout ${FIRST_CALL_S:-200} python3 bench/first_call.py ${FIRST_CALL_ARGS:---timeout 180} 2>&1 | tee -a "$LOG"
