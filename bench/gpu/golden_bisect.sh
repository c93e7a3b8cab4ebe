#!/usr/bin/env bash
# Which commit moved the h100 determinism phase's loss curve off its golden: the phase run at
# several trees in one device call, each with its own code, runbook and golden file.
#   for r in REV1 REV2; do mkdir -p _g/$r && git archive $r nsa validation runbooks | tar -x -C _g/$r; done
#   bash bench/gpu/golden_bisect.sh          (every tree under _g/, in name order; delete _g after)
# Prints, per tree, the phase's verdict line and repeat 1's loss at steps 1, 2, 10, 20 and 30 (the
# golden's in the first line), so that two trees whose curves agree read as equal.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"
root=$PWD
python3 - <<'PY'
import yaml
g = yaml.safe_load(open("runbooks/goldens/h100_single__h100.yaml"))
loss = g["points"]["determinism/default"]["nvidia_h100_80gb_hbm3"]["loss"]
print("golden (this tree's file):", [loss[s - 1] for s in (1, 2, 10, 20, 30)])
PY
for tree in _g/*/; do
    rev=$(basename "$tree")
    res=/tmp/golden_bisect/$rev
    rm -rf "$res"
    (cd "$tree" && echo "$rev" > SOURCE_SHA && PYTHONPATH=$PWD timeout "${LIMIT:-150}" python3 -m validation run \
        --runbook h100_single --profile h100 --phase determinism --results-dir "$res" --no-plots \
        > "$OUT/$rev.log" 2>&1)
    verdict=$(grep -E "golden_loss_rel_diff|GO|INCOMPLETE" "$OUT/$rev.log" | tail -2 | cut -c1-220)
    csv=$(find "$res" -path "*repeat1/training.csv" | head -1)
    steps=$(python3 -c "import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print([float(r[s-1]['loss']) for s in (1,2,10,20,30)])" "$csv" 2>&1)
    echo "$rev: $steps"
    echo "    $verdict"
done
