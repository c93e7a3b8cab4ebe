#!/usr/bin/env bash
# Issue 15, K/V blocks through TMA descriptors (one H100, about 5 minutes): the GPU tests of the
# selection and band kernels (bf16 parity S=1..65536), then bench/gpu/variants_probe.py
# --parts sel-tma (pointers against TMA).
#   bash bench/gpu/h100_tma.sh        (results in $OUT: tma.log)
# Its runs: commit 344fb95 (docs/measurements/2026-11-23-f/tma_344fb95.log) with the selection
# tests and tests/kernels/test_deterministic.py; commit 3f671dd (tma_3f671dd.log) also with
# the band kernels' TMA loads and a part band-tma timing them (both removed since, see
# variants_probe.py).
. bench/gpu/device_prologue.sh
device_header "$OUT/tma.log"
echo "## kernel tests on the GPU" | tee -a "$OUT/tma.log"
timeout 240 python3 -m pytest -q tests/kernels/test_triton_selection.py tests/kernels/test_triton_gpu.py \
  tests/kernels/test_triton_window.py tests/kernels/test_triton_compressed.py -s -p no:cacheprovider 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/tma.log"
echo "## python3 bench/gpu/variants_probe.py --parts sel-tma --shapes 64k 16k 2k m7c_125m" \
  | tee -a "$OUT/tma.log"
timeout 300 python3 bench/gpu/variants_probe.py --parts sel-tma --shapes 64k 16k 2k m7c_125m 2>&1 \
  | tee -a "$OUT/tma.log"
