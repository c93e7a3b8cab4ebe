"""Launch one subprocess from an argument list and supervise it until it ends, never hanging the
caller and never leaving a process of it behind.

The child starts in its own session; its whole tree is tracked (validation/launch/tree.py) and
killed when the run ends in any way: on the phase timeout, on a stall (a watched trainer whose
step stops growing for ``stall_s``, validation/launch/watch.py), on an interrupt (Ctrl-C,
SIGTERM or SIGHUP in the CLI: ``ABORT``, or a KeyboardInterrupt in the calling thread), and after
a normal exit (whatever the trainer left running). Before killing a stalled or timed-out trainer
the harness takes every rank's stack (validation/launch/stacks.py). No shell is involved: every
argv element is passed to exec as is.
"""
from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from validation.contract.files import tail
from validation.contract.stacks import HARNESS_STACKS, TakenStack
from validation.launch import stacks
from validation.launch.tree import ProcessTree
from validation.launch.watch import StepWatch, Watch

#: set on an interrupt (the CLI's stop-signal handler): every running ``run`` kills its tree and
#: raises KeyboardInterrupt, also in worker threads, which never see the signal
ABORT = threading.Event()
STDERR_TAIL_LINES = 40


@dataclass(frozen=True)
class ProcResult:
    argv: list[str]
    exit_code: int | None
    """None when the harness killed the process (timeout or stall)."""
    timed_out: bool
    wall_s: float
    stdout_path: Path
    stderr_path: Path
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped a stalled run; None when it did not."""
    stacks: list[TakenStack] = field(default_factory=list)
    """The stacks taken before a stalled or timed-out watched run was killed."""

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return tail(self.stderr_path, lines)


@dataclass(frozen=True)
class _Stop:
    """Why the harness stopped a process that was still running."""

    timed_out: bool
    stalled_s: float | None
    note: str


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float, log_dir: Path,
        log_name: str = "trainer", on_poll: Callable[[float], None] | None = None,
        poll_s: float = 0.25, watch: Watch | None = None) -> ProcResult:
    """Run ``argv`` to completion, or until ``timeout_s`` or (with ``watch``) a stall; stdout and
    stderr go to log_dir. An interrupt kills the tree and raises KeyboardInterrupt."""
    argv = [str(a) for a in argv]
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{log_name}.stdout.log", log_dir / f"{log_name}.stderr.log"
    if ABORT.is_set():  # interrupted before this point started: start nothing
        raise KeyboardInterrupt
    tree = ProcessTree()
    start = time.monotonic()
    stop: _Stop | None = None
    taken: list[TakenStack] = []
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            try:
                proc = subprocess.Popen(argv, cwd=cwd, env=tree.environment(env), stdout=out, stderr=err,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                err.write(f"cannot start {argv[0]}: {exc}\n".encode())
                return ProcResult(argv, 127, False, time.monotonic() - start, out_path, err_path)
            tree.adopt(proc.pid)
            stop = _supervise(proc, tree, start, timeout_s, poll_s, on_poll, watch)
            if stop is not None:
                if watch is not None:
                    taken = stacks.take(stacks.ranked(tree.members(), tree.root, watch.single_process), watch.run_dir,
                                        stop.note)
                _kill(tree)
                proc.wait()
                err.write(f"\n[nsa-validate] {stop.note}: {_stacks_note(taken)}process tree killed "
                          f"(root pid {proc.pid})\n".encode())
        finally:
            _kill(tree)  # on an interrupt, and whatever a finished trainer left running
    wall = time.monotonic() - start
    if stop is not None:
        return ProcResult(argv, None, stop.timed_out, wall, out_path, err_path, stop.stalled_s, taken)
    return ProcResult(argv, proc.returncode, False, wall, out_path, err_path)


def _supervise(proc: subprocess.Popen, tree: ProcessTree, start: float, timeout_s: float, poll_s: float,
               on_poll: Callable[[float], None] | None, watch: Watch | None) -> _Stop | None:
    """Poll until the process exits (None), the timeout or a stall (the reason to stop it)."""
    steps = StepWatch(watch.progress_dir, watch.csv) if watch is not None else None
    last_progress = start
    while True:
        try:
            proc.wait(timeout=poll_s)
            return None
        except subprocess.TimeoutExpired:
            pass
        if ABORT.is_set():  # Ctrl-C in the CLI while this runs in a worker thread
            raise KeyboardInterrupt
        tree.poll()
        now = time.monotonic()
        elapsed = now - start
        if on_poll is not None:
            on_poll(elapsed)
        if steps is not None:
            if steps.look():
                last_progress = now
            quiet = now - last_progress
            first = steps.highest is None
            limit = watch.startup_s if first else watch.stall_s
            if quiet >= limit:
                at = "before its first step" if first else f"after step {steps.highest}"
                key = "startup_s" if first else "stall_s"
                return _Stop(False, round(quiet, 1), f"no progress for {quiet:.0f}s {at} ({key} {limit:g})")
        if elapsed >= timeout_s:
            return _Stop(True, None, f"killed after {timeout_s:.0f}s timeout")


def _stacks_note(taken: list[TakenStack]) -> str:
    if not taken:
        return ""
    methods = sorted({t.method for t in taken})
    return f"stacks of {len(taken)} process(es) taken ({', '.join(methods)}; {HARNESS_STACKS}/index.json); "


def _kill(tree: ProcessTree) -> None:
    """Kill the tree; a second interrupt while it sweeps restarts the sweep rather than cut it
    short (leaving survivors), and is raised once the tree is dead."""
    pending: BaseException | None = None
    while True:
        try:
            tree.kill()
            break
        except KeyboardInterrupt as exc:
            pending = exc
    if pending is not None:
        raise pending
