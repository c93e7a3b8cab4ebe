#!/usr/bin/env bash
# One device call (one H100): the custom-op kernels under the GPU tests (parity, no host sync,
# torch.compile with inductor), then m7c_125m trainer throughput eager vs torch.compile at
# S=2048 and S=32768 with a kernel profile of the largest cells.
#   bash bench/gpu/h100_compile_probe.sh          (OUT=<dir> to choose where results go)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
LOG=$OUT/probe.log
T="python3 bench/train_throughput.py --override train.grad_accum=1"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOG"
echo "## GPU kernel tests (64k parity case skipped here)" | tee -a "$LOG"
timeout 150 python3 -m pytest -q -m gpu tests/kernels -k "not S65536" -p no:cacheprovider 2>&1 | tail -15 | tee -a "$LOG"
echo "## eager, S=2048" | tee -a "$LOG"
timeout 80 $T --batch-sizes 8 32 --seq-lens 2048 --steps 8 --warmup 3 --json "$OUT/eager.json" 2>&1 | tee -a "$LOG"
echo "## torch.compile, S=2048 (profile of 2 steps per cell)" | tee -a "$LOG"
timeout 200 $T --override train.compile=true --batch-sizes 8 32 --seq-lens 2048 --steps 8 --warmup 3 --profile 2 \
  --json "$OUT/compile.json" > "$OUT/compile_profile.txt" 2>&1
grep -E "^\||^#" "$OUT/compile_profile.txt" | tee -a "$LOG"
echo "## torch.compile, S=32768" | tee -a "$LOG"
timeout 100 $T --override train.compile=true --batch-sizes 1 --seq-lens 32768 --steps 4 --warmup 2 \
  --json "$OUT/compile32k.json" 2>&1 | grep -E "^\||^#|Error" | tee -a "$LOG"
