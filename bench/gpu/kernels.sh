#!/usr/bin/env bash
# The kernel evidence in one device call (one GPU; under 9 minutes on an H100): every kernel
# test on the GPU (bf16 parity S=1..65536, the interpreter suites on CUDA, deterministic backward,
# no host sync, torch.compile), then the per-kernel table (time, TFLOP/s, GB/s of top-n,
# compressed, selected fwd/dq/dk-dv, window) and the benchmark table of the whole core, fla-core
# included when its wheel is in .whl/ (carry .whl; the pure-Python wheel is unpacked onto
# PYTHONPATH).
#   TESTS=1 SHAPES="2k m7c_125m 32k 64k" bash bench/gpu/kernels.sh
# OUT=<dir> for results (kernels.log, bench.json); TESTS=0 skips the tests; TEST_PATHS limits
# them (tests/kernels by default: about 310 s on one H100, so raise TESTS_TIMEOUT and
# limit SHAPES to run both); SHAPES limits the benchmark (all shapes by default); TESTS_TIMEOUT /
# BENCH_TIMEOUT (seconds, 240 / 280 by default) bound the two parts.
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
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q ${TEST_PATHS:-tests/kernels} -s -p no:cacheprovider 2>&1 \
    | grep -E "^\[parity\]|passed|failed|Error|^FAILED" | tee -a "$OUT/kernels.log"
fi
echo "## benchmark (python bench/bench_nsa.py --breakdown ${SHAPES:+--shapes $SHAPES})" | tee -a "$OUT/kernels.log"
timeout "${BENCH_TIMEOUT:-280}" python3 bench/bench_nsa.py --breakdown ${SHAPES:+--shapes $SHAPES} \
  --json "$OUT/bench.json" 2>&1 | tee -a "$OUT/kernels.log"
