#!/usr/bin/env bash
# Float32 on one GPU: the kernels' selection against the exact top-n (tests, then the table by
# group size and where the scores err), the shape matrix's float32 cases, the first call at a new
# shape in float32 and bf16, and the core's per-kernel times (the top-n among them).
# Back in $OUT: fp32_checks.log and fp32_tests.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/fp32_checks.log"
device_header "$LOG"
timeout ${TESTS_S:-240} python3 -m pytest -q -p no:cacheprovider -rA --tb=short tests/kernels/test_selection_exact.py \
  tests/kernels/test_triton_topk.py tests/kernels/test_shape_matrix.py -k "${TESTS_K:-not bf16 and not fp16}" \
  >"$OUT/fp32_tests.log" 2>&1
grep -E "passed|failed|^FAILED|\[tf32\]" "$OUT/fp32_tests.log" | tail -12 | tee -a "$LOG"
timeout ${TABLE_S:-120} python3 bench/selection_exactness.py --seeds 1 --tf32 off 2>&1 | tee -a "$LOG"
timeout ${EXPLAIN_S:-60} python3 bench/selection_exactness.py --explain --groups 2 --seeds 1 --tf32 off 2>&1 | tee -a "$LOG"
timeout ${FIRST_S:-150} python3 bench/first_call.py --heads m7c --dtypes ${FIRST_DTYPES:-fp32 bf16} --jobs 2 --timeout 140 \
  2>&1 | tee -a "$LOG"
timeout ${BREAKDOWN_S:-120} python3 bench/bench_nsa.py --breakdown --ops nsa_core sdpa_cudnn --shapes ${SHAPES:-m7c@16k m7c@64k} \
  2>&1 | tee -a "$LOG"
