"""A test trainer OUTSIDE the nsa package that writes the artifact contract itself
(docs/artifact_contract.md): it needs no adapter. No model: the loss is a formula.

    python native_train.py --steps N --out-dir DIR
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("--steps", type=int, required=True)
    cli.add_argument("--out-dir", type=Path, required=True)
    cli.add_argument("--lr", type=float, default=3e-4)
    args = cli.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (args.out_dir / "env.json").write_text(json.dumps({"world_size": world, "git_sha": "test",
                                                           "attention_backends": {"cmp": {"backend": "none"}}}))
    csv = args.out_dir / "training.csv"
    if rank == 0:
        csv.write_text(COLUMNS + "\n")
    for step in range(1, args.steps + 1):
        t0 = time.time()
        time.sleep(0.01)
        dt = time.time() - t0
        with open(args.out_dir / f"heartbeat_rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "rank": rank, "step": step, "stage": "optimizer"}) + "\n")
        if rank == 0:
            with open(csv, "a") as f:
                f.write(f"{step},{5.0 / step:.5f},{args.lr},{256 * world / dt:.1f},{dt:.4f},1.0,0.1,0.2\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
