"""A test trainer OUTSIDE the nsa package that writes the artifact contract (version 2) itself,
from its documentation: it needs no adapter. No model: the loss is a formula, a step ~10 ms.

    python native_train.py --steps N --out-dir DIR [--lr LR] [--stop-after K] [--resume-from DIR]
    torchrun --standalone --nproc_per_node=2 native_train.py --steps N --out-dir DIR

``--stop-after K`` ends the run after step K of N with a checkpoint (``checkpoint.json``, its
step); ``--resume-from DIR`` continues the run in DIR from its checkpoint, writing steps K+1..N
into ``--out-dir``. It records no data position: the loss, a function of the step, tells.

Alone it imports no torch. Under torchrun (RANK / WORLD_SIZE from the environment, WORLD_SIZE > 1)
the ranks average each step's loss with an all-reduce over torch.distributed (gloo), as a
data-parallel trainer would, so a rank that stops blocks the others in a real collective.

Writes: ``env.json`` (rank 0, at the start: contract_version, world_size, git_sha, attention
backends, tokens_per_step); ``training.csv`` (rank 0, the contract's header, a row every step);
``heartbeat_rank{R}.jsonl`` (every rank: a ``forward`` record as a step starts, a ``step`` record
when it ends, each with time, rank, pid, node (torchrun's GROUP_RANK), host and step). Exit codes are the contract's.

``TEST_TRAINER_BACKEND=nccl``: the all-reduce runs over NCCL on each rank's GPU (LOCAL_RANK), so a
rank that stops leaves the others waiting in a CUDA sync (tests/faults/test_nccl_faults.py).
``TEST_TRAINER_PG_TIMEOUT_S=S``: the process group's timeout: a collective that waits S seconds for a
hung peer gives up (gloo raises 'Timed out waiting ...' in the ranks that waited).

Faults: ``TEST_TRAINER_FAULT`` (grammar in trainer_faults.py), here:
quit_early@K   exit 0 after step K's row;
hang_rank:R@K  rank R sleeps forever as step K starts; the others write step K's ``forward``
               record, then block in its all-reduce (under torchrun) -- alone, R can only be 0;
hang_all@K     every rank sleeps forever as step K starts;
kill_rank:R@K  rank R SIGKILLs itself as step K starts; under torchrun the others' all-reduce fails;
term_rank:R@K  rank R SIGTERMs itself as step K starts (a signal from outside); as kill_rank;
quit_rank:R@K  rank R exits 0 as step K starts; under torchrun the others' all-reduce fails;
quit_in_step:R@K  rank R exits 0 right after step K's ``forward`` record (step K in progress);
               under torchrun the others' all-reduce fails;
mute_rank:R@K  rank R writes no heartbeat from step K on; it trains on in every all-reduce to the end;
quit_swallowed:R@K  under torchrun, rank R destroys its process group as step K starts and exits 0
               EXIT_S later; the others catch their failed all-reduce, print one line, exit 1
               (os._exit: a broken gloo group aborts an interpreter's exit); alone, as quit_rank;
slow_rank:R@K  rank R spends 0.2 s more on every step from K, before its ``forward`` record (a
               straggler: the others wait for it in the all-reduce);
nan@K          step K's loss is NaN: its row is logged (loss ``nan``), rank 0 writes the JSON
               ``.HALT`` (source ``nonfinite``), every rank a ``halt`` record, exit 4;
crash@K        RuntimeError in step K on every rank, exit 1;
malformed@K    step K's row has ``garbled`` for its loss, the run goes on;
missing_optional  env.json has world_size and contract_version only.

Profiling: it ignores CONTRACT_PROFILE_STEPS=N unless ``TEST_TRAINER_BUSY_CLAIM`` is set too; then
rank 0 writes, after its steps, profile.json claiming that gpu_busy_frac, and a GPU timeline
(gpu_timeline.json.gz) of N made-up steps of 10 ms, each busy for its first 5 ms only: busy 0.5,
a 5 ms pause a step. A claim other than 0.5 is a trainer whose figure its own timeline contradicts.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import socket
import sys
import time
from pathlib import Path

import trainer_faults

CONTRACT_VERSION = 2
COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"
TOKENS_PER_RANK = 256
#: a declared revision: this test trainer is not versioned on its own
REVISION = "test"
EXIT_OK, EXIT_NONFINITE = 0, 4


class Collective:
    """The mean of a number over the ranks: torch.distributed (gloo; NCCL on each rank's GPU with
    ``TEST_TRAINER_BACKEND=nccl``) under torchrun, else itself."""

    def __init__(self, world: int):
        self.world, self.dist, self.device = world, None, None
        if world > 1:
            import torch
            import torch.distributed as dist  # only here: alone, the trainer needs no torch

            # TEST_TRAINER_PG_TIMEOUT_S: the process group's timeout (torch's default where unset): a
            # collective waiting longer for a hung peer gives up (gloo raises, NCCL's watchdog aborts)
            limit = os.environ.get("TEST_TRAINER_PG_TIMEOUT_S")
            timeout = {"timeout": datetime.timedelta(seconds=float(limit))} if limit else {}
            if os.environ.get("TEST_TRAINER_BACKEND", "gloo") == "nccl":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
                torch.cuda.set_device(self.device)
                dist.init_process_group("nccl", device_id=self.device, **timeout)
            else:
                dist.init_process_group("gloo", **timeout)
            self.dist = dist

    def mean(self, value: float) -> float:
        if self.dist is None:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t)  # blocks until every rank joins: a hung rank stops the others here
        return float(t[0]) / self.world

    def close(self) -> None:
        if self.dist is not None:
            self.dist.destroy_process_group()


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("--steps", type=int, required=True)
    cli.add_argument("--out-dir", type=Path, required=True)
    cli.add_argument("--lr", type=float, default=3e-4)
    cli.add_argument("--stop-after", type=int, default=0)
    cli.add_argument("--resume-from", type=Path, default=None)
    args = cli.parse_args()
    first = 1
    if args.resume_from is not None:
        first = json.loads((args.resume_from / "checkpoint.json").read_text())["step"] + 1
    last = args.stop_after or args.steps
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    fault = trainer_faults.from_env(world)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        env = {"contract_version": CONTRACT_VERSION, "world_size": world, "git_sha": REVISION,
               "attention_backends": {"cmp": {"backend": "none"}}, "tokens_per_step": TOKENS_PER_RANK * world}
        if fault.kind == "missing_optional":
            env = {k: v for k, v in env.items() if k not in trainer_faults.OPTIONAL_ENV_KEYS}
        (out / "env.json").write_text(json.dumps(env))
        (out / "training.csv").write_text(COLUMNS + "\n")

    place = {"node": int(os.environ.get("GROUP_RANK", 0)), "host": socket.gethostname()}

    def beat(record: dict) -> None:
        if fault.mutes(rank, record["step"]):
            return
        with open(out / f"heartbeat_rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "rank": rank, "pid": os.getpid(), **place, **record}) + "\n")

    collective = Collective(world)
    try:
        for step in range(first, last + 1):
            t0 = time.time()
            if fault.kind == "quit_swallowed" and fault.quits(rank, step) and collective.dist is not None:
                collective.close()  # the others' all-reduce fails now, while this rank is still exiting
                time.sleep(trainer_faults.EXIT_S)
            fault.start_step(rank, step)
            beat({"step": step, "stage": "forward"})
            fault.in_step(rank, step)
            if fault.at("crash", step):
                raise RuntimeError(f"injected crash at step {step} on rank {rank}")
            time.sleep(0.01)
            try:
                loss = collective.mean(math.nan if fault.at("nan", step) else 5.0 / step)
            except RuntimeError:
                if fault.kind != "quit_swallowed":
                    raise
                print(f"rank {rank}: lost a peer, giving up", file=sys.stderr, flush=True)
                os._exit(1)
            dt = time.time() - t0
            beat({"step": step, "stage": "step", "loss": loss, "toks_per_s": TOKENS_PER_RANK * world / dt})
            if rank == 0:
                cell = trainer_faults.MALFORMED_CELL if fault.at("malformed", step) else f"{loss:.5f}"
                with open(out / "training.csv", "a") as f:
                    f.write(f"{step},{cell},{args.lr},{TOKENS_PER_RANK * world / dt:.1f},{dt:.4f},1.0,0.1,0.2\n")
            if not math.isfinite(loss):
                text = f"non-finite loss {loss} at step {step}"
                if rank == 0:
                    (out / ".HALT").write_text(json.dumps({"source": "nonfinite", "step": step, "losses": [loss],
                                                           "text": text}))
                else:
                    trainer_faults.await_halt(out)
                beat({"step": step, "stage": "halt", "reason": text})
                return EXIT_NONFINITE
            if fault.at("quit_early", step):
                break
        if last < args.steps and rank == 0:
            (out / "checkpoint.json").write_text(json.dumps({"step": last}))
        if rank == 0 and os.environ.get("CONTRACT_PROFILE_STEPS") and os.environ.get("TEST_TRAINER_BUSY_CLAIM"):
            write_profile(out, int(os.environ["CONTRACT_PROFILE_STEPS"]), float(os.environ["TEST_TRAINER_BUSY_CLAIM"]))
        return EXIT_OK
    finally:
        collective.close()

def write_profile(out: Path, steps: int, claim: float) -> None:
    """profile.json claiming ``claim`` and the timeline of ``steps`` steps half busy (see the
    module docstring)."""
    (out / "profile.json").write_text(json.dumps({
        "contract_version": CONTRACT_VERSION, "profiled_steps": steps, "first_step": 2, "wall_s": steps / 100,
        "gpu_busy_frac": claim, "top_ops": [{"name": "matmul", "ms_per_step": 5.0}], "nsa_ranges": ["nsa.sel"],
        "python_overhead_frac": 0.5, "cuda_graphs": False, "device": "cuda"}))
    with gzip.open(out / "gpu_timeline.json.gz", "wt") as fh:
        json.dump({"window_us": [0, steps * 10_000],
                   "device_intervals_us": [[i * 10_000, i * 10_000 + 5_000] for i in range(steps)]}, fh)


if __name__ == "__main__":
    raise SystemExit(main())
