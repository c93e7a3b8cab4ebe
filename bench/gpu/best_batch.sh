#!/usr/bin/env bash
# Best micro-batch of m7c_125m at S=2048 on one GPU, timed longer than the sweep in
# train_throughput.sh (30 timed steps after 5 warm-up steps per cell; compiled, fused
# AdamW, no accumulation), with the kernel tests first (KTESTS=0 skips them):
#   bash bench/gpu/best_batch.sh        (OUT=<dir>; BATCHES="16 32 64")
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
LOG=$OUT/best_batch.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"
cat SOURCE_SHA 2>/dev/null | sed 's/^/source: /' | tee -a "$LOG"
if [ "${KTESTS:-1}" != 0 ]; then
  echo "## pytest -q tests/kernels on the GPU" | tee -a "$LOG"
  timeout 330 python3 -m pytest -q tests/kernels -p no:cacheprovider 2>&1 | tail -4 | tee -a "$LOG"
fi
echo "## S=2048, compiled + fused AdamW, micro-batches ${BATCHES:-16 32 64}" | tee -a "$LOG"
timeout 200 python3 bench/train_throughput.py --override train.compile=true --override train.fused_adamw=true \
  --override train.grad_accum=1 --batch-sizes ${BATCHES:-16 32 64} --seq-lens 2048 --steps 30 --warmup 5 \
  --json "$OUT/best_batch.json" 2>&1 | tee -a "$LOG"
