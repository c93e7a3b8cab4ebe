#!/usr/bin/env bash
# runbooks/hf_trainer_fla_nsa.yaml on one GPU: fla's NSA model under the Hugging Face Trainer,
# judged through the hf_trainer adapter; the rendered report (Markdown + PNGs) goes to $1.
#   bash bench/gpu/hf_trainer_fla_nsa.sh docs/examples/hf_trainer_fla_nsa
set -euo pipefail
dest=${1:?usage: $0 REPORT_DIR}
results=$(mktemp -d)
python3 -m validation run --runbook runbooks/hf_trainer_fla_nsa.yaml --profile h200 --results-dir "$results" || true
mkdir -p "$dest"
(cd "$results"/reports && find . \( -name '*.md' -o -name '*.png' \) -print0 | tar --null -cf - -T -) | tar -C "$dest" -xf -
cat "$results"/runs/*/*/*/*/*/training.csv | head -5 || true
tail -20 "$results"/runs/*/*/*/*/*/trainer.stderr.log || true
