#!/usr/bin/env bash
# runbooks/hf_trainer_fla_nsa.yaml on one GPU: fla's NSA model under the Hugging Face Trainer,
# judged through the hf_trainer adapter. Before the call (here): flash-linear-attention and
# fla-core wheels (and py-spy's, for stacks) in .device/fla/.whl, carried. Back in $OUT:
# hf_fla.log and hf_fla_results.tgz (the result store with its report); then, here,
#   python scripts/regenerate_examples.py hf_trainer_fla_nsa --profile h200 --from-results DIR
. bench/gpu/device_prologue.sh
LOG="$OUT/hf_fla.log"
device_header "$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "${WHEELS:-.device/fla/.whl}"/*.whl || { echo "wheels did not install" | tee -a "$LOG"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
python3 -c "import torch, transformers, fla; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__)" 2>&1 | tee -a "$LOG"
results=/tmp/hf_fla_results
start=$(date +%s)
python3 -m validation run --runbook runbooks/hf_trainer_fla_nsa.yaml --profile h200 --results-dir $results 2>&1 | tee -a "$LOG"
echo "exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$LOG"
tail -25 $results/runs/*/*/*/*/*/trainer.stderr.log >>"$LOG" 2>/dev/null
tar -C $results -czf "$OUT/hf_fla_results.tgz" .
