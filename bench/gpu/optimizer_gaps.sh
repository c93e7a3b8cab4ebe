#!/usr/bin/env bash
# Where a graphed training step leaves the GPU idle, in one device call (one GPU): the h100
# runbook's nvtx point (m7c_125m at the production shape, 16 steps, the last 10 under the
# profiler, CUDA-graph steps) run by the trainer directly for each optimizer setting in OPTIMS
# (default: unfused and fused AdamW) and each COMPILE value (default: true), then the idle gaps
# of each run's gpu_timeline.json.gz: idle ms per step, by gap length, and the largest gaps'
# offsets within a step.
#   bash bench/gpu/optimizer_gaps.sh                 (OUT=<dir>; OPTIMS="false true"; COMPILE="true")
. bench/gpu/device_prologue.sh
LOG=$OUT/optimizer_gaps.log
device_header "$LOG"
for compile in ${COMPILE:-true}; do
  for fused in ${OPTIMS:-false true}; do
    run=$OUT/compile_${compile}_fused_${fused}
    echo "## train.compile=$compile train.fused_adamw=$fused" | tee -a "$LOG"
    CONTRACT_PROFILE_STEPS=10 NSA_NVTX=1 NSA_TB_DISABLE=1 NSA_DISABLE_AUX_STATS=1 timeout 240 \
      python3 -m nsa.train --config m7c_125m --steps 16 --out-dir "$run" --override \
      "data.dataset=synthetic dist.mode=single train.save_final=false train.compile=$compile train.fused_adamw=$fused" \
      > "$run.log" 2>&1 || echo "trainer exited $?" | tee -a "$LOG"
    python3 bench/gpu/timeline_gaps.py "$run" 2>&1 | tee -a "$LOG"
  done
done
