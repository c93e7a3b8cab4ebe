#!/usr/bin/env bash
# The kernel probes of issue 15 in one device call (one H100, about 7 minutes): whether the
# selected forward/dq are bound by the K/V gather (sel_locality_probe.py), and launch variants of
# the selected backward and the window kernels (variants_probe.py).
#   OUT=<dir> SHAPES="64k 16k" bash bench/gpu/h100_probes.sh
. bench/gpu/device_prologue.sh
SHAPES=${SHAPES:-64k 16k}
device_header "$OUT/probes.log"
timeout "${LOCALITY_TIMEOUT:-150}" python3 bench/gpu/sel_locality_probe.py --shapes $SHAPES 2>&1 | tee "$OUT/locality.log"
timeout "${VARIANTS_TIMEOUT:-380}" python3 bench/gpu/variants_probe.py --shapes $SHAPES 2>&1 | tee "$OUT/variants.log"
date -u | tee -a "$OUT/probes.log"
