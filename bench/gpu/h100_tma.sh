#!/usr/bin/env bash
# Issue 15, K/V tiles through TMA descriptors (one H100, about 6 minutes): the GPU tests of the
# kernels that use them (selection, window, compressed band; bf16 parity S=1..65536), then
# bench/gpu/variants_probe.py --parts ${PARTS:-sel-tma band-tma} (pointers against TMA).
#   bash bench/gpu/h100_tma.sh        (results in $OUT: tma.log)
# Its first run (commit 344fb95, docs/measurements/2026-11-23-f/tma_344fb95.log) had the
# selection tests with tests/kernels/test_deterministic.py and the sel-tma part alone.
. bench/gpu/device_prologue.sh
device_header "$OUT/tma.log"
echo "## kernel tests on the GPU" | tee -a "$OUT/tma.log"
timeout 240 python3 -m pytest -q tests/kernels/test_triton_selection.py tests/kernels/test_triton_gpu.py \
  tests/kernels/test_triton_window.py tests/kernels/test_triton_compressed.py -s -p no:cacheprovider 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/tma.log"
echo "## python3 bench/gpu/variants_probe.py --parts ${PARTS:-sel-tma band-tma} --shapes 64k 16k 2k m7c_125m" \
  | tee -a "$OUT/tma.log"
timeout 300 python3 bench/gpu/variants_probe.py --parts ${PARTS:-sel-tma band-tma} --shapes 64k 16k 2k m7c_125m 2>&1 \
  | tee -a "$OUT/tma.log"
