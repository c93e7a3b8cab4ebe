#!/usr/bin/env bash
# Two GPUs (nvidia-h200-x2): one short DDP run of the tiny model with CUDA-graph steps and the
# seed runbook's bf16 gradient compression, with the watchdog at 25 s so that a hang leaves stack
# dumps, then, when it exits cleanly, the seed runbook (MARK=a100 bench/gpu/acceptance.sh).
#   bash bench/gpu/ddp_graph_diag.sh                (RUNBOOK=0: the DDP run alone)
# Written when the first two-GPU call hung: every step finished, then the process hung at exit
# (the graph, holding NCCL kernels, was alive when the process group was destroyed; fixed by
# StepGraph.release). Its output on 2026-11-23 is docs/measurements/2026-11-23-a/h200x2_ddp_graph_diag.log.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O="model.n_layers=2 train.seq_len=256 train.batch_size=2 train.grad_accum=2 train.lr=1e-3 train.warmup_steps=0 train.save_final=false data.dataset=synthetic train.dtype=bfloat16 dist.mode=ddp watchdog.timeout_s=25 train.print_every=1"
NSA_DDP_COMPRESS=bf16 NSA_DDP_BUCKET_MB=1 timeout 100 torchrun --standalone --nproc_per_node=2 -m nsa.train \
  --config tiny --steps 15 --out-dir /tmp/ddpg --override "$O" > /tmp/ddpg.log 2>&1; rc=$?
echo rc=$rc; grep -v "^\s*$" /tmp/ddpg.log | tail -30
for f in /tmp/ddpg/stackdump*; do echo "== $f"; grep -A25 "Current thread\|most recent call first" "$f" | head -50; done
tail -2 /tmp/ddpg/heartbeat_rank0.jsonl | cut -c1-200; tail -2 /tmp/ddpg/heartbeat_rank1.jsonl | cut -c1-200
if [ $rc = 0 ] && [ "${RUNBOOK:-1}" = 1 ]; then MARK=a100 LIMIT=${LIMIT:-420} bash bench/gpu/acceptance.sh; fi
