"""A torch trainer for torchrun (gloo on CPU) whose ``main`` is wrapped in torch's
``torch.distributed.elastic.multiprocessing.errors.record``, as torchrun users commonly write it:
every rank's stack then has a torch/distributed frame at its bottom, whatever the rank is doing.
It writes the artifact contract (one all-reduce a step) and hangs one rank on request:

    python -m torch.distributed.run --nproc_per_node=2 -m validation.tests.record_trainer \
        --steps N --out-dir DIR [--config X --override Y]  (ignored: the harness's python launcher passes them)

    NSA_RECORD_HANG=R@S   rank R, at step S, after its ``backward`` record (the one every rank writes before the
                      step's all-reduce), sleeps in ``stuck_in_own_code`` until it is killed; the other ranks
                      wait for it in the all-reduce, their heartbeats at the same step and stage as its own
    NSA_RECORD_EXTRA=R@S  rank R, at step S, after its ``backward`` record, calls an all-reduce of its own in
                      ``sync_metrics`` on a side group (every rank makes it at the start) that no other rank
                      calls there: it waits in it, the others in the step's all-reduce, every heartbeat at the
                      same step and stage
    NSA_RECORD_SIZE=R@S   rank R, at step S, after its ``backward`` record, calls an all-reduce of 7 floats of its own
                      in ``log_metrics`` on the default group, where the others call the step's all-reduce of 1:
                      gloo's size check fires in the rank that receives the other size and aborts it
    NSA_RECORD_TWICE=R@S  rank R, at step S, after its ``backward`` record, all-reduces a copy of the step's loss in
                      ``log_loss`` on the default group: the same size as the step's all-reduce, so gloo pairs it
                      silently with the others' all-reduce of the step, and every later one with the others' of the
                      next step; the others complete the last step and exit 0 while rank R still waits in its
                      all-reduce of the last step, which then breaks ('Connection closed by peer')
    NSA_RECORD_QUIT=R@S   rank R ends its process (exit 0) after step S, a stop condition of its own: with
                      NSA_RECORD_TWICE at an earlier step, it leaves early having completed the step the rank
                      that called the extra collective then fails in ('Connection closed by peer')
    NSA_RECORD_LINGER=R@S rank R leaves its loop after step S, a stop condition of its own, and ends as a real
                      trainer does: it destroys its process group (its connections to the others close) and
                      returns from ``main``, and an atexit hook (``linger_in_teardown``, a logger flushing or an
                      uploader) keeps its interpreter's exit going for LINGER_S: the others' all-reduce of step S+1
                      breaks ('Connection closed by peer'), and torchrun ends rank R with SIGTERM while it is still
                      ending, not exit 0 (the race the other knobs leave out, below)
    NSA_RECORD_HOLD=1     each rank, after its last step, leaves its connections to the others open behind it
                      (``hold_connections``) and exits 0: a collective left without it then waits, as one does
                      under NCCL, instead of breaking ('Connection closed by peer' is gloo's word of the closed
                      socket); with NSA_RECORD_TWICE, rank R waits in its all-reduce of the last step until the
                      harness's stall watch stops the run

Every rank but NSA_RECORD_LINGER's ends with os._exit(0), whose exit status is set before its sockets close:
returning from ``main``, the interpreter's teardown can outlast a peer's broken collective, and torchrun then ends
the rank with SIGTERM, not exit 0 (a race of real trainers that the other knobs' tests leave out).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from validation.launch.tree import RUN_TOKENS

COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"
#: how long NSA_RECORD_LINGER's rank stays in its interpreter's exit: far longer than the others take to fail in
#: their broken all-reduce and torchrun's agent to see it (it looks at its workers every 0.1 s by default)
LINGER_S = 30


def stuck_in_own_code() -> None:
    """Where the hung rank stays: its own code (a loop of sleeps), no collective."""
    while True:
        time.sleep(1)


def sync_metrics(group: dist.ProcessGroup) -> None:
    """The extra collective: an all-reduce on a side group, which only the rank that diverged calls."""
    dist.all_reduce(torch.ones(1), group=group)


def log_metrics() -> None:
    """The extra collective of another size: an all-reduce of 7 floats on the default group, which only the rank
    that diverged calls, where the others call the step's all-reduce of the loss (1 float)."""
    dist.all_reduce(torch.ones(7))


