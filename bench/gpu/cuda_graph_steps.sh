#!/usr/bin/env bash
# CUDA-graph training steps on one GPU, in one device call (the nvtx part runs the h100 runbook's
# phase, whose profile names an H100):
#   bash bench/gpu/cuda_graph_steps.sh              (OUT=<dir> for what comes back)
#   PARTS="tests prod" bash bench/gpu/cuda_graph_steps.sh
# Parts (PARTS, default all, in this order):
#   tests  pytest of the graph path on the GPU (graphed steps == eager steps; failed-capture fallback)
#   prod   bench/train_throughput.py at the seed's production shape (m7c_125m, 2 rows x 2 micro-batches,
#          S=2048) with the dense-SDPA GPT of the same shape measured in the same run: eager, eager +
#          CUDA graphs, compiled + fused AdamW + CUDA graphs; each with 3 profiled steps (GPU busy)
#   mb32   micro-batch 32, no accumulation, compiled + fused AdamW + CUDA graphs, beside the dense GPT
#   nvtx   the nvtx phase of the h100 runbook (profile of the real trainer, gpu_busy_frac gate)
# Each part has its own time limit so one failure cannot eat the call. $OUT gets graphs.log and
# graphs_evidence.tgz (the JSON rows, profiler tables, nvtx records and GPU timelines).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_results}
PARTS=${PARTS:-"tests prod mb32 nvtx"}
EV=/tmp/graphs_evidence
mkdir -p "$OUT" "$EV"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/graphs.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/graphs.log"
date -u | tee -a "$OUT/graphs.log"
TP="python3 bench/train_throughput.py --seq-lens 2048 --steps 20 --warmup 3 --baseline"
for part in $PARTS; do
  start=$(date +%s)
  case $part in
    tests)
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/integration/test_cuda_graphs.py -m gpu 2>&1 \
        | tail -15 ;;
    prod)
      timeout 120 $TP --batch-sizes 2 --json "$EV/prod_eager.json" 2>&1 | grep '^|\|^#'
      timeout 120 $TP --batch-sizes 2 --cuda-graphs --profile 3 --json "$EV/prod_graphs.json" 2>&1 \
        | grep '^| \(nsa\|dense\)\|^# \(device\|config\|NSA\)'
      timeout 240 $TP --batch-sizes 2 --cuda-graphs --profile 3 --json "$EV/prod_compiled_graphs.json" \
        --override "train.compile=true" --override "train.fused_adamw=true" 2>&1 \
        | tee "$EV/prod_compiled_graphs_profile.txt" | grep '^| \(nsa\|dense\)\|^# \(device\|config\|NSA\)' ;;
    mb32)
      timeout 240 $TP --batch-sizes 32 --cuda-graphs --json "$EV/mb32_graphs.json" --override "train.grad_accum=1" \
        --override "train.compile=true" --override "train.fused_adamw=true" 2>&1 | grep '^| \(nsa\|dense\)\|^# config' ;;
    nvtx)
      timeout 300 python3 -m pytest -m h100 -k nvtx -p no:cacheprovider -q --results-dir "$RES" 2>&1 | tail -8
      python3 -m validation report --runbook h100_single --profile h100 --results-dir "$RES" 2>&1 | tail -2
      cp -r "$RES"/runs/h100_single/h100/nvtx "$RES"/reports "$EV"/ 2>/dev/null ;;
  esac 2>&1 | tee -a "$OUT/graphs.log"
  echo "== part $part took $(( $(date +%s) - start )) s" | tee -a "$OUT/graphs.log"
done
tar czf "$OUT/graphs_evidence.tgz" --exclude='*.pt' --exclude='trainer/checkpoint*' -C "$EV" .
ls -la "$OUT"
