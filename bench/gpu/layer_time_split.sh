#!/usr/bin/env bash
# Where one NSA layer's forward + backward spends its time without its own CUDA graphs, on one GPU:
# the GPU tests named in TESTS first (default: compile, launches, the cuDNN fold), then per length in
# LENGTHS the host ops and Python functions (torch.profiler, cProfile) and, at CUDA_LENGTHS, the GPU
# kernels. Back in $OUT: layer_time_split.log, layer_time_split_tests.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/layer_time_split.log"
device_header "$LOG"
if [ "${TESTS:-}" != "none" ]; then
  device_tests ${TESTS_S:-240} "$OUT/layer_time_split_tests.log" "$LOG" \
    ${TESTS:-tests/kernels/test_compile.py tests/kernels/test_launches.py tests/kernels/test_cudnn_compressed.py}
fi
for S in ${LENGTHS:-4k 32k}; do
  timeout ${HOST_S:-90} python3 bench/host_profile.py --layer --shapes "$S" --graph-tokens 0 --cprofile \
    --rows ${ROWS:-40} 2>&1 | tee -a "$LOG"
done
for S in ${CUDA_LENGTHS:-32k}; do
  timeout ${CUDA_S:-90} python3 bench/host_profile.py --layer --shapes "$S" --graph-tokens 0 --cuda \
    --rows ${CUDA_ROWS:-70} 2>&1 | tee -a "$LOG"
done
