#!/usr/bin/env bash
# Issue 15, the selected branch's gathers through TMA descriptors (one H100, about 5 minutes):
# the selection kernels' GPU tests (bf16 parity S=1..65536 included) with TUNE['tma'] on (the
# default), then bench/gpu/variants_probe.py --parts sel-tma (pointers against TMA, forward and dq
# launches) at the long and the short shapes.
#   bash bench/gpu/h100_tma.sh        (results in $OUT: tma.log)
. bench/gpu/device_prologue.sh
device_header "$OUT/tma.log"
echo "## selection kernel tests on the GPU" | tee -a "$OUT/tma.log"
timeout 200 python3 -m pytest -q tests/kernels/test_triton_selection.py tests/kernels/test_triton_gpu.py \
  tests/kernels/test_deterministic.py -s -p no:cacheprovider 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/tma.log"
echo "## python3 bench/gpu/variants_probe.py --parts sel-tma --shapes 64k 16k 2k m7c_125m" | tee -a "$OUT/tma.log"
timeout 300 python3 bench/gpu/variants_probe.py --parts sel-tma --shapes 64k 16k 2k m7c_125m 2>&1 | tee -a "$OUT/tma.log"
