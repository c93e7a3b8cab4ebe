#!/usr/bin/env bash
# Long context at the seeds' model shape (docs/performance.md's kernel and model tables), in device calls
# of under 10 minutes on one H100. PARTS, space separated, run in this order:
#   tests       the GPU shape matrix (dtype x head dim x G x odd S against float64), bf16 parity
#               S=1..65536, the selected forward's forms; WORKERS pytest workers (3: compiles in
#               parallel; 8 ran out of GPU memory with the float64 references), TEST_K a -k filter,
#               TEST_FILES other test files or node ids instead
#   breakdown   bench_nsa.py --breakdown at the seeds' attention shape, S=64k: time per kernel
#   sweep       bench_nsa.py --sweep of the knob groups SWEEP_ONLY (comma separated, default 'sel bwd':
#               what the selected dk/dv pass keeps for dq, its tiles) on SWEEP_SHAPES (m7c@64k 64k)
#   core        bench_nsa.py, the NSA core beside SDPA cuDNN at CORE_SHAPES (the seeds' attention
#               shape and the benchmark shape, 16k-64k)
#   forms       bench_nsa.py on random inputs: the selected branch and the core by forward form
#               (tiles, blocks) at the seeds' attention shape (G=6), G=4, G=8 and the benchmark
#               shape (G=16), beside SDPA cuDNN
#   trained     train m7c_125m on the standard library's sources (bench/trained_inputs.py), then
#               bench_nsa.py on trained and random inputs side by side, with their locality
#   throughput  bench/train_throughput.py, the NSA and the dense model, S=4k..64k, batch 1
#   compiled    the same with train.compile=true (both models compiled, CUDA graphs), THROUGHPUT_LENS
#   profile     where a whole training step's device time goes, both models, eager, PROFILE_LENS
#               (default 16384 65536): top kernels and their sum by family (attention, products, rest);
#               PROFILE_OVERRIDES more --override arguments (e.g. --override train.compile=true)
#   ab          bench_nsa.py at AB_SHAPES (m7c@64k 64k) with AB_OPS (sdpa_cudnn topn sel nsa_core), in the
#               tree AB_TREE (default .device/old: an earlier commit's nsa/ and bench/, carried with the
#               call: git archive <commit> nsa bench pyproject.toml | tar -x -C .device/old) and in this
#               one, alternating AB_ROUNDS times (2): the same machine and run for both
#   counters    bench/kernel_counters.py: every kernel of one NSA core step at COUNTER_SHAPES (m7c@64k)
#               under Nsight Compute, what limits it (raw CSV to $OUT/ncu_<shape>.csv)
#   FORM_SHAPES, FORM_OPS, FORM_SEL, THROUGHPUT_LENS, TRAIN_STEPS override the defaults; <PART>_TIMEOUT bounds a part.
# Results under $OUT: long_context.log (everything), tests.xml (per-test errors), *.json.
. bench/gpu/device_prologue.sh
LOG=$OUT/long_context.log
device_header "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
for part in ${PARTS:-tests forms}; do
  echo "## $part" | tee -a "$LOG"
  case $part in
  tests)
    k_args=()
    [ -n "${TEST_K:-}" ] && k_args=(-k "$TEST_K")
    timeout "${TESTS_TIMEOUT:-280}" python3 -m pytest -q -n "${WORKERS:-3}" -p no:cacheprovider --durations=0 \
      --junitxml="$OUT/tests.xml" "${k_args[@]}" \
      ${TEST_FILES:-tests/kernels/test_shape_matrix.py tests/kernels/test_triton_gpu.py tests/kernels/test_launch.py \
      tests/kernels/test_triton_topk.py tests/kernels/test_triton_selection.py::test_selection_blocks_forward \
      tests/kernels/test_triton_selection.py::test_selection_blocks_forward_a_chunk_of_tokens_at_a_time} 2>&1 \
      | grep -E "passed|failed|Error|^FAILED|^E |s call " | tee -a "$LOG" ;;
  breakdown)
    timeout "${BREAKDOWN_TIMEOUT:-150}" python3 bench/bench_nsa.py --breakdown --shapes ${BREAKDOWN_SHAPES:-m7c@64k} \
      --ops sdpa_cudnn nsa_core --json "$OUT/breakdown.json" 2>&1 | tee -a "$LOG" ;;
  sweep)
    IFS=, read -ra groups <<< "${SWEEP_ONLY:-sel bwd}"
    timeout "${SWEEP_TIMEOUT:-150}" python3 bench/bench_nsa.py --sweep --sweep-only "${groups[@]}" \
      --shapes ${SWEEP_SHAPES:-m7c@64k 64k} 2>&1 | tee -a "$LOG" ;;
  core)
    timeout "${CORE_TIMEOUT:-200}" python3 bench/bench_nsa.py \
      --shapes ${CORE_SHAPES:-m7c@16k m7c@32k m7c@64k 16k 32k 64k} --ops sdpa_cudnn nsa_core \
      --json "$OUT/core.json" 2>&1 | tee -a "$LOG" ;;
  forms)
    timeout "${FORMS_TIMEOUT:-300}" python3 bench/bench_nsa.py \
      --shapes ${FORM_SHAPES:-m7c@16k m7c@32k m7c@64k g4@64k g8@64k 16k 64k} \
      --ops ${FORM_OPS:-sdpa_cudnn sel nsa_core} --sel-forms ${FORM_SEL:-tiles blocks} --json "$OUT/forms.json" 2>&1 \
      | tee -a "$LOG" ;;
  trained)
    timeout "${TRAINED_TIMEOUT:-420}" sh -c "python3 bench/trained_inputs.py --out /tmp/trained \
      --steps ${TRAIN_STEPS:-300} --train-seq 16384 --lengths 16384 32768 65536 --layers 2 6 10 \
      && python3 bench/bench_nsa.py --shapes m7c@16k m7c@32k m7c@64k --ops sdpa_cudnn sel nsa_core \
         --sel-forms tiles blocks --inputs trained:/tmp/trained random --layer 6 --json $OUT/trained.json \
      && for L in 2 10; do python3 bench/bench_nsa.py --shapes m7c@64k --ops sel --sel-forms tiles blocks \
         --inputs trained:/tmp/trained --layer \$L; done" 2>&1 | tee -a "$LOG"
    cp /tmp/trained/train_loss.txt "$OUT/" 2>/dev/null ;;
  throughput)
    timeout "${THROUGHPUT_TIMEOUT:-420}" python3 bench/train_throughput.py --kinds nsa dense --batch-sizes 1 \
      --seq-lens ${THROUGHPUT_LENS:-4096 8192 16384 32768 65536} --cuda-graphs --steps 8 --warmup 2 \
      --override train.grad_accum=1 --override train.fused_adamw=true --json "$OUT/throughput.json" 2>&1 \
      | tee -a "$LOG"
    # the dense model on SDPA's flash kernel instead of cuDNN's (its best setting, measured)
    timeout 120 python3 bench/train_throughput.py --kinds dense --batch-sizes 1 --seq-lens 16384 65536 \
      --cuda-graphs --steps 8 --warmup 2 --override train.grad_accum=1 --override train.fused_adamw=true \
      --override model.attn.backend_dense=flash --json "$OUT/throughput_dense_flash.json" 2>&1 | tee -a "$LOG" ;;
  compiled)
    timeout "${COMPILED_TIMEOUT:-420}" python3 bench/train_throughput.py --kinds nsa dense --batch-sizes 1 \
      --seq-lens ${THROUGHPUT_LENS:-16384 32768 65536} --cuda-graphs --steps 8 --warmup 2 \
      --override train.grad_accum=1 --override train.fused_adamw=true --override train.compile=true \
      --json "$OUT/compiled.json" 2>&1 | tee -a "$LOG" ;;
  profile)
    timeout "${PROFILE_TIMEOUT:-300}" python3 bench/train_throughput.py --kinds nsa dense --batch-sizes 1 \
      --seq-lens ${PROFILE_LENS:-16384 65536} --steps 3 --warmup 2 --profile 2 --profile-rows 45 \
      --override train.grad_accum=1 --override train.fused_adamw=true ${PROFILE_OVERRIDES:-} \
      --json "$OUT/profile.json" 2>&1 | tee -a "$LOG" ;;
  ab)
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for tree in "${AB_TREE:-.device/old}" .; do
        echo "### round $round, tree $tree" | tee -a "$LOG"
        (cd "$tree" && PYTHONPATH=$PWD timeout "${AB_TIMEOUT:-150}" python3 bench/bench_nsa.py \
          --shapes ${AB_SHAPES:-m7c@64k 64k} --ops ${AB_OPS:-sdpa_cudnn topn sel nsa_core}) 2>&1 | tee -a "$LOG"
      done
    done ;;
  counters)
    for shape in ${COUNTER_SHAPES:-m7c@64k}; do
      timeout "${COUNTERS_TIMEOUT:-300}" python3 bench/kernel_counters.py --shapes "$shape" \
        --csv "$OUT/ncu_${shape/@/_}.csv" 2>&1 | tee -a "$LOG"
    done ;;
  *) echo "unknown part $part" | tee -a "$LOG" ;;
  esac
done
