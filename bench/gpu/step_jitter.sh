#!/usr/bin/env bash
# Slow steps of a steady run on one GPU (bench/step_jitter.py): the seeds' model at S=4k, dense and
# NSA, on the standard library's text and on synthetic tokens, RUNS runs each, STEPS steps.
#   bash bench/gpu/step_jitter.sh
. bench/gpu/device_prologue.sh
LOG=$OUT/step_jitter.log
device_header "$LOG"
for kind in dense nsa; do
  timeout "${JITTER_TIMEOUT:-200}" python3 bench/step_jitter.py --seq-len "${SEQ_LEN:-4096}" --kind "$kind" \
    --steps "${STEPS:-40}" --runs "${RUNS:-2}" 2>&1 | tee -a "$LOG"
done
