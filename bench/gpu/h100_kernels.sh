#!/usr/bin/env bash
# The kernel evidence of issue 3 in one device call (one H100): every kernel test on the GPU
# (bf16 parity S=1..65536, the interpreter suites on CUDA, no host sync, torch.compile), then the
# benchmark table with the per-stage breakdown, fla-core included when its wheel is in .whl/
# (carry .whl; the pure-Python wheel is unpacked onto PYTHONPATH, no pip needed).
#   bash bench/gpu/h100_kernels.sh      (OUT=<dir> for results; TESTS=0 skips the tests;
#                                        SHAPES="2k m7c_125m" limits the benchmark)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
for whl in .whl/fla_core-*.whl; do
  [ -f "$whl" ] && python3 -m zipfile -e "$whl" /tmp/fla_site && export PYTHONPATH=$PYTHONPATH:/tmp/fla_site
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/kernels.log"
if [ "${TESTS:-1}" != 0 ]; then
  echo "## kernel tests on the GPU" | tee -a "$OUT/kernels.log"
  timeout 330 python3 -m pytest -q tests/kernels -s -p no:cacheprovider 2>&1 \
    | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/kernels.log"
fi
echo "## benchmark (python bench/bench_nsa.py --breakdown ${SHAPES:+--shapes $SHAPES})" | tee -a "$OUT/kernels.log"
timeout 330 python3 bench/bench_nsa.py --breakdown ${SHAPES:+--shapes $SHAPES} --json "$OUT/bench.json" 2>&1 \
  | tee -a "$OUT/kernels.log"
