#!/usr/bin/env bash
# One device call (one H100, under 9 minutes): the selected backward with dq from dS tiles
# against the dq kernel, the window's tile variants (bench/gpu/variants_probe.py), and the kernel
# tests that cover the selected branch on the GPU (bf16 parity S=1..65536, no host sync,
# deterministic backward).
#   OUT=<dir> SHAPES="64k 16k" bash bench/gpu/h100_sel_win.sh
. bench/gpu/device_prologue.sh
SHAPES=${SHAPES:-64k 16k}
device_header "$OUT/sel_win.log"
timeout "${PROBE_TIMEOUT:-300}" python3 bench/gpu/variants_probe.py --shapes $SHAPES 2>&1 | tee "$OUT/variants.log"
timeout "${TESTS_TIMEOUT:-230}" python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_triton_gpu.py \
  tests/kernels/test_deterministic.py tests/kernels/test_triton_selection.py 2>&1 \
  | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee "$OUT/tests.log"
date -u | tee -a "$OUT/sel_win.log"
