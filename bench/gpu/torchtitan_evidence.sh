#!/usr/bin/env bash
# torchtitan 0.2.2's llama3 debug model (its default config) on one H100 or H200, in one device call: runbooks/torchtitan_debug.yaml
# through the harness (its report), and the same trainer's own output under four faults, kept as
# evidence for the CPU tests (validation/tests/evidence/torchtitan_*). 0.2.2, not 0.3.0: 0.3.0
# imports DataParallelMeshDims from torch.distributed.fsdp, which torch 2.11 (the device's) lacks.
#   nan    the learning rate blows up (--optimizer.lr 1e30); 0.2.2 logs the non-finite loss and
#          trains on (0.3.x raises "Loss is not finite" instead)
#   kill   the rank is killed (SIGKILL) once it has logged step 5
#   hang   the rank is stopped (SIGSTOP) once it has logged step 5: its log stops growing
# (An early end, the data running out, is not reachable from 0.2.2's command line: its training
# dataloader always loops. 0.3.x's --dataloader.no_infinite is.)
#   fr     a flight-recorder dump taken through torch's dump API from a one-rank NCCL group after an
#          all_reduce: one rank has no peer whose collective can time out, so NCCL's watchdog never
#          dumps on one GPU; this is the file format torchtitan's comm_traces/ holds
# Before the call (here): the wheels in .device/titan/.whl (torchtitan and the packages the device
# image lacks: docs/guides/torchtitan.md lists them) and torchtitan's tokenizer, tests/assets/tokenizer
# of its repository, in .device/titan/.tt_tokenizer. The dataset is written here from this Python's
# own standard-library sources (one {"text": ...} line per file), so nothing is downloaded.
# Back in $OUT: torchtitan_evidence.log, evidence.tgz (each case's stdout, stderr, exit code and
# dump folder), results.tgz (the harness's store, its report and plots).
. bench/gpu/device_prologue.sh
device_header "$OUT/torchtitan_evidence.log"
LOG="$OUT/torchtitan_evidence.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels did not install" | tee -a "$LOG"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site
python3 -c "import torch, torchtitan; print('torch', torch.__version__, 'torchtitan', torchtitan.__version__)" 2>&1 | tee -a "$LOG"

ROOT=/tmp/tt_root E=/tmp/tt_evidence RES=/tmp/tt_results
mkdir -p $ROOT/tests/assets/c4_test && cp -r .tt_tokenizer $ROOT/tests/assets/tokenizer
python3 - "$ROOT" <<'EOF'
import json, pathlib, sys, sysconfig
files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
for root, n in ((sys.argv[1], 80),):
    with open(pathlib.Path(root, "tests/assets/c4_test/data.json"), "w") as fh:
        for p in files[:n]:
            fh.write(json.dumps({"text": p.read_text(errors="replace")}) + "\n")
EOF
TT=(-m torch.distributed.run --standalone --nproc_per_node 1 -m torchtitan.train --metrics.enable_tensorboard
    --metrics.log_freq 1 --lr_scheduler.warmup_steps 2)

run_case() {  # name root args...: torchtitan into $E/name, in the background
  local name=$1 root=$2; shift 2
  mkdir -p $E/$name
  (cd $root && python3 "${TT[@]}" --job.dump_folder $E/$name/torchtitan "$@" >$E/$name/stdout.log 2>$E/$name/stderr.log;
   echo $? >$E/$name/exit_code) &
  echo $! >$E/$name/agent_pid
}

signal_at_step() {  # name signal: once the case's log shows step 5, signal its rank (the agent's child)
  local name=$1 sig=$2 agent worker
  for _ in $(seq 600); do grep -q "step:  5" $E/$name/stdout.log 2>/dev/null && break; sleep 0.2; done
  agent=$(pgrep -P "$(cat $E/$name/agent_pid)" -f torch.distributed.run | head -1)
  worker=$(pgrep -P "$agent" | head -1)
  echo "$name: kill -$sig $worker (agent $agent) at $(grep -c 'step:' $E/$name/stdout.log) logged steps" | tee -a "$LOG"
  kill -"$sig" "$worker"
  echo "$worker" >$E/$name/worker_pid
}

start=$(date +%s)
# the runbook's profile for this GPU (PROFILE to choose another)
PROFILE=${PROFILE:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)}
TORCHTITAN_ROOT=$ROOT timeout 300 python3 -m validation run --runbook torchtitan_debug --profile "$PROFILE" \
  --results-dir $RES >$OUT/harness_run.log 2>&1 &
harness=$!
run_case nan $ROOT --training.steps 20 --optimizer.lr 1e30
run_case kill $ROOT --training.steps 400
run_case hang $ROOT --training.steps 400
mkdir -p $E/fr
(python3 -m torch.distributed.run --standalone --nproc_per_node 1 - >$E/fr/stdout.log 2>&1 <<'EOF'
import os, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
x = torch.ones(1024, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
dump = torch._C._distributed_c10d._dump_nccl_trace()
open(os.path.join(os.environ.get("FR_DIR", "/tmp/tt_evidence/fr"), "rank_0"), "wb").write(dump)
dist.destroy_process_group()
EOF
) &
signal_at_step kill KILL &
signal_at_step hang STOP &
wait $(cat $E/nan/agent_pid $E/kill/agent_pid)
sleep 20  # the stopped rank's log stays as it is; then end it (its agent reports the kill)
kill -KILL "$(cat $E/hang/worker_pid)" 2>/dev/null; wait "$(cat $E/hang/agent_pid)"
wait "$harness"
echo "harness run exit $? ; all cases took $(( $(date +%s) - start )) s" | tee -a "$LOG"
tail -5 $OUT/harness_run.log | tee -a "$LOG"
for c in nan kill hang; do
  echo "== $c: exit $(cat $E/$c/exit_code 2>/dev/null), $(grep -c 'step:' $E/$c/stdout.log) metrics lines" | tee -a "$LOG"
  grep -E "Loss is not finite|Ran out of data|Training completed|Error|step: 20" $E/$c/stdout.log $E/$c/stderr.log | head -3 | tee -a "$LOG"
done
ls -la $E/fr | tee -a "$LOG"
tar czf $OUT/evidence.tgz -C $E .
tar czf $OUT/results.tgz --exclude='*.distcp' --exclude='checkpoint' -C $RES .
ls -la $OUT
