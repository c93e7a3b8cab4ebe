#!/usr/bin/env bash
# Where a GPU test's illegal memory access comes from: the pytest selection again with every
# launch synchronous (CUDA_LAUNCH_BLOCKING=1, the traceback then names the launch that faulted),
# then under compute-sanitizer's memcheck where the image has it (the kernel, the address and the
# thread of the first bad access).
#   SELECT="tests/kernels/test_triton_layer.py -k mlp-G5" bash bench/gpu/memcheck.sh
. bench/gpu/device_prologue.sh
: "${SELECT:?SELECT names the tests (pytest arguments), e.g. SELECT=\"tests/kernels/test_x.py -k case\"}"
LOG=$OUT/memcheck.log
device_header "$LOG"
# shellcheck disable=SC2086
CUDA_LAUNCH_BLOCKING=1 timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -x --tb=long $SELECT \
    > "$OUT/memcheck_blocking.log" 2>&1
echo "blocking launches: exit $?" | tee -a "$LOG"
grep -E "^E |passed|failed|^nsa/|^tests/" "$OUT/memcheck_blocking.log" | tail -30 | tee -a "$LOG"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SANITIZER" ]; then
  # shellcheck disable=SC2086
  timeout "${SANITIZER_S:-300}" "$SANITIZER" --tool memcheck --print-limit 5 python3 -m pytest -q \
      -p no:cacheprovider -x $SELECT > "$OUT/memcheck_sanitizer.log" 2>&1
  echo "compute-sanitizer: exit $?" | tee -a "$LOG"
  grep -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY|passed|failed" "$OUT/memcheck_sanitizer.log" | head -30 \
      | tee -a "$LOG"
else
  echo "compute-sanitizer: not in this image" | tee -a "$LOG"
fi