def log_loss(loss: torch.Tensor) -> None:
    """The extra collective of the same size: an all-reduce of a copy of the step's loss on the default group, which
    only the rank that diverged calls (a rank-conditional logging call)."""
    dist.all_reduce(loss.clone())


def linger_in_teardown() -> None:
    """The end of a rank that stopped early of its own accord, as a real trainer's goes: its process group destroyed
    (its sockets to the others close at once) and an atexit hook still at work when ``main`` returns (a logger
    flushing, an uploader), which keeps the process alive for LINGER_S after its connections closed."""
    dist.destroy_process_group()
    atexit.register(time.sleep, LINGER_S)


def hold_connections() -> None:
    """Keeps this process's sockets (gloo's connections to the other ranks) open after it exits, until torchrun's
    agent ends: a child of it holds them, so the others' side of each connection sees no close. The child is no
    Python process and carries no RANK (``sh``, its environment the harness's token alone, by which the harness
    still ends it): the harness takes it for no rank, and this rank's process has ended, as under NCCL, where
    the ended rank leaves a collective that waits for it."""
    agent = os.getppid()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                os.set_inheritable(int(fd), True)
        except OSError:
            continue  # the listing's own descriptor, closed by now
    if os.fork() == 0:
        os.execve("/bin/sh", ["sh", "-c", f"while kill -0 {agent} 2>/dev/null; do sleep 0.2; done"],
                  {"PATH": os.environ.get("PATH", ""), RUN_TOKENS: os.environ.get(RUN_TOKENS, "")})


def _at(name: str) -> tuple[int, int]:
    """NSA_RECORD_HANG / NSA_RECORD_EXTRA / NSA_RECORD_SIZE / NSA_RECORD_TWICE / NSA_RECORD_QUIT / NSA_RECORD_LINGER's
    'R@S' as (rank, step); (-1, 0) where unset."""
    spec = os.environ.get(name, "")
    rank, step = (int(x) for x in spec.split("@")) if spec else (-1, 0)
    return rank, step


def _beat(out: Path, rank: int, step: int, stage: str) -> None:
    with open(out / f"heartbeat_rank{rank}.jsonl", "a") as fh:
        fh.write(json.dumps({"time": time.time(), "rank": rank, "pid": os.getpid(), "step": step,
                             "stage": stage}) + "\n")


@record
def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--config", default="")
    cli.add_argument("--override", default="")
    cli.add_argument("--steps", type=int, required=True)
    cli.add_argument("--out-dir", type=Path, required=True)
    args = cli.parse_args()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hang_rank, hang_step = _at("NSA_RECORD_HANG")
    extra_rank, extra_step = _at("NSA_RECORD_EXTRA")
    size_rank, size_step = _at("NSA_RECORD_SIZE")
    twice_rank, twice_step = _at("NSA_RECORD_TWICE")
    quit_rank, quit_step = _at("NSA_RECORD_QUIT")
    linger_rank, linger_step = _at("NSA_RECORD_LINGER")
    side = dist.new_group(backend="gloo")  # every rank makes a group, as new_group asks
    if rank == 0:
        (out / "env.json").write_text(json.dumps({"world_size": world, "git_sha": "test", "contract_version": 2}))
        (out / "training.csv").write_text(COLUMNS + "\n")
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        _beat(out, rank, step, "forward")
        loss = torch.tensor([5.0 / step])
        time.sleep(0.05)
        _beat(out, rank, step, "backward")
        if rank == hang_rank and step == hang_step:
            stuck_in_own_code()
        if rank == extra_rank and step == extra_step:
            sync_metrics(side)
        if rank == size_rank and step == size_step:
            log_metrics()
        if rank == twice_rank and step == twice_step:
            log_loss(loss)
        dist.all_reduce(loss)
        _beat(out, rank, step, "step")
        took = time.perf_counter() - began
        if rank == 0:
            with open(out / "training.csv", "a") as fh:
                fh.write(f"{step},{loss.item() / world:.5f},0.001,{64 * world / took:.1f},{took:.4f},1.0,0.1,0.2\n")
        if (rank, step) in ((quit_rank, quit_step), (linger_rank, linger_step)):
            break
    if rank == linger_rank:
        linger_in_teardown()
        return
    if os.environ.get("NSA_RECORD_HOLD") == "1":
        hold_connections()
    os._exit(0)  # its exit status set before its connections close (the module's docstring)


if __name__ == "__main__":
    main()
