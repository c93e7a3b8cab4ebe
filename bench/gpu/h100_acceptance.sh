#!/usr/bin/env bash
# The single-GPU acceptance on one H100 through pytest, in one device call:
#   bash bench/gpu/h100_acceptance.sh        (OUT=<dir> for what comes back)
#   K="preflight or nvtx or long_run" LIMIT=400 bash bench/gpu/h100_acceptance.sh
#       (K: a pytest -k expression over the phase points, to split the acceptance over calls that
#        each must end within the device's 10 minutes; LIMIT: seconds before pytest is stopped)
# Runs `pytest -m h100` (runbooks/h100_single.yaml, profile h100) against the real trainer, then
# re-renders the report from the store (so a run cut short still leaves a report) and packs the
# evidence (CSVs, heartbeats, env.json, logs, plots; no checkpoints) into one archive. The device
# copy has no .git, or a stale one: before the call run
# `git describe --always --dirty --abbrev=40 > SOURCE_SHA` here and carry SOURCE_SHA, so that
# preflight records the commit (it prefers the stamp over a .git that lacks the stamp's commit).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_results}
mkdir -p "$OUT"
start=$(date +%s)
timeout "${LIMIT:-540}" python3 -m pytest -m h100 -p no:cacheprovider -q --results-dir="$RES" ${K:+-k "$K"} 2>&1 \
    | tee "$OUT/pytest.log"
echo "pytest -m h100 took $(( $(date +%s) - start )) s" | tee -a "$OUT/pytest.log"
python3 -m validation report --runbook h100_single --profile h100 --results-dir "$RES" 2>&1 | tail -3
cp "$RES"/reports/*.md "$OUT"/ 2>/dev/null
tar czf "$OUT/evidence.tgz" --exclude='*.pt' -C "$RES" . 2>/dev/null
ls -la "$OUT"
