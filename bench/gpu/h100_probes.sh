#!/usr/bin/env bash
# The kernel probes of issue 15 in one device call (one H100, about 7 minutes): whether the
# selected forward/dq are bound by the K/V gather (sel_locality_probe.py), and launch variants of
# the selected backward and the window kernels (variants_probe.py).
#   OUT=<dir> SHAPES="64k 16k" bash bench/gpu/h100_probes.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
SHAPES=${SHAPES:-64k 16k}
mkdir -p "$OUT"
{ cat SOURCE_SHA 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } \
  | tee "$OUT/probes.log"
timeout "${LOCALITY_TIMEOUT:-150}" python3 bench/gpu/sel_locality_probe.py --shapes $SHAPES 2>&1 | tee "$OUT/locality.log"
timeout "${VARIANTS_TIMEOUT:-380}" python3 bench/gpu/variants_probe.py --shapes $SHAPES 2>&1 | tee "$OUT/variants.log"
date -u | tee -a "$OUT/probes.log"
