#!/usr/bin/env bash
# Golden loss curves of the h100 runbook's deterministic points on one H100, in one device call:
#   bash bench/gpu/golden_losses.sh        (OUT=<dir> for what comes back; RUNS=3; LIMIT=<s per run>)
# Runs the phases with golden_steps of runbooks/h100_single.yaml (the `determinism` phase:
# m7c_125m at the production shape, train.deterministic=true, 30 steps) RUNS times on the same
# commit, each into a results directory of its own; prints the run-to-run spread of the per-step
# loss (max abs and rel difference per point, bench/gpu/loss_spread.py), the evidence for the
# h100 profile's golden_loss_rtol; then blesses goldens from the first run
# (`nsa-validate bless`) into runbooks/goldens/h100_single__h100.yaml, copied to $OUT for the
# lead to commit. Expected: about 1 minute per run (model build, 2 eager steps, graph capture,
# 30 steps), well under 6 minutes in all. Each run's report is INCOMPLETE (no golden yet, and
# golden_loss_rtol is null until the spread is known): that is expected.
# The device copy has no .git, or a stale one: before the call run
# `git describe --always --dirty --abbrev=40 > SOURCE_SHA` here and carry SOURCE_SHA, so that the
# golden names its commit (as for the other scripts here).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_goldens}
PHASES=$(python3 bench/gpu/loss_spread.py --runbook h100_single --profile h100 --golden-phases) || exit 1
[ -n "$PHASES" ] || { echo "runbooks/h100_single.yaml has no phase with golden_steps" >&2; exit 1; }
mkdir -p "$OUT"
rm -rf "$RES"
start=$(date +%s)
for i in $(seq 1 "${RUNS:-3}"); do
    echo "== run $i: nsa-validate run --runbook h100_single --profile h100 $PHASES"
    # shellcheck disable=SC2086  # PHASES is a list of options
    timeout "${LIMIT:-150}" python3 -m validation run --runbook h100_single --profile h100 $PHASES \
        --results-dir "$RES/run$i" --no-plots 2>&1 | grep -v '^  \.\.\. ' | tee "$OUT/run$i.log"
done
echo "== runs took $(( $(date +%s) - start )) s"
echo "== run-to-run spread of the per-step loss (same commit, ${RUNS:-3} runs)"
python3 bench/gpu/loss_spread.py --runbook h100_single --profile h100 "$RES"/run* 2>&1 | tee "$OUT/spread.txt"
echo "== bless from run 1"
python3 -m validation bless --runbook h100_single --profile h100 --results-dir "$RES/run1" 2>&1 | tee "$OUT/bless.log"
cp runbooks/goldens/h100_single__h100.yaml "$OUT/" 2>/dev/null
tar czf "$OUT/evidence.tgz" --exclude='*.pt' -C "$RES" . 2>/dev/null
ls -la "$OUT"
