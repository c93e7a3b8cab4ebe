#!/usr/bin/env bash
# This checkout against another one (an earlier commit's nsa/ and bench/, unpacked into OLD by
# `git archive REV nsa bench | tar -x -C _old`), on one GPU, in the same device call: the GPU
# tests named in TESTS first (none: skip), then ROUNDS rounds of the NSA layer's time split at each
# of HOST_LENGTHS (`bench/host_profile.py --layer --graph-tokens 0 $HOST_ARGS`: GPU, host and
# eager time; HOST_ARGS="--gaps" adds where the GPU waits for the host),
# this checkout and the other in turn, then `bench/nsa_vs_dense.py --parts PARTS --lengths LENGTHS`
# for each. Back in $OUT: checkout_compare.log, checkout_compare_tests.log.
. bench/gpu/device_prologue.sh
compare_start checkout_compare 240
# run_in SECONDS CHECKOUT ARGS...: python3 with CHECKOUT's nsa/ and bench/ first on the path
run_in() {
  local seconds=$1 where=$2
  shift 2
  echo "== ${where}: $*" | tee -a "$LOG"
  PYTHONPATH="$PWD/$where:$PWD" timeout "$seconds" python3 "$@" 2>&1 | tee -a "$LOG"
}
for round in $(seq ${ROUNDS:-2}); do
  for where in . "$OLD"; do
    for S in ${HOST_LENGTHS:-32k}; do
      run_in ${HOST_S:-90} "$where" "$where/bench/host_profile.py" --layer --shapes "$S" --graph-tokens 0 \
        ${HOST_ARGS:-}
    done
  done
done
for where in . "$OLD"; do
  run_in ${TABLE_S:-200} "$where" "$where/bench/nsa_vs_dense.py" --lengths ${LENGTHS:-16k 32k} \
    --parts ${PARTS:-layer host launches}
done
