#!/usr/bin/env bash
# Two-GPU acceptance (runbooks/h200_pair.yaml; needs two GPUs, and its h200 profile names H200s)
# in one device call:
#   bash bench/gpu/two_gpu_acceptance.sh        (OUT=<dir> for what comes back)
# (carry a SOURCE_SHA stamp, see bench/gpu/acceptance.sh, so that preflight names the commit)
# 1. calibrate: one single-GPU trainer run of m7c_125m at the production shape;
# 2. write the h200 profile with floors derived from it (0.9x for one GPU; the trainer issue's
#    1.8x / 1.7x scaling requirements for DDP / FSDP2) to $OUT/h200_calibrated.yaml;
# 3. run runbooks/h200_pair.yaml against that profile and render the report.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
RES=${RES:-/tmp/nsa_results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/run.log"
timeout 150 python3 -m nsa.train --config m7c_125m --steps 50 --out-dir /tmp/calibrate \
  --override "dist.mode=single data.dataset=synthetic" > /tmp/calibrate.log 2>&1
tail -2 /tmp/calibrate.log | tee -a "$OUT/run.log"
python3 - "$OUT/h200_calibrated.yaml" <<'PY' 2>&1 | tee -a "$OUT/run.log"
import sys, pandas as pd, yaml
rate = pd.read_csv("/tmp/calibrate/training.csv")["toks_per_s"].tail(25).mean()
prof = yaml.safe_load(open("runbooks/profiles/h200.yaml"))
prof["thresholds"].update(min_single_gpu_toks_per_s=round(0.9 * rate), min_toks_per_s=round(1.8 * rate),
                          min_fsdp_toks_per_s=round(1.7 * rate))
prof["notes"] = f"calibrated on this box: one GPU {rate:.0f} tok/s (mean of the last 25 of 50 steps)"
open(sys.argv[1], "w").write(yaml.safe_dump(prof, sort_keys=False))
print(f"calibration: one GPU {rate:.0f} tok/s")
PY
timeout 380 python3 -m validation run --runbook h200_pair --profile "$OUT/h200_calibrated.yaml" \
  --results-dir "$RES" 2>&1 | grep -v '^  \.\.\.' | tee -a "$OUT/run.log"
cp "$RES"/reports/*.md "$OUT"/ 2>/dev/null
python3 - "$RES" <<'PY' 2>&1 | tee -a "$OUT/run.log"
# per-rank step times from the heartbeats of the DDP and FSDP runs (issue: within 10%)
import json, pathlib, statistics, sys
for run in sorted(pathlib.Path(sys.argv[1]).glob("runs/h200_pair/*/*/*")):
    per_rank = {}
    for hb in sorted(run.glob("heartbeat_rank*.jsonl")):
        times = [r.get("step_time_s") for r in map(json.loads, hb.read_text().splitlines()[-200:]) if r.get("step_time_s")]
        if times:
            per_rank[hb.stem] = statistics.median(times[-20:])
    print(run.relative_to(sys.argv[1]), {k: round(v, 4) for k, v in per_rank.items()})
PY
