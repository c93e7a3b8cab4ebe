#!/usr/bin/env bash
# What NSA attention keeps for its backward against dense, on one GPU: the GPU tests of the code
# that decides it (the cuDNN compressed branch, the layer's graphs alone and under DDP/FSDP2, the
# remade gated sum, compile, launches), the saved tensors and activations (bench/saved_memory.py)
# and the model's time and peak memory (bench/nsa_vs_dense.py --parts model).
# Back in $OUT: nsa_memory.log and nsa_memory_tests.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/nsa_memory.log"
device_header "$LOG"
timeout ${TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider -rA --tb=short tests/kernels/test_cudnn_compressed.py \
  tests/kernels/test_layer_graphs.py tests/kernels/test_layer_graphs_parallel.py tests/kernels/test_gated_branches.py \
  tests/kernels/test_compile.py tests/kernels/test_launches.py \
  >"$OUT/nsa_memory_tests.log" 2>&1
tail -3 "$OUT/nsa_memory_tests.log" | tee -a "$LOG"
timeout ${SAVED_S:-150} python3 bench/saved_memory.py --lengths ${SAVED_LENGTHS:-32k 128k} --parts ${SAVED_PARTS:-layer model} 2>&1 | tee -a "$LOG"
timeout ${TABLE_S:-200} python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-32k 64k 128k} --parts ${PARTS:-model} 2>&1 | tee -a "$LOG"
