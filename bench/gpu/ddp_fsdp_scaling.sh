#!/usr/bin/env bash
# Scaling of the trainer on two GPUs, in one device call: m7c_125m, synthetic data, one GPU vs
# DDP vs FSDP2 variants at the same per-GPU batch, each with torch.compile (the inductor cache
# makes the later runs compile fast) and fused AdamW (with FSDP2's sharded DTensor parameters the
# unfused step costs tens of ms of CPU). Prints global tokens/s (mean of the last 20 of 40 steps) and
# per-rank median step times from the heartbeats.
#   bash bench/gpu/ddp_fsdp_scaling.sh     (OUT=<dir>; SHAPE="train.batch_size=2 train.grad_accum=2";
#                                           TAG=<prefix> for the run names; RUNS="single ddp ddp_fp32
#                                           fsdp fsdp_noreshard" picks the runs)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
SHAPE=${SHAPE:-"train.batch_size=2 train.grad_accum=2"}
TAG=${TAG:-}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$OUT/scaling.log"
echo "per-GPU shape: $SHAPE, S=2048" | tee -a "$OUT/scaling.log"
run() {  # name nproc overrides...
  local name=$1 nproc=$2; shift 2
  local launch="python3 -m nsa.train"
  [ "$nproc" -gt 1 ] && launch="torchrun --standalone --nproc_per_node=$nproc -m nsa.train"
  timeout "${LIMIT:-100}" $launch --config m7c_125m --steps 40 --out-dir "/tmp/scaling/$TAG$name" \
    --override "data.dataset=synthetic train.save_final=false train.compile=true $SHAPE $*" \
    > "$OUT/$TAG$name.log" 2>&1
  python3 - "/tmp/scaling/$TAG$name" "$TAG$name" "$*" <<'PY' 2>&1 | tee -a "$OUT/scaling.log"
import json, pathlib, statistics, sys
import pandas as pd
run, name, args = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    rate = pd.read_csv(run / "training.csv")["toks_per_s"].tail(20).mean()
except Exception as e:
    print(f"| {name} | {args} | failed: {e!r} |"); sys.exit()
ranks = {}
for hb in sorted(run.glob("heartbeat_rank*.jsonl")):
    t = [r["step_time_s"] for r in map(json.loads, hb.read_text().splitlines()) if r.get("step_time_s")]
    ranks[hb.stem[-5:]] = round(statistics.median(t[-20:]), 4)
print(f"| {name} | {args} | {rate:,.0f} | {ranks} |")
PY
}
echo "| run | overrides | global toks/s | per-rank median step s |" | tee -a "$OUT/scaling.log"
F="train.fused_adamw=true"
for r in ${RUNS:-single ddp fsdp fsdp_noreshard}; do
  case $r in
    single) LIMIT=150 run single 1 "dist.mode=single $F" ;;
    ddp) run ddp 2 "dist.mode=ddp dist.ddp_bucket_mb=50 dist.ddp_compress=bf16 $F" ;;
    ddp_fp32) run ddp_fp32 2 "dist.mode=ddp dist.ddp_bucket_mb=100 dist.ddp_compress=none dist.ddp_static_graph=true $F" ;;
    fsdp) run fsdp 2 "dist.mode=fsdp $F" ;;
    fsdp_noreshard) run fsdp_noreshard 2 "dist.mode=fsdp dist.fsdp_reshard_after_forward=false $F" ;;
    *) echo "unknown run $r (single ddp ddp_fp32 fsdp fsdp_noreshard)" ;;
  esac
done
