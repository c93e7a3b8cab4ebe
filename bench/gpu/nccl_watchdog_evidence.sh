#!/usr/bin/env bash
# How NCCL's watchdog ends the ranks of a job in which one rank hangs (bench/nccl_hang_one_rank.py):
# it records the evidence under validation/tests/evidence/nccl*_watchdog_rank*_hung (two and four GPUs).
#   NPROC=2 HANG=1 bash bench/gpu/nccl_watchdog_evidence.sh     (kind nvidia-h100-x2; NPROC=4: -x4)
# Writes $OUT/run/ (heartbeats), $OUT/run/trainer.stderr.log (torchrun's and the ranks' output) and
# $OUT/exit.txt. The watchdog takes about 75 s from the hang to the abort; LIMIT bounds the run (180).
. bench/gpu/device_prologue.sh
device_header "$OUT/header.log"
mkdir -p "$OUT/run"
timeout -k 10 "${LIMIT:-180}" python3 -m torch.distributed.run --standalone --nproc_per_node="${NPROC:-2}" \
  bench/nccl_hang_one_rank.py "$OUT/run" --hang-rank "${HANG:-1}" > "$OUT/run/trainer.stderr.log" 2>&1
echo "torchrun exit $?" | tee "$OUT/exit.txt"
