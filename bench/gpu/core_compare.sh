#!/usr/bin/env bash
# The NSA core of this checkout against another one (an earlier commit's nsa/ and bench/, unpacked
# into OLD by `git archive REV nsa | tar -x -C OLD && cp -r bench OLD/bench`), on one GPU, in the
# same device call: the GPU tests named in TESTS first (none: skip; TESTS_K selects among them),
# then `bench/bench_nsa.py --shapes SHAPES --ops sdpa_cudnn nsa_core` for this checkout and the
# other in turn (ratios against cuDNN of the same process), then where the GPU waits for the host
# in this checkout's layer without graphs at GAPS_LENGTH (`bench/host_profile.py --gaps`).
# Back in $OUT: core_compare.log, core_compare_tests.log.
. bench/gpu/device_prologue.sh
compare_start core_compare 200
for where in . "$OLD"; do
  echo "== ${where}: bench_nsa.py --shapes ${SHAPES:-m7c@32k 32k}" | tee -a "$LOG"
  PYTHONPATH="$PWD/$where:$PWD" timeout ${BENCH_S:-150} python3 "$where/bench/bench_nsa.py" \
    --shapes ${SHAPES:-m7c@32k 32k} --ops sdpa_cudnn nsa_core 2>&1 | grep -v Warning | tee -a "$LOG"
done
if [ -n "${GAPS_LENGTH:-}" ]; then
  timeout 90 python3 bench/host_profile.py --layer --shapes "$GAPS_LENGTH" --graph-tokens 0 --gaps 2>&1 \
    | grep -v Warning | tee -a "$LOG"
fi
