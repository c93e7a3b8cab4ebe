"""A stand-in for Slurm's commands on a machine without Slurm, for the harness's Slurm launcher
(validation/launch/slurm.py) in the fault suite: the harness runs inside an allocation
(``SLURM_JOB_ID`` set by the test), and every node of it is this host.

It does what the harness reads of Slurm, as Slurm 22.05 does it (docs/guides/multi-node.md):

- ``srun``: one task per ``--ntasks`` (each a process here, with ``SLURM_PROCID`` and
  ``SLURM_NODEID`` its task id; not srun's descendant, as Slurm's slurmstepd, not srun, starts a
  task: each runs under a stand-in for slurmstepd that left srun's tree as it started, and tells
  srun the task's exit code through a file), ``--output``/``--error`` with ``%t`` as each task's files (else
  srun's own), and, as each task ends with a non-zero code, ``srun: error: HOST: task N: Exited
  with exit code C`` (``...: Killed`` for a SIGKILL) on its stderr at once while the other tasks
  run on (Slurm's default: no ``--kill-on-bad-exit``, an unlimited ``--wait``); it exits when
  every task has, with the highest code. ``FAKE_SLURM_CANCEL_AFTER=S``: the tasks of a step that
  runs torchrun are cancelled S seconds after they start, as by someone's ``scancel`` (slurmstepd's
  ``*** STEP J.S ON HOST CANCELLED AT T ***`` in each task's stderr, then SIGTERM).
  ``FAKE_SLURM_FREEZE_TASK=N``: task N of a step that runs
  torchrun is SIGSTOPped before it starts (a frozen node: it lives, says nothing, never joins).
- ``squeue``: the job ``RUNNING``, no steps and no node list (the harness then takes the hosts
  from its check step, and has no step to scancel: its own kill ends the point);
  ``FAKE_SLURM_NODELIST=A,B``: that node list (``--format=%N``).
- ``scontrol show config``: ``KillWait = 1``; ``show hostnames LIST``: LIST's names, a line each.
- ``scancel``: nothing (no step is ever listed); ``salloc``: refuses (the test's allocation is
  the one the harness runs in).

Each command is this module run by a two-line executable of its name that ``install`` writes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = ("srun", "squeue", "scancel", "scontrol", "salloc")
FREEZE_ENV = "FAKE_SLURM_FREEZE_TASK"
CANCEL_ENV = "FAKE_SLURM_CANCEL_AFTER"
NODELIST_ENV = "FAKE_SLURM_NODELIST"
_FREEZE = "import os, signal, sys; os.kill(os.getpid(), signal.SIGSTOP); os.execv(sys.argv[1], sys.argv[1:])"
_SIGNALS = {signal.SIGKILL: "Killed", signal.SIGTERM: "Terminated"}
#: slurmstepd's stand-in: forks, its first process exits (so the task is no descendant of srun),
#: the second runs the task (its argv from STEPD_ARGV, JSON, so that this process's own command
#: line does not look like the task's) and writes its exit code to argv[1]. With argv[2], a number
#: of seconds, it cancels the task then as Slurm does a step someone scancels: its banner into the
#: task's stderr, SIGTERM to the task.
STEPD_ARGV = "FAKE_SLURM_STEPD_ARGV"
_STEPD = ("import json, os, socket, subprocess, sys, time\n"
          "if os.fork():\n    os._exit(0)\n"
          f"task = subprocess.Popen(json.loads(os.environ.pop({STEPD_ARGV!r})))\n"
          "try:\n    task.wait(float(sys.argv[2]) if len(sys.argv) > 2 else None)\n"
          "except subprocess.TimeoutExpired:\n"
          "    at = time.strftime('%Y-%m-%dT%H:%M:%S')\n"
          "    print(f'slurmstepd-{socket.gethostname()}: error: *** STEP 4343.1 ON {socket.gethostname()} CANCELLED "
          "AT {at} ***', file=sys.stderr, flush=True)\n"
          "    task.terminate()\n"
          "code = task.wait()\n"
          "open(sys.argv[1] + '.tmp', 'w').write(str(code))\n"
          "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n")


def install(bin_dir: Path) -> Path:
    """Write an executable per Slurm command into ``bin_dir`` (to put first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\nimport sys; sys.path.insert(0, {str(repo)!r})\n"
                        f"from tests.faults.fake_slurm import main; sys.exit(main({tool!r}, sys.argv[1:]))\n")
        path.chmod(0o755)
    return bin_dir


def main(tool: str, args: list[str]) -> int:
    if tool == "srun":
        return srun(args)
    if tool == "squeue":
        return _print("RUNNING" if "--format=%T" in args else
                      os.environ.get(NODELIST_ENV, "") if "--format=%N" in args else "")
    if tool == "scontrol":
        if args[:2] == ["show", "hostnames"]:
            return _print("\n".join(args[2].split(",")))
        return _print("KillWait = 1" if args[:2] == ["show", "config"] else "")
    if tool == "scancel":
        return 0
    print("salloc: error: the fake Slurm grants no allocation", file=sys.stderr)
    return 1


def _print(text: str) -> int:
    if text:
        print(text)
    return 0


def srun(args: list[str]) -> int:
    opts: dict[str, str] = {}
    while args and args[0].startswith("-"):
        name, _, value = args.pop(0).partition("=")
        opts[name] = value
    command = args
    trainer = any("torch.distributed.run" in a for a in command)
    freeze = os.environ.get(FREEZE_ENV) if trainer else None
    cancel = [os.environ[CANCEL_ENV]] if trainer and os.environ.get(CANCEL_ENV) else []
    host = socket.gethostname().split(".")[0]
    # beside the fake's executables (a test's tmp_path): a srun the harness kills leaves it there, not in /tmp
    ends = Path(tempfile.mkdtemp(prefix="fake_srun_", dir=Path(sys.argv[0]).resolve().parent))
    tasks = range(int(opts.get("--ntasks", "1")))
    for t in tasks:
        env = {**os.environ, "SLURM_PROCID": str(t), "SLURM_NODEID": str(t), "SLURM_STEP_ID": "0"}
        argv = [sys.executable, "-c", _FREEZE, *command] if freeze == str(t) else command
        out = _open(opts.get("--output"), t)
        err = _open(opts.get("--error"), t)
        subprocess.run([sys.executable, "-c", _STEPD, str(ends / str(t)), *cancel],
                       env={**env, STEPD_ARGV: json.dumps(argv)}, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                       check=True)
    codes: dict[int, int] = {}
    while len(codes) < len(tasks):
        for t in tasks:
            if t not in codes and (ends / str(t)).is_file():
                codes[t] = code = int((ends / str(t)).read_text())
                if code > 0:
                    print(f"srun: error: {host}: task {t}: Exited with exit code {code}", file=sys.stderr, flush=True)
                elif code < 0:
                    what = _SIGNALS.get(-code, f"signal {-code}")
                    print(f"srun: error: {host}: task {t}: {what}", file=sys.stderr, flush=True)
        time.sleep(0.1)
    shutil.rmtree(ends)
    return max((c if c >= 0 else 128 - c for c in codes.values()), default=0)


def _open(pattern: str | None, task: int):
    return open(pattern.replace("%t", str(task)), "wb") if pattern else None
