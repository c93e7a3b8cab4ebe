"""A minimal test trainer OUTSIDE the nsa package that writes the artifact contract (version 2)
natively but otherwise unlike native_train.py: configured by environment variables only (no
flags), a row every few steps, a heartbeat per logged step, never any torch. No model: the loss
is a formula, a step ~10 ms.

    MINIMAL_STEPS=N MINIMAL_OUT_DIR=DIR [MINIMAL_LOG_EVERY=5] python minimal_train.py
    MINIMAL_STEPS=N MINIMAL_OUT_DIR=DIR torchrun --standalone --nproc_per_node=2 minimal_train.py

Writes: ``env.json`` (rank 0, first); ``training.csv`` (rank 0, the csv module, the contract's
header, a row every MINIMAL_LOG_EVERY steps and for the last step it completes, whatever the
interval); ``heartbeat_rank{R}.jsonl`` (every rank: a ``start`` record, then a ``step`` record
per logged step). RANK / WORLD_SIZE come from the environment; the ranks do not talk to each
other. A missing or bad variable is exit 2.

Faults: ``TEST_TRAINER_FAULT`` (grammar in trainer_faults.py), here:
quit_early@K   step K is logged as a last step, exit 0, no .HALT;
hang_rank:R@K  rank R sleeps forever as step K starts; the others stop in step K, asleep in
               wait_for_peers (nothing more written by any rank);
hang_all@K     every rank sleeps forever as step K starts;
kill_rank:R@K  rank R SIGKILLs itself as step K starts;
quit_rank:R@K  rank R exits 0 as step K starts; the others stop in step K, asleep in wait_for_peers;
quit_in_step:R@K  rank R writes a ``data`` record of step K (step K in progress: this trainer's
               only stage record), then exits 0; the others stop as for quit_rank;
slow_rank:R@K  rank R spends 0.2 s more on every step from K;
nan@K          step K is logged with loss ``nan``, rank 0 writes the JSON ``.HALT`` (source
               ``nonfinite``), exit 4;
crash@K        RuntimeError in step K on every rank, exit 1;
malformed@K    step K is logged, with ``garbled`` for its loss; the run goes on;
missing_optional  env.json has world_size and contract_version only.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import trainer_faults

HEADER = ["step", "loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb"]
ROWS_PER_STEP, SEQ_LEN = 4, 64
LR = 1e-3


class Run:
    def __init__(self, out: Path, steps: int, log_every: int, rank: int, world: int):
        self.out, self.steps, self.log_every, self.rank, self.world = out, steps, log_every, rank, world
        self.fault = trainer_faults.from_env(world)
        self.tokens_per_step = ROWS_PER_STEP * SEQ_LEN * world
        out.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            self.write_env()
            with open(out / "training.csv", "w", newline="") as fh:
                csv.writer(fh).writerow(HEADER)
        self.heartbeat(0, "start")

    def write_env(self) -> None:
        env = {"contract_version": 2, "world_size": self.world, "git_sha": "test",
               "attention_backends": {"sel": {"backend": "formula"}}, "tokens_per_step": self.tokens_per_step}
        if self.fault.kind == "missing_optional":
            for key in trainer_faults.OPTIONAL_ENV_KEYS:
                del env[key]
        (self.out / "env.json").write_text(json.dumps(env, indent=1))

    def heartbeat(self, step: int, stage: str, **extra) -> None:
        rec = {"time": time.time(), "rank": self.rank, "pid": os.getpid(), "step": step, "stage": stage, **extra}
        with open(self.out / f"heartbeat_rank{self.rank}.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    def log(self, step: int, loss: float, seconds: float) -> None:
        self.heartbeat(step, "step", loss=loss)
        if self.rank != 0:
            return
        cell = trainer_faults.MALFORMED_CELL if self.fault.at("malformed", step) else repr(loss)
        with open(self.out / "training.csv", "a", newline="") as fh:
            csv.writer(fh).writerow([step, cell, LR, self.tokens_per_step / seconds, seconds, 0.5, 0.0, 0.0])

    def train(self) -> int:
        for step in range(1, self.steps + 1):
            start = time.monotonic()
            self.fault.start_step(self.rank, step)
            if self.fault.quits_in_step(self.rank, step):
                self.heartbeat(step, "data")
                self.fault.in_step(self.rank, step)
            if self.fault.peer_hangs(self.rank, step):
                trainer_faults.wait_for_peers()
            if self.fault.at("crash", step):
                raise RuntimeError(f"injected crash in step {step}")
            time.sleep(0.01)
            loss = math.nan if self.fault.at("nan", step) else 4.0 * math.exp(-step / 50)
            last = step == self.steps or self.fault.at("quit_early", step) or not math.isfinite(loss)
            if last or step % self.log_every == 0 or self.fault.at("malformed", step):
                self.log(step, loss, time.monotonic() - start)
            if not math.isfinite(loss):
                if self.rank == 0:
                    (self.out / ".HALT").write_text(json.dumps({"source": "nonfinite", "step": step,
                                                                "text": f"loss {loss} at step {step}"}))
                else:
                    trainer_faults.await_halt(self.out)
                return 4
            if last:
                return 0
        return 0


def _int_env(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        number = int(value)
        if number < 1:
            raise ValueError
        return number
    except (TypeError, ValueError):
        print(f"error: {name}={value!r}: expected a positive integer", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> int:
    out = os.environ.get("MINIMAL_OUT_DIR")
    if not out:
        print("error: MINIMAL_OUT_DIR is not set", file=sys.stderr)
        return 2
    run = Run(Path(out), _int_env("MINIMAL_STEPS"), _int_env("MINIMAL_LOG_EVERY", 5),
              int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    return run.train()


if __name__ == "__main__":
    raise SystemExit(main())
