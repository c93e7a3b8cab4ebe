#!/usr/bin/env bash
# Every single-GPU test of the unit, kernel and integration suites in one device call (the
# acceptance runbooks and the two-GPU tests have scripts of their own: acceptance.sh,
# nccl_faults.sh): what CPU CI skips. With 4 workers on one H100, 177 of its 275 tests (at 7c673ed)
# ran in 331 s: the whole set needs most of a call's ten minutes.
#   bash bench/gpu/gpu_tests.sh                 # WORKERS (4), TESTS_S (540) to change
# $OUT/gpu_tests.log holds pytest's output; the summary and each failure's line are printed.
. bench/gpu/device_prologue.sh
LOG=$OUT/gpu_tests_summary.log
device_header "$LOG"
device_tests "${TESTS_S:-540}" "$OUT/gpu_tests.log" "$LOG" -n "${WORKERS:-4}" --durations=10 \
    tests/kernels tests/integration/test_cuda_graphs.py tests/unit/test_train_profile.py \
    tests/unit/test_train_memory.py tests/unit/test_backend_ran.py \
    "tests/faults/test_rank_faults.py::test_out_of_memory_on_cuda"
