#!/usr/bin/env bash
# What the trainer records as the compressed branch's backend against what runs, on one GPU: the
# cuDNN fold's GPU tests, then the seeds' model trained 2 steps at S=4k and S=64k, each run's
# env.json attention_backends['cmp'] printed (the band kernel below cuDNN's 2^25 query elements).
#   bash bench/gpu/backend_names.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
LOG=$OUT/backend_names.log
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; } | tee "$LOG"
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cudnn_compressed.py \
    tests/unit/test_backend_ran.py 2>&1 | tail -4 | tee -a "$LOG"
for S in ${LENGTHS:-4096 65536}; do
  dir=$(mktemp -d)
  timeout "${TRAIN_S:-150}" python3 -m nsa.train --config m7c_125m --steps 2 --out-dir "$dir" \
      train.seq_len="$S" train.batch_size=1 train.save_final=false > "$dir/train.log" 2>&1
  echo "S=$S exit $?: $(python3 -c "import json,sys; b=json.load(open(sys.argv[1]))['attention_backends']['cmp']; \
print(b['backend'], '-', b['reason'])" "$dir/env.json" 2>&1)" | tee -a "$LOG"
done
