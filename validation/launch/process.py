"""Launch one subprocess from an argument list, with a hard timeout that never hangs the caller.

The child runs in its own session (process group). On timeout the whole group first gets
SIGUSR1 (the trainer's faulthandler writes stackdump_rank*.txt on it), then, after a short grace,
SIGKILL; torchrun's workers are in the same group, so none is left behind. No shell is involved:
every argv element is passed to exec as is.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from validation.contract.files import tail

#: seconds between SIGUSR1 (stack dumps) and SIGKILL on timeout
DUMP_GRACE_S = 3.0
#: set on an interrupt (the CLI's SIGINT handler): every running ``run`` kills its process
#: group and raises KeyboardInterrupt, also in worker threads, which never see the signal
ABORT = threading.Event()
STDERR_TAIL_LINES = 40


@dataclass(frozen=True)
class ProcResult:
    argv: list[str]
    exit_code: int | None
    """None when the process was killed at the timeout."""
    timed_out: bool
    wall_s: float
    stdout_path: Path
    stderr_path: Path

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return tail(self.stderr_path, lines)


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float, log_dir: Path,
        log_name: str = "trainer", on_poll: Callable[[float], None] | None = None,
        poll_s: float = 0.25) -> ProcResult:
    """Run ``argv`` to completion or until ``timeout_s``; stdout/stderr go to log_dir."""
    argv = [str(a) for a in argv]
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{log_name}.stdout.log", log_dir / f"{log_name}.stderr.log"
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            err.write(f"cannot start {argv[0]}: {exc}\n".encode())
            return ProcResult(argv, 127, False, time.monotonic() - start, out_path, err_path)
        timed_out = False
        try:
            while True:
                try:
                    proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if ABORT.is_set():  # Ctrl-C in the CLI while this runs in a worker thread
                    raise KeyboardInterrupt
                elapsed = time.monotonic() - start
                if on_poll is not None:
                    on_poll(elapsed)
                if elapsed >= timeout_s:
                    timed_out = True
                    kill_group(proc)
                    break
        except BaseException:  # interrupted: the child's group must not outlive the harness
            kill_group(proc)
            raise
        finally:
            _reap_group(proc.pid)
    code = None if timed_out else proc.returncode
    if timed_out:
        with open(err_path, "ab") as err:
            err.write(f"\n[nsa-validate] killed after {timeout_s:.0f}s timeout (process group {proc.pid})\n".encode())
    return ProcResult(argv, code, timed_out, time.monotonic() - start, out_path, err_path)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGUSR1 (stack dumps) to the processes of the child's tree that handle it, a grace period,
    then SIGKILL to the whole tree. The tree, not just the process group: torchrun starts each
    worker in a session of its own, so killing torchrun's group alone would orphan the ranks;
    and torchrun itself has no SIGUSR1 handler (the signal would kill it before its workers)."""
    tree = _descendants(proc.pid)
    for pid in [proc.pid, *(pid for pid, _ in tree)]:
        if _catches(pid, signal.SIGUSR1):
            _signal(pid, signal.SIGUSR1)
    try:
        proc.wait(timeout=DUMP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_tree(proc.pid, tree)
    proc.wait()


def _reap_group(pgid: int) -> None:
    """Whatever the leader left running (orphaned workers, in its group or its tree) is killed."""
    _kill_tree(pgid, _descendants(pgid))


def _kill_tree(root: int, tree: list[tuple[int, int]]) -> None:
    _signal_group(root, signal.SIGKILL)
    for pid, _ in tree:
        _signal_group(pid, signal.SIGKILL)  # a worker leading its own session takes its group along
        _signal(pid, signal.SIGKILL)


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of every live process below ``root``, read from /proc (no psutil)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        parent = todo.pop()
        for pid in children.get(parent, []):
            out.append((pid, parent))
            todo.append(pid)
    return out


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status); a process without
    one would be killed by SIGUSR1 rather than dump its stacks."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
