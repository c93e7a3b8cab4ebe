#!/usr/bin/env bash
# NSA attention as a user's model runs it, on one GPU: the GPU tests of launches, reduce-overhead and
# float32 selection; selection against the exact top-n by group size (TF32 off and on); the
# first call's compile time at a new shape per dtype. Back in $OUT: nsa_user_checks.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_user_checks.log"
device_header "$LOG"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rA tests/kernels/test_launches.py \
  tests/kernels/test_selection_exact.py 2>&1 | tail -30 | tee -a "$LOG"
timeout 90 python3 bench/selection_exactness.py --seeds 1 2>&1 | tee -a "$LOG"
timeout 260 python3 bench/first_call.py --timeout 240 2>&1 | tee -a "$LOG"
