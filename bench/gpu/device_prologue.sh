# Sourced by bench/gpu/*.sh device scripts: strict mode, the repository on PYTHONPATH, OUT (where
# results go: $OUT on the device machine, .device_out here) and a log's header (the commit in
# SOURCE_SHA, the GPU, the date).
#   . bench/gpu/device_prologue.sh; device_header "$OUT/name.log"
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"

device_header() {
  { cat SOURCE_SHA 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } \
    | tee "$1"
}

# device_tests SECONDS TEST_LOG LOG PYTEST_ARGS...: the GPU tests, their output in TEST_LOG and
# their summary lines appended to LOG
device_tests() {
  local seconds=$1 test_log=$2 log=$3
  shift 3
  timeout "$seconds" python3 -m pytest -q -p no:cacheprovider -rA --tb=short "$@" >"$test_log" 2>&1
  grep -E "passed|failed|^FAILED" "$test_log" | tail -6 | tee -a "$log"
}

# compare_start NAME TESTS_SECONDS: for a script that times this checkout against an earlier one
# (OLD, default _old: `git archive REV nsa | tar -x -C OLD && cp -r bench OLD/bench`), LOG =
# $OUT/NAME.log with its header, OLD checked, then the GPU tests named in TESTS (none: skip;
# TESTS_K selects among them; TESTS_S seconds, default TESTS_SECONDS) into $OUT/NAME_tests.log
compare_start() {
  LOG="$OUT/$1.log"
  OLD=${OLD:-_old}
  device_header "$LOG"
  [ -d "$OLD/nsa" ] || { echo "no earlier checkout in $OLD (git archive REV nsa | tar -x -C $OLD && cp -r bench $OLD/bench)" \
    | tee -a "$LOG"; exit 2; }
  if [ "${TESTS:-none}" != "none" ]; then
    device_tests ${TESTS_S:-$2} "$OUT/$1_tests.log" "$LOG" $TESTS ${TESTS_K:+-k "$TESTS_K"}
  fi
}
