"""A test trainer OUTSIDE the nsa package that behaves like the seed system's
``scripts/train_showcase.py`` as far as the harness can see (no model: the loss is a formula).

- config only from ``CONFIG=<yaml>`` (its ``train.out_dir``, ``train.steps``, ``train.log_every``,
  ``train.seq_len``); ``--steps`` overrides; unknown flags are ignored (``parse_known_args``);
- ``training.csv`` without header, ``step,loss,lr,toks_per_s`` every ``log_every`` steps (and step
  1) from rank 0, appended across runs;
- ``heartbeat_rank{R}.jsonl`` with ``ts``: a boot record from every rank, per-step records only
  with ``NSA_HEARTBEAT_EVERY=1`` (rank 0 always beats when it logs);
- ``env.json`` from every rank, without world size, commit or backends;
- a text ``.HALT`` (``halt: nan_loss``) and ``.anomaly_type`` on a non-finite loss, exit 0;
- ``stackdump_<epoch>.txt`` on SIGUSR1/SIGTERM (``traceback.format_stack`` per thread).

It imports no torch: under torchrun (RANK / WORLD_SIZE from the environment) its ranks do not
talk to each other.

Faults: ``TEST_TRAINER_FAULT`` (grammar in trainer_faults.py), here, in the seed's own format:
quit_early@K   exit 0 after step K (its row only if step K is a logged step);
hang_rank:R@K  rank R sleeps forever as step K starts, before its beat; the other ranks beat
               step K, then sleep in wait_for_peers (where the seed's DDP would wait);
hang_all@K     every rank sleeps forever as step K starts;
kill_rank:R@K  rank R SIGKILLs itself as step K starts, before its beat;
quit_rank:R@K  rank R exits 0 as step K starts, before its beat; the others sleep in wait_for_peers;
quit_in_step:R@K  rank R exits 0 after its beat of step K (with NSA_HEARTBEAT_EVERY=1), else as
               quit_rank; the others sleep in wait_for_peers;
slow_rank:R@K  rank R spends 0.2 s more on every step from K, before its beat;
nan@K          step K's loss is NaN: rank 0 logs its row (loss ``nan``), writes ``.anomaly_type``
               and the text ``.HALT``, and the run stops with exit 0, as the seed's does;
crash@K        RuntimeError in step K on every rank, exit 1;
malformed@K    rank 0 writes a row of step K with ``garbled`` for its loss (whether or not K is a
               logged step); the run goes on;
missing_optional  the seed's env.json never has git_sha, attention_backends or tokens_per_step:
               nothing changes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import yaml

import trainer_faults


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("--steps", type=int, default=None)
    cli.add_argument("--dataset", default="synthetic")
    args, _ = cli.parse_known_args()
    cfg = yaml.safe_load(Path(os.environ.get("CONFIG", "configs/default.yaml")).read_text())
    train = cfg["train"]
    out_dir = Path(train["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = args.steps or int(train["steps"])
    log_every, seq_len = int(train.get("log_every", 20)), int(train.get("seq_len", 128))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    fault = trainer_faults.from_env(world)

    def dump_stack(signum, frame):
        with open(out_dir / f"stackdump_{int(time.time())}.txt", "w") as f:
            f.write(f"Signal {signum} at {time.time()}\n")
            for th in threading.enumerate():
                f.write(f"\n--- Thread: {th.name} ({th.ident}) ---\n")
                stack = sys._current_frames().get(th.ident)
                if stack:
                    f.write("".join(traceback.format_stack(stack)))
        if signum == signal.SIGTERM:
            sys.exit(143)

    signal.signal(signal.SIGUSR1, dump_stack)
    signal.signal(signal.SIGTERM, dump_stack)
    (out_dir / "env.json").write_text(json.dumps({"torch": "none", "env": {
        k: v for k, v in os.environ.items() if k.startswith("NSA_") or k in ("WORLD_SIZE", "RANK", "CONFIG")}}))
    every = os.environ.get("NSA_HEARTBEAT_EVERY", "0") == "1"

    def beat(step: int, msg: str) -> None:
        with open(out_dir / f"heartbeat_rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"ts": time.time(), "rank": rank, "step": step, "msg": msg, "pid": os.getpid()}) + "\n")

    beat(0, "boot")
    last_log, tokens = time.time(), 0

    def log_row(step: int, loss: str) -> None:
        nonlocal last_log, tokens
        now = time.time()
        with open(out_dir / "training.csv", "a") as f:
            f.write(f"{step},{loss},{3e-4:.6e},{tokens / max(now - last_log, 1e-6):.0f}\n")
        last_log, tokens = now, 0
        beat(step, "progress")

    for step in range(1, steps + 1):
        fault.start_step(rank, step)
        if every:
            beat(step, "beat")
        fault.in_step(rank, step)
        if fault.peer_hangs(rank, step):
            trainer_faults.wait_for_peers()
        if fault.at("crash", step):
            raise RuntimeError(f"injected crash at step {step}")
        time.sleep(0.01)
        loss = float("nan") if fault.at("nan", step) else 5.5 / math.sqrt(step)
        tokens += 2 * seq_len * world
        if not math.isfinite(loss):
            if rank == 0:
                log_row(step, f"{loss:.6f}")
                (out_dir / ".anomaly_type").write_text("nan_loss\n")
                (out_dir / ".HALT").write_text("halt: nan_loss\n")
            break
        if rank == 0 and fault.at("malformed", step):
            log_row(step, trainer_faults.MALFORMED_CELL)
        elif rank == 0 and (step % log_every == 0 or step == 1):
            log_row(step, f"{loss:.6f}")
        if fault.at("quit_early", step):
            break
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
