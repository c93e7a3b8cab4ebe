#!/usr/bin/env bash
# The window branch on its routes at SHAPES (default m7c@32k m7c@64k): the band kernel against
# FlexAttention's sliding window and dense SDPA cuDNN (bench_nsa.py, forward and forward +
# backward), then the NSA layer against dense with the window on each route (nsa_vs_dense.py
# at LENGTHS). Back in $OUT: window_routes.log.
. bench/gpu/device_prologue.sh
log="$OUT/window_routes.log"
device_header "$log"
timeout ${OPS_S:-150} python3 bench/bench_nsa.py --shapes ${SHAPES:-m7c@32k m7c@64k} --ops win flex_window sdpa_cudnn \
  2>&1 | tee -a "$log"
for route in triton flex; do
  timeout ${LAYER_S:-120} python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-32k 64k} --parts layer \
    --nsa-set model.attn.backend_win=$route 2>&1 | grep -v "^W1" | tee -a "$log"
done
