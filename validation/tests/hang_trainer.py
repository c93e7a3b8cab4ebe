"""A test trainer that writes the artifact contract and hangs on request, for the harness's stall
tests. It imports no torch, so it starts at once under python and under torchrun (which sets
RANK and WORLD_SIZE).

    python -m validation.tests.hang_trainer --config X --steps N --out-dir DIR [--override ...]

    NSA_HANG_AT=S          the hanging ranks stop at step S, in ``stuck_here`` (default: never)
    NSA_HANG_RANKS=all|R,R which ranks hang (default: all)
    NSA_HANG_SIGUSR1=0     no SIGUSR1 handler (default: faulthandler writes stackdump_rank{R}.txt)
    NSA_STEP_S=F           seconds a step takes (default 0.02)
    NSA_START_S=F          seconds of start-up before the first step (default 0)
    NSA_FIRST_STEP_S=F     seconds the first step takes after its ``forward`` record, as a first forward
                           that compiles does (default 0: no such record)
    NSA_START_IMPORT=F0,F1 rank R first imports the module at file FR (the last for ranks past the list), as
                           a slow first import of a library does (default: none)
    NSA_LOADER_HANG_AT=S   each step takes a batch from a torch DataLoader of one worker process, whose read of
                           step S's batch never returns, in ``read_shard`` (default: no loader; torch is imported
                           only for it)

Every step ends at a barrier through the heartbeat files (``wait_for_peers``): a healthy rank
waits for a hung one, as it would in a collective.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import os
import signal
import time
from pathlib import Path

COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"


def stuck_here() -> None:
    """Where a hanging rank stays (the name the stall finding must show)."""
    while True:
        time.sleep(1)


def read_shard(step: int, hang_at: int) -> int:
    """Where the data loader's worker stays at step ``hang_at`` (the name the stall finding must show)."""
    while step == hang_at:
        time.sleep(1)
    return step


def loader(hang_at: int):
    """Batches 1, 2, ... from a DataLoader of one worker process, whose read of batch ``hang_at`` never returns."""
    import torch.utils.data

    class Shards(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> int:
            return read_shard(i + 1, hang_at)

    return iter(torch.utils.data.DataLoader(Shards(), batch_size=None, num_workers=1))


def wait_for_peers(out: Path, world: int, step: int) -> None:
    """Until every rank's heartbeat file shows ``step``."""
    while not all(_last_step(out / f"heartbeat_rank{r}.jsonl") >= step for r in range(world)):
        time.sleep(0.01)


def _last_step(path: Path) -> int:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except (ValueError, KeyError):
            continue
    return 0


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("--config", default="")
    cli.add_argument("--override", default="")
    cli.add_argument("--steps", type=int, required=True)
    cli.add_argument("--out-dir", type=Path, required=True)
    args = cli.parse_args()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if first := os.environ.get("NSA_START_IMPORT"):
        files = first.split(",")
        path = files[min(rank, len(files) - 1)]
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    if os.environ.get("NSA_HANG_SIGUSR1", "1") != "0":
        faulthandler.register(signal.SIGUSR1, file=open(out / f"stackdump_rank{rank}.txt", "w"), all_threads=True)
    hang_at = int(os.environ.get("NSA_HANG_AT", "0"))
    spec = os.environ.get("NSA_HANG_RANKS", "all")
    hangs = hang_at > 0 and (spec == "all" or str(rank) in spec.split(","))
    step_s = float(os.environ.get("NSA_STEP_S", "0.02"))
    time.sleep(float(os.environ.get("NSA_START_S", "0")))
    if rank == 0:
        (out / "env.json").write_text(json.dumps({"world_size": world, "git_sha": "test"}))
        (out / "training.csv").write_text(COLUMNS + "\n")
    first_step_s = float(os.environ.get("NSA_FIRST_STEP_S", "0"))
    batches = loader(int(os.environ["NSA_LOADER_HANG_AT"])) if os.environ.get("NSA_LOADER_HANG_AT") else None
    for step in range(1, args.steps + 1):
        if hangs and step == hang_at:
            stuck_here()
        if batches is not None:
            next(batches)
        if step == 1 and first_step_s:
            with open(out / f"heartbeat_rank{rank}.jsonl", "a") as fh:
                fh.write(json.dumps({"time": time.time(), "rank": rank, "step": 1, "stage": "forward"}) + "\n")
            time.sleep(first_step_s)
        time.sleep(step_s)
        with open(out / f"heartbeat_rank{rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"time": time.time(), "rank": rank, "step": step, "stage": "optimizer"}) + "\n")
        if rank == 0:
            with open(out / "training.csv", "a") as fh:
                fh.write(f"{step},{5.0 / step:.5f},0.001,{1000.0 * world},{step_s},1.0,0.1,0.2\n")
        wait_for_peers(out, world, step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
