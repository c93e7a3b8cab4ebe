"""The stall watchdog, stack dumps and the .HALT file.

Every rank runs one Watchdog. The loop calls ``beat()`` at each stage change. When a rank sees
no beat for ``timeout_s`` (a stalled rank stops beating; its peers stop too, blocked in the
next collective), or sees a .HALT written by another rank's watchdog, it:

1. writes all its threads' stacks to ``stackdump_rank{R}.txt`` (faulthandler),
2. writes ``.HALT`` (JSON with source "watchdog", rank, step, stage, idle seconds) if absent,
3. waits up to ``grace_s`` for every rank's stack dump to appear, then
4. exits the process with EXIT_WATCHDOG (os._exit: a hung collective cannot be unwound);
   torchrun then ends any rank still alive, so no process is orphaned.

Until the loop names its first steady step (``steady_from``) and a beat reaches it, the limit is
``max(timeout_s, startup_s)``: set-up and the first steps compile and capture, and every rank
waits in the same collectives for the slowest, so all ranks are on the start-up limit together.

A C-level backstop (faulthandler.dump_traceback_later with exit=True) fires a little later in
case the Python thread cannot run (the GIL held by a hung extension). SIGUSR1 dumps stacks to
the same file at any time without stopping the run (the runbook's "send SIGUSR1").

A suspended process is no stall: the watchdog thread, stopped too, sees on resuming that its
own wait overshot by far and does not count the time in which nothing ran. The backstop cannot
tell: faulthandler's C thread waits on the monotonic clock, which runs on while the process is
stopped, so on resuming it finds its deadline passed and ends the process before any Python code
runs (a SIGCONT handler included). Hence Ctrl-Z (SIGTSTP, which a process may catch) is taken by
the watchdog: its thread, woken by the signal's byte on a wakeup pipe (signal.set_wakeup_fd; a
main thread blocked in a collective or a CUDA sync need not return first), cancels the backstop,
stops the process with SIGSTOP and, once resumed, arms the backstop afresh (for its whole delay:
the idle time before the suspension is not counted against it, while the watchdog thread's
timeout_s still counts it). SIGSTOP itself (``kill -STOP``, a debugger) cannot be caught: a
SIGSTOP suspension longer than ``timeout_s + grace_s + max(10, 4 * poll_s)`` still ends the run on
resuming (exit 1 with a "Timeout" stack dump; no .HALT), and so does a Ctrl-Z of a process whose
Python threads cannot run (a hang holding the GIL, which the backstop ends anyway). Ctrl-Z is
taken only while the watchdog is enabled, from the main thread, and where neither SIGTSTP is
ignored nor a wakeup fd set already; a SIGTSTP then stops the process even in an orphaned process
group (where the kernel discards a default one).
"""
from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

from .. import contract
from .config import WatchdogConfig

EXIT_WATCHDOG = contract.EXIT_WATCHDOG
#: the watchdog thread's wait overshooting by more than this (and poll_s) means it did not run:
#: the process was suspended. A thread kept waiting for the GIL is late by milliseconds.
SUSPENDED_AFTER_S = 2.0
HALT_NAME = contract.HALT


def halt_path(out_dir: Path) -> Path:
    return Path(out_dir) / HALT_NAME


