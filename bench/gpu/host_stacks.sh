#!/usr/bin/env bash
# Where the host's time goes in steady training steps, in one device call (one GPU): py-spy
# samples the trainer's Python stacks (carry .whl/ with py-spy's wheel: the device image has none)
# over STEPS steps of m7c_125m at the production shape (synthetic data, CUDA-graph steps,
# OVERRIDES more --override settings, default train.compile=true); the stacks of compilation
# (dynamo, inductor) and outside the steps' loop are left out, the rest summed by frame:
# host_stacks.txt (the raw stacks: stacks_raw.txt.gz).
#   bash bench/gpu/host_stacks.sh          (OUT=<dir>; STEPS=200; OVERRIDES="train.compile=true")
. bench/gpu/device_prologue.sh
LOG=$OUT/host_stacks.log
device_header "$LOG"
spy=/tmp/pyspy
mkdir -p $spy && python3 -m zipfile -e .whl/py_spy-*.whl $spy
BIN=$(find $spy -name py-spy -type f | head -1) && chmod +x "$BIN"
timeout 300 "$BIN" record -r 200 -f raw -o "$OUT/stacks_raw.txt" -- python3 -m nsa.train --config m7c_125m \
  --steps "${STEPS:-200}" --out-dir /tmp/host_stacks_run --override \
  "data.dataset=synthetic dist.mode=single train.save_final=false ${OVERRIDES:-train.compile=true}" 2>&1 | tail -5 | tee -a "$LOG"
python3 bench/gpu/stack_summary.py "$OUT/stacks_raw.txt" --only run_step --exclude _dynamo _inductor --top 70 2>&1 \
  | tee "$OUT/host_stacks.txt" | head -80
gzip -c "$OUT/stacks_raw.txt" > "$OUT/stacks_raw.txt.gz" && rm "$OUT/stacks_raw.txt"
