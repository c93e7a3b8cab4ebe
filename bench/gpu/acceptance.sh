#!/usr/bin/env bash
# An acceptance run through pytest, as a user types it, in one device call:
#   MARK=h100 bash bench/gpu/acceptance.sh                 (one H100: h100_single, long_context_h100)
#   MARK=a100 TESTS=1 bash bench/gpu/acceptance.sh         (two GPUs: the seed runbook, nsa_ddp_a100)
#   MARK=h100 K="nvtx or long_context" LIMIT=500 bash bench/gpu/acceptance.sh
#   MARK=h100 PRIOR=results_prior.tgz K="not nvtx" bash bench/gpu/acceptance.sh
# MARK: the profile marker (`pytest -m MARK`: every runbook with that profile). K: a pytest -k
# expression over the phase points, to split a run over calls that each end within the device's
# 10 minutes. PRIOR: a results.tgz an earlier call brought back (carry it): its store is restored
# first, so the new records merge into it (a re-run point replaces its old record) and the reports
# cover every call. TESTS=1 first runs the two-GPU CUDA-graph equivalence test (DDP graphed steps
# == eager steps). LIMIT: seconds before pytest is stopped (default 540).
# The device copy has no .git, or a stale one: before the call run
#   git describe --always --dirty --abbrev=40 > SOURCE_SHA
# here and carry SOURCE_SHA, so that preflight and the trainer record the commit.
# Back in $OUT: pytest.log (with the wall time), the reports, results.tgz (the whole store and the
# runs' evidence; no checkpoints).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MARK=${MARK:?set MARK to the profile marker, e.g. MARK=h100}
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_results}
mkdir -p "$OUT" "$RES"
if [ -n "${PRIOR:-}" ]; then
  tar xzf "$PRIOR" -C "$RES" && echo "restored the store of an earlier call from $PRIOR"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  date -u; } | tee "$OUT/pytest.log"
if [ "${TESTS:-0}" = 1 ]; then
  start=$(date +%s)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/integration/test_cuda_graphs.py -m multi_gpu 2>&1 \
    | tail -6 | tee -a "$OUT/pytest.log"
  echo "two-GPU graph tests took $(( $(date +%s) - start )) s" | tee -a "$OUT/pytest.log"
fi
start=$(date +%s)
timeout "${LIMIT:-540}" python3 -m pytest -m "$MARK" -p no:cacheprovider -q --results-dir="$RES" ${K:+-k "$K"} 2>&1 \
    | tee -a "$OUT/pytest.log"
echo "pytest -m $MARK took $(( $(date +%s) - start )) s" | tee -a "$OUT/pytest.log"
python3 -m validation report --profile "$MARK" --results-dir "$RES" 2>&1 | tail -4 | tee -a "$OUT/pytest.log"
cp "$RES"/reports/*.md "$OUT"/ 2>/dev/null
tar czf "$OUT/results.tgz" --exclude='*.pt' -C "$RES" .
ls -la "$OUT"
