#!/usr/bin/env bash
# One NSA attention layer as a user's eager model runs it, on one GPU: where its host time goes
# (torch.profiler's ops and cProfile's Python functions, at the launch-bound lengths), then the
# layer against dense by length (time, host time, launches). Back in $OUT: nsa_layer_speed.log and
# nsa_host_profile.log. LENGTHS (default "4k 16k 32k") and PROFILE_LENGTHS ("4k") choose the rows.
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_layer_speed.log"
device_header "$LOG"
timeout 150 python3 bench/host_profile.py --layer --shapes ${PROFILE_LENGTHS:-4k} --cprofile --rows 45 \
  >"$OUT/nsa_host_profile.log" 2>&1
timeout 200 python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-4k 16k 32k} --parts layer host launches \
  --kernels 60 2>&1 | tee -a "$LOG"
