"""A trainer-shaped NCCL job in which one rank hangs: the evidence of how NCCL's watchdog ends the
others (validation/tests/evidence/nccl*_watchdog_rank*_hung, read by
validation/tests/judge/test_diagnosis_collective_timeouts.py). Run under torchrun by
bench/gpu/nccl_watchdog_evidence.sh:

    python -m torch.distributed.run --standalone --nproc_per_node=N bench/nccl_hang_one_rank.py OUT --hang-rank R

Each rank writes the artifact contract's heartbeat_rank{r}.jsonl into OUT, all-reduces once a step,
and rank R sleeps at step 3 before its all-reduce; the process group's timeout is 15 s.
"""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

HANG_STEP, STEPS, TIMEOUT_S = 3, 8, 15


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="directory for the heartbeat files (exists)")
    p.add_argument("--hang-rank", type=int, default=1, help="the rank that sleeps at step 3 (1)")
    args = p.parse_args()
    out, hang = args.out, args.hang_rank
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=TIMEOUT_S))

    def beat(step: int, stage: str) -> None:
        with open(f"{out}/heartbeat_rank{rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"time": time.time(), "step": step, "rank": rank, "pid": os.getpid(),
                                 "stage": stage}) + "\n")

    for step in range(1, STEPS + 1):
        beat(step, "forward")
        if rank == hang and step == HANG_STEP:
            time.sleep(10**6)
        beat(step, "backward")
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        t.item()
        beat(step, "step")
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
