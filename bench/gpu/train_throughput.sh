#!/usr/bin/env bash
# Trainer throughput of m7c_125m on one GPU (issue 4's single-GPU numbers), in one device call:
#   bash bench/gpu/train_throughput.sh        (OUT=<dir> to choose where results go)
# The fast configuration is torch.compile (per block; the Triton kernels are opaque custom ops)
# with fused AdamW; the production shape is also run eagerly for comparison. Each step has its
# own timeout so the whole call stays under 10 minutes; a step that times out or fails leaves
# the others' results.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
LOG=$OUT/throughput.log
T="python3 bench/train_throughput.py"
FAST="--override train.compile=true --override train.fused_adamw=true"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"
echo "## production shape (2 rows x 2 accumulation, S=2048): eager, then compiled" | tee -a "$LOG"
timeout 60 $T --batch-sizes 2 --seq-lens 2048 --steps 20 --warmup 5 --json "$OUT/prod_eager.json" 2>&1 | tee -a "$LOG"
timeout 100 $T $FAST --batch-sizes 2 --seq-lens 2048 --steps 20 --warmup 5 --json "$OUT/prod.json" 2>&1 | tee -a "$LOG"
echo "## micro-batch sweep at S=2048 (no accumulation), compiled: best micro-batch, cliff check" | tee -a "$LOG"
timeout 170 $T $FAST --override train.grad_accum=1 --batch-sizes 1 2 4 8 16 32 --seq-lens 2048 --steps 8 --warmup 3 \
  --json "$OUT/batch2048.json" 2>&1 | tee -a "$LOG"
echo "## 32k tokens per step at S=8192 and S=32768, compiled (memory at fixed tokens per step)" | tee -a "$LOG"
timeout 90 $T $FAST --override train.grad_accum=1 --batch-sizes 4 --seq-lens 8192 --steps 5 --warmup 2 \
  --json "$OUT/s8k.json" 2>&1 | tee -a "$LOG"
timeout 90 $T $FAST --override train.grad_accum=1 --batch-sizes 1 --seq-lens 32768 --steps 5 --warmup 2 \
  --json "$OUT/s32k.json" 2>&1 | tee -a "$LOG"
echo "## dense SDPA GPT baseline of the same shape at S=2048, batch 16, compiled" | tee -a "$LOG"
timeout 80 $T $FAST --override train.grad_accum=1 --batch-sizes 16 --seq-lens 2048 --steps 8 --warmup 3 --baseline \
  --json "$OUT/baseline.json" 2>&1 | tee -a "$LOG"
