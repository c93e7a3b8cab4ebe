"""A tiny gloo all-reduce for probing launchers (torchrun, srun of torchrun, two torchrun agents).

Run it as torchrun's entry point. Each rank prints one JSON line (``PROBE {...}``) with its rank,
world size, the all-reduce result (sum of 1..world, expected world*(world+1)/2), its pid, session
and process group, and the SLURM_* / torchrun variables it sees. Faults, for probing what the
launchers do with them (all through the environment, so srun and torchrun pass them unchanged):

  PROBE_HOLD_S=N       sleep N seconds before the all-reduce (a long-running step to cancel)
  PROBE_FAULT=hang     the rank PROBE_FAULT_RANK (default 1) sleeps forever before the all-reduce
  PROBE_FAULT=exit     that rank exits with code 3 before the all-reduce
  PROBE_FAULT=kill     that rank sends itself SIGKILL before the all-reduce
  PROBE_FAULT_AFTER_S  seconds that rank waits before its fault (default 0)
  PROBE_SIGNAL_LOG=F   append "<unix time> rank=R pid=P SIGNAME" to F for each of SIGTERM, SIGINT,
                       SIGHUP, SIGQUIT, SIGCONT, SIGUSR1, SIGUSR2 the rank receives, then act as
                       without a handler (re-raise with the default action; SIGCONT continues)
  PROBE_IGNORE_TERM=1  with PROBE_SIGNAL_LOG: log SIGTERM and SIGINT but ignore them (a rank stuck
                       in native code that will not die before SIGKILL)
  PROBE_OUT_DIR=DIR    also write the JSON line to DIR/rank{R}.json (stdout lines of several ranks
                       sharing one srun task can interleave), and DIR/rank{R}.started (pid, sid,
                       SLURM_JOB_ID) once the process group is up
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

ENV_KEYS = (
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES",
    "SLURM_NTASKS", "SLURM_JOB_NAME", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_NODELIST", "SLURM_CPUS_ON_NODE",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
)


def log_signals(path: str, rank: int, ignore_term: bool) -> None:
    def handler(signum, _frame):
        with open(path, "a") as f:
            f.write(f"{time.time():.3f} rank={rank} pid={os.getpid()} {signal.Signals(signum).name}\n")
        if signum == signal.SIGCONT or (ignore_term and signum in (signal.SIGTERM, signal.SIGINT)):
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCONT,
                signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, handler)


def main() -> int:
    rank = int(os.environ["RANK"])
    if os.environ.get("PROBE_SIGNAL_LOG"):
        log_signals(os.environ["PROBE_SIGNAL_LOG"], rank, os.environ.get("PROBE_IGNORE_TERM") == "1")
    world = int(os.environ["WORLD_SIZE"])
    hold = float(os.environ.get("PROBE_HOLD_S", "0"))
    fault = os.environ.get("PROBE_FAULT", "")
    fault_rank = int(os.environ.get("PROBE_FAULT_RANK", "1"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("PROBE_PG_TIMEOUT_S", "1800"))))
    print(f"PROBE-START rank={rank} pid={os.getpid()} sid={os.getsid(0)} pgid={os.getpgid(0)}", flush=True)
    out_dir = os.environ.get("PROBE_OUT_DIR")
    if out_dir:
        started = {"rank": rank, "pid": os.getpid(), "sid": os.getsid(0), "job": os.environ.get("SLURM_JOB_ID")}
        tmp = os.path.join(out_dir, f".rank{rank}.started")
        with open(tmp, "w") as f:
            f.write(json.dumps(started) + "\n")
        os.replace(tmp, os.path.join(out_dir, f"rank{rank}.started"))
    if hold:
        end = time.monotonic() + hold
        while time.monotonic() < end:  # a handler that returns (SIGCONT, ignored SIGTERM) ends sleep()
            time.sleep(max(0.0, min(1.0, end - time.monotonic())))
    if fault and rank == fault_rank:
        time.sleep(float(os.environ.get("PROBE_FAULT_AFTER_S", "0")))
        print(f"PROBE-FAULT rank={rank} {fault}", flush=True)
        if fault == "hang":
            while True:
                time.sleep(3600)
        elif fault == "exit":
            sys.exit(3)
        elif fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    info = {
        "rank": rank, "world": world, "allreduce": t.item(), "expected": world * (world + 1) / 2,
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
    }
    line = json.dumps(info, sort_keys=True)
    print("PROBE " + line, flush=True)
    if out_dir:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            f.write(line + "\n")
    dist.destroy_process_group()
    return 0 if t.item() == world * (world + 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