def stackdump_path(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / contract.stackdump_name(rank)


def write_halt(out_dir: Path, record: dict) -> bool:
    """Create .HALT with a JSON record; False when it already exists (the first reason stands).
    Written to a file of its own first and then linked into place, so that no reader (another
    rank's watchdog, the harness) ever sees it empty or half-written."""
    path = halt_path(out_dir)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps(record) + "\n")
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def read_halt(out_dir: Path) -> dict | None:
    """The .HALT record: None when absent; {"source": "operator"} for a file that is not a
    trainer-written JSON record (an operator's ``touch .HALT``)."""
    path = halt_path(out_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        return {"source": "operator", "text": text[:200]}
    return rec if isinstance(rec, dict) and "source" in rec else {"source": "operator", "text": text[:200]}


def _taken_by_the_watchdog_thread(signum, frame) -> None:
    """SIGTSTP's Python handler: nothing to do in the main thread. Installed so that SIGTSTP's
    default (stop at once, the backstop armed) is not taken and its byte reaches the wakeup pipe."""


class Watchdog:
    def __init__(self, cfg: WatchdogConfig, out_dir: Path, rank: int, world_size: int):
        self.cfg, self.out_dir, self.rank, self.world = cfg, Path(out_dir), rank, world_size
        self._dump = open(stackdump_path(out_dir, rank), "a", buffering=1)
        self._last = time.monotonic()
        self.step, self.stage = 0, "setup"
        self._steady_step: int | None = None  # None: the start-up limit holds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop = threading.Lock()  # arming, and disarming for a Ctrl-Z, one thread at a time
        self._suspending = False
        self._wakeup: tuple[int, int] | None = None  # the pipe the signals' bytes arrive on, once Ctrl-Z is taken
        self._tstp_previous = signal.SIG_DFL  # SIGTSTP's handler before, restored by close()
        self._sigusr1 = hasattr(signal, "SIGUSR1")
        if self._sigusr1:
            faulthandler.register(signal.SIGUSR1, file=self._dump, all_threads=True, chain=False)

    def start(self) -> None:
        if not self.cfg.enabled:
            return
        self._take_ctrl_z()
        self._thread = threading.Thread(target=self._run, name="nsa-watchdog", daemon=True)
        self._thread.start()
        self._arm_backstop()

    def _take_ctrl_z(self) -> None:
        """Route SIGTSTP to the watchdog thread (see the module's docstring), where it can be."""
        if (not hasattr(signal, "SIGTSTP") or threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGTSTP) == signal.SIG_IGN):
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's: leave Ctrl-Z be
            signal.set_wakeup_fd(-1)
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)
        previous = signal.signal(signal.SIGTSTP, _taken_by_the_watchdog_thread)
        self._tstp_previous = signal.SIG_DFL if previous is None else previous  # None: one set from C

    def steady_from(self, step: int) -> None:
        """From a beat at ``step`` on, the limit is timeout_s (the steps before it: startup_s)."""
        self._steady_step = step

    def limit(self) -> tuple[float, str]:
        """The seconds without a beat that fire the watchdog now, and the setting they come from."""
        if self._steady_step is not None and self.step >= self._steady_step:
            return self.cfg.timeout_s, "watchdog.timeout_s"
        if self.cfg.startup_s > self.cfg.timeout_s:
            return self.cfg.startup_s, "watchdog.startup_s"
        return self.cfg.timeout_s, "watchdog.timeout_s"

    def _arm_backstop(self) -> None:
        with self._backstop:
            if self.cfg.enabled and not self._suspending:
                delay = self.limit()[0] + self.cfg.grace_s + max(10.0, 4 * self.cfg.poll_s)
                faulthandler.dump_traceback_later(delay, exit=True, file=self._dump)

    def _suspend(self) -> None:
        """Ctrl-Z: stop the process with the backstop disarmed; armed again once resumed."""
        with self._backstop:
            self._suspending = True
            faulthandler.cancel_dump_traceback_later()
        try:
            os.kill(os.getpid(), signal.SIGSTOP)  # returns once the process is continued
        finally:
            with self._backstop:
                self._suspending = False
            self._arm_backstop()

    def beat(self, step: int, stage: str) -> None:
        """Progress: called at every stage change."""
        self._last = time.monotonic()
        self.step, self.stage = step, stage
        self._arm_backstop()

    def clear_dump(self) -> None:
        """Empty this rank's stack dump file (a run starting afresh over an earlier one's dump)."""
        self._dump.truncate(0)

    def _wait(self) -> bool:
        """Wait a poll (less when a signal's byte arrives; Ctrl-Z's suspends the process first);
        False once closed."""
        if self._wakeup is None:
            return not self._stop.wait(self.cfg.poll_s)
        if select.select([self._wakeup[0]], [], [], self.cfg.poll_s)[0]:
            if int(signal.SIGTSTP) in os.read(self._wakeup[0], 512):
                self._suspend()
        return not self._stop.is_set()

    def _run(self) -> None:
        polled = time.monotonic()
        while self._wait():
            now = time.monotonic()
            overshoot = now - polled - self.cfg.poll_s  # the check and the wait: a poll, give or take
            polled, last = now, self._last
            if overshoot > max(self.cfg.poll_s, SUSPENDED_AFTER_S) and last < now - overshoot:
                # This thread did not run for far longer than a poll: the process was suspended
                # (Ctrl-Z, SIGSTOP) and has just been resumed, before the main thread's next beat.
                # Time in which no thread ran is no stall of the main thread: the clock moves on
                # by it, and the idle time from before the suspension still counts.
                self._last = last + overshoot
            idle = now - self._last
            limit, key = self.limit()
            if idle > limit:
                self.fire(f"no progress for {idle:.1f}s ({key}={limit:g})")
            halt = read_halt(self.out_dir)
            if halt and halt.get("source") == contract.HALT_WATCHDOG and halt.get("rank") != self.rank:
                self.fire(f"rank {halt.get('rank')}'s watchdog fired: {halt.get('reason')}")

    def fire(self, reason: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._dump.write(
            f"=== watchdog rank {self.rank} at {now}: {reason}; last progress: step {self.step}, "
            f"stage {self.stage} ===\n"
        )
        faulthandler.dump_traceback(file=self._dump, all_threads=True)
        self._dump.flush()
        write_halt(self.out_dir, {
            "source": contract.HALT_WATCHDOG, "rank": self.rank, "step": self.step, "stage": self.stage,
            "reason": reason, "time": time.time(),
            "text": f"rank {self.rank}: {reason} at step {self.step} stage {self.stage}",
        })
        print(f"[watchdog] rank {self.rank}: {reason} at step {self.step} stage {self.stage}; "
              f"stacks in {stackdump_path(self.out_dir, self.rank)}; exiting {EXIT_WATCHDOG}",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + self.cfg.grace_s
        while time.monotonic() < deadline and not all(
            stackdump_path(self.out_dir, r).exists() and stackdump_path(self.out_dir, r).stat().st_size > 0
            for r in range(self.world)
        ):
            time.sleep(0.1)
        os._exit(EXIT_WATCHDOG)

    def close(self) -> None:
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.cfg.poll_s + 1)
        if self._wakeup is not None:  # Ctrl-Z back to its default, the backstop gone
            signal.signal(signal.SIGTSTP, self._tstp_previous)
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None
        if self._sigusr1:
            faulthandler.unregister(signal.SIGUSR1)
        self._dump.close()
        # an empty dump file is noise, not evidence
        path = stackdump_path(self.out_dir, self.rank)
        if path.exists() and path.stat().st_size == 0:
            path.unlink()
