#!/usr/bin/env bash
# The seed runbook (runbooks/nsa_ddp_a100.yaml, profile a100: `pytest -m a100`) on two GPUs, in one
# device call (nvidia-h200-x2):
#   bash bench/gpu/h200_seed_runbook.sh                    (OUT=<dir> for what comes back)
#   K="long_run or fsdp" bash bench/gpu/h200_seed_runbook.sh
#   PRIOR=results_prior.tgz K="scaling_sweep" bash bench/gpu/h200_seed_runbook.sh
# K: a pytest -k expression over the phase points (a phase selection). PRIOR: a results.tgz that an
# earlier call brought back (carry it): its store is restored first, so the new records merge into
# it (a re-run point replaces its old record) and the report covers every call. TESTS=1 (default)
# first runs the two-GPU CUDA-graph equivalence test (DDP graphed steps == eager steps). LIMIT:
# seconds before pytest is stopped (default 540).
# Carry a SOURCE_SHA stamp (bench/gpu/h100_acceptance.sh says how) so that preflight names the commit.
# Back in $OUT: pytest.log (with the wall time), the report, results.tgz (the whole store and the
# runs' evidence; no checkpoints).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_results}
mkdir -p "$OUT" "$RES"
if [ -n "${PRIOR:-}" ]; then
  tar xzf "$PRIOR" -C "$RES" && echo "restored the store of an earlier call from $PRIOR"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  date -u; } | tee "$OUT/pytest.log"
if [ "${TESTS:-1}" = 1 ]; then
  start=$(date +%s)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/integration/test_cuda_graphs.py -m multi_gpu 2>&1 \
    | tail -6 | tee -a "$OUT/pytest.log"
  echo "two-GPU graph tests took $(( $(date +%s) - start )) s" | tee -a "$OUT/pytest.log"
fi
start=$(date +%s)
timeout "${LIMIT:-540}" python3 -m pytest -m a100 -p no:cacheprovider -q --results-dir="$RES" ${K:+-k "$K"} 2>&1 \
    | tee -a "$OUT/pytest.log"
echo "pytest -m a100 took $(( $(date +%s) - start )) s" | tee -a "$OUT/pytest.log"
python3 -m validation report --runbook nsa_ddp_a100 --profile a100 --results-dir "$RES" 2>&1 | tail -3
cp "$RES"/reports/*.md "$OUT"/ 2>/dev/null
tar czf "$OUT/results.tgz" --exclude='*.pt' -C "$RES" .
ls -la "$OUT"
