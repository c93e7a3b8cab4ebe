#!/usr/bin/env bash
# The kernel evidence of issue 3 in one device call (one H100): every kernel test on the GPU
# (bf16 parity S=1..65536, the interpreter suites on CUDA, no host sync, torch.compile), then the
# benchmark table with the per-stage breakdown, fla-core included when its wheel is in .whl/.
#   bash bench/gpu/h100_kernels.sh          (OUT=<dir> to choose where results go)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
ls .whl/fla_core-*.whl >/dev/null 2>&1 && pip install -q --no-deps .whl/fla_core-*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/kernels.log"
echo "## kernel tests on the GPU" | tee -a "$OUT/kernels.log"
timeout 240 python3 -m pytest -q tests/kernels -s -p no:cacheprovider 2>&1 | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/kernels.log"
echo "## benchmark (python bench/bench_nsa.py --breakdown)" | tee -a "$OUT/kernels.log"
timeout 330 python3 bench/bench_nsa.py --breakdown --json "$OUT/bench.json" 2>&1 | tee -a "$OUT/kernels.log"
