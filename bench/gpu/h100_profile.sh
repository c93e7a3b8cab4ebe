#!/usr/bin/env bash
# One device call (one H100, about 3 minutes): the NSA core's kernels by GPU time per
# forward+backward (bench/gpu/core_profile.py) and the selected forward at two and four tokens a
# program on random selections (bench/gpu/sel_locality_probe.py --random-tt).
#   OUT=<dir> bash bench/gpu/h100_profile.sh
. bench/gpu/device_prologue.sh
device_header "$OUT/profile.log"
timeout "${PROFILE_TIMEOUT:-200}" python3 bench/gpu/core_profile.py --shapes 16k 64k 2>&1 | tee -a "$OUT/profile.log"
timeout "${LOCALITY_TIMEOUT:-120}" python3 bench/gpu/sel_locality_probe.py --shapes 16k 64k --random-tt 2 4 2>&1 \
  | tee "$OUT/locality.log"
date -u | tee -a "$OUT/profile.log"
