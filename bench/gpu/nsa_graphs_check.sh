#!/usr/bin/env bash
# The NSA layer's own CUDA graphs on one GPU: their tests (exactness, launches; TESTS and TESTS_K
# choose others), then the layer and model table against dense. Back in $OUT: nsa_graphs_tests.log,
# nsa_graphs_table.log.
. bench/gpu/device_prologue.sh
device_header "$OUT/nsa_graphs_table.log"
device_tests ${TESTS_S:-200} "$OUT/nsa_graphs_tests.log" "$OUT/nsa_graphs_table.log" \
  ${TESTS:-tests/kernels/test_layer_graphs.py tests/kernels/test_launches.py} -k "${TESTS_K:-not nothing}"
timeout ${TABLE_S:-380} python3 bench/nsa_vs_dense.py --lengths ${LENGTHS:-4k 16k 32k} \
  --parts ${PARTS:-layer host model compiled} --compile-lengths ${COMPILE_LENGTHS:-16k} 2>&1 | tee -a "$OUT/nsa_graphs_table.log"
if [ -n "${GRAPH32:-}" ]; then
  timeout 120 python3 bench/nsa_vs_dense.py --lengths 32k --parts layer host --graph-tokens 32768 2>&1 \
    | tee -a "$OUT/nsa_graphs_table.log"
fi
