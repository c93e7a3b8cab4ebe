#!/usr/bin/env bash
# Issue 15, what bounds the long-context kernels (one H100, about 5 minutes):
# bench/gpu/bounds_probe.py (the selected forward against its gather alone; cuDNN's
# grouped-query attention for the compressed branch; the dk/dv pass with and without its dS
# tiles), then bench/gpu/core_profile.py (the core's kernels by GPU time, glue included).
#   bash bench/gpu/h100_bounds.sh        (results in $OUT: bounds.log)
. bench/gpu/device_prologue.sh
device_header "$OUT/bounds.log"
echo "## python3 bench/gpu/bounds_probe.py --shapes 16k 64k" | tee -a "$OUT/bounds.log"
timeout 330 python3 bench/gpu/bounds_probe.py --shapes 16k 64k 2>&1 | tee -a "$OUT/bounds.log"
echo "## python3 bench/gpu/core_profile.py --shapes 16k 64k --top 24" | tee -a "$OUT/bounds.log"
timeout 150 python3 bench/gpu/core_profile.py --shapes 16k 64k --top 24 2>&1 | tee -a "$OUT/bounds.log"
