export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O="model.n_layers=2 train.seq_len=256 train.batch_size=2 train.grad_accum=2 train.lr=1e-3 train.warmup_steps=0 train.save_final=false data.dataset=synthetic train.dtype=bfloat16 dist.mode=ddp watchdog.timeout_s=25 train.print_every=1"
NSA_DDP_COMPRESS=bf16 NSA_DDP_BUCKET_MB=1 timeout 100 torchrun --standalone --nproc_per_node=2 -m nsa.train --config tiny --steps 15 --out-dir /tmp/ddpg --override "$O" > /tmp/ddpg.log 2>&1; rc=$?
echo rc=$rc; grep -v "^\s*$" /tmp/ddpg.log | tail -30
for f in /tmp/ddpg/stackdump*; do echo "== $f"; grep -A25 "Current thread\|most recent call first" $f | head -50; done
tail -2 /tmp/ddpg/heartbeat_rank0.jsonl | cut -c1-200; tail -2 /tmp/ddpg/heartbeat_rank1.jsonl | cut -c1-200
if [ $rc = 0 ]; then TESTS=0 LIMIT=420 bash bench/gpu/h200_seed_runbook.sh; fi
