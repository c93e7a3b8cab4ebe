#!/usr/bin/env bash
# One NSA attention layer as a user's eager model runs it, on one GPU: where its host time goes
# (torch.profiler's ops and cProfile's Python functions, at the launch-bound lengths) and where its
# GPU time goes (the kernels by device time), then the layer against dense by length (time, host
# time, launches). Back in $OUT: nsa_layer_speed.log, nsa_host_profile.log and nsa_kernel_profile.log.
# LENGTHS (default "4k 16k 32k"), PROFILE_LENGTHS ("4k") and KERNEL_LENGTHS ("32k") choose the rows;
# PROFILE_GRAPH_TOKENS (the layer's default when unset; 0: none) whether the profiled layer is graphed.
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_layer_speed.log"
device_header "$LOG"
graphs=${PROFILE_GRAPH_TOKENS:+--graph-tokens $PROFILE_GRAPH_TOKENS}
timeout 150 python3 bench/host_profile.py --layer --shapes ${PROFILE_LENGTHS:-4k} $graphs --cprofile --rows 45 \
  >"$OUT/nsa_host_profile.log" 2>&1
timeout 100 python3 bench/host_profile.py --layer --shapes ${KERNEL_LENGTHS:-32k} $graphs --cuda --rows 40 \
  >"$OUT/nsa_kernel_profile.log" 2>&1
timeout 200 python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-4k 16k 32k} --parts layer host launches \
  --kernels 60 2>&1 | tee -a "$LOG"
