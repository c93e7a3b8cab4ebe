#!/usr/bin/env bash
# Trainer throughput of m7c_125m on one GPU (issue 4's single-GPU numbers), in one device call:
#   bash bench/gpu/h100_train_throughput.sh        (OUT=<dir> to choose where results go)
# Each step has its own timeout so the whole call stays under 10 minutes; a step that times out
# or fails leaves the others' results.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
LOG=$OUT/throughput.log
T="python3 bench/train_throughput.py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOG"
echo "## production shape (2 rows x 2 accumulation, S=2048): the basis of the h100 profile" | tee -a "$LOG"
timeout 120 $T --batch-sizes 2 --seq-lens 2048 --steps 20 --warmup 5 --json "$OUT/prod.json" 2>&1 | tee -a "$LOG"
echo "## micro-batch sweep at S=2048 (no accumulation): best micro-batch, cliff check" | tee -a "$LOG"
timeout 170 $T --override train.grad_accum=1 --batch-sizes 1 2 4 8 16 32 --seq-lens 2048 --steps 10 --warmup 3 \
  --json "$OUT/batch2048.json" 2>&1 | tee -a "$LOG"
echo "## 32k tokens per step at S=8192 and S=32768 (memory at fixed tokens per step; long context)" | tee -a "$LOG"
timeout 90 $T --override train.grad_accum=1 --batch-sizes 4 --seq-lens 8192 --steps 5 --warmup 2 \
  --json "$OUT/s8k.json" 2>&1 | tee -a "$LOG"
timeout 90 $T --override train.grad_accum=1 --batch-sizes 1 --seq-lens 32768 --steps 5 --warmup 2 \
  --json "$OUT/s32k.json" 2>&1 | tee -a "$LOG"
echo "## dense SDPA GPT baseline of the same shape at S=2048, batch 16" | tee -a "$LOG"
timeout 80 $T --override train.grad_accum=1 --batch-sizes 16 --seq-lens 2048 --steps 10 --warmup 3 --baseline \
  --json "$OUT/baseline.json" 2>&1 | tee -a "$LOG"
