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

SIGTERM (a scheduler's preemption: Slurm's scancel, Kubernetes' pod deletion, torchrun passing
either on) is taken the same way, while the watchdog is enabled: its thread sets
``terminate_requested``, which the loop reads at each step's stats exchange, so that every rank
stops after the same step, saves it and ends by SIGTERM (nsa/train/cli.py). A main thread that
cannot get there (blocked in a collective whose peer is gone: torchrun SIGTERMs the survivors of
a failed rank) is ended by SIGTERM's default action from the watchdog's thread once
``term_grace_s`` has passed since the first SIGTERM, before torchrun's or Slurm's SIGKILL (30 s
after their SIGTERM by default): a rank killed by SIGTERM is a peer's collateral stop to torchrun
and the harness, one killed by SIGKILL a failure of its own. Further SIGTERMs change nothing.
A SIGTERM during set-up (before the loop names its first steady step: reading the data, building
and compiling the model, loading a checkpoint) ends the process by SIGTERM at once: there is no
step to finish and nothing to save.
"""
from __future__ import annotations

import ctypes
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
from . import strict_json
from nsa.atomic import write_atomic
from .config import WatchdogConfig

EXIT_WATCHDOG = contract.EXIT_WATCHDOG
#: the watchdog thread's wait overshooting by more than this (and poll_s) means it did not run:
#: the process was suspended. A thread kept waiting for the GIL is late by milliseconds.
SUSPENDED_AFTER_S = 2.0
#: the byte close() writes to the wakeup pipe: no signal's number, so the thread reads it as none
_CLOSING = 0
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
        tmp.write_text(strict_json.dumps(record) + "\n")
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
    """SIGTSTP's and SIGTERM's Python handler: nothing to do in the main thread. Installed so that
    their default (stop at once, the backstop armed; end at once) is not taken and their byte
    reaches the wakeup pipe."""


def end_by_default(signum: int) -> None:
    """End the process by ``signum``'s default action, from any thread: signal.signal works only
    in the main thread, which may be the one that is blocked, so the disposition is reset in C."""
    libc = ctypes.CDLL(None)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(int(signum), int(signal.SIG_DFL))
    os.kill(os.getpid(), signum)
    time.sleep(5)  # the signal is delivered at once; never go back to a loop that cannot stop
    os._exit(128 + int(signum))


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
        self._wakeup: tuple[int, int] | None = None  # the pipe the signals' bytes arrive on, once taken
        self._previous: dict[int, object] = {}  # each signal taken: its handler before, restored by close()
        self.terminate_requested = False  # a SIGTERM arrived: the loop stops after the step in flight
        self._term_at: float | None = None  # when the first one did
        self._sigusr1 = hasattr(signal, "SIGUSR1")
        if self._sigusr1:
            faulthandler.register(signal.SIGUSR1, file=self._dump, all_threads=True, chain=False)

    def start(self) -> None:
        if not self.cfg.enabled:
            return
        self._take_signals()
        self._thread = threading.Thread(target=self._run, name="nsa-watchdog", daemon=True)
        self._thread.start()
        self._arm_backstop()

    def _take_signals(self) -> None:
        """Route SIGTSTP and SIGTERM to the watchdog thread (see the module's docstring), where
        they can be: from the main thread, where no one else set a wakeup fd, each signal unless
        it is ignored (nohup, a parent's choice)."""
        wanted = [s for s in ("SIGTSTP", "SIGTERM") if hasattr(signal, s)]
        if not wanted or threading.current_thread() is not threading.main_thread():
            return
        wanted = [getattr(signal, s) for s in wanted if signal.getsignal(getattr(signal, s)) != signal.SIG_IGN]
        if not wanted:
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's: leave the signals be
            signal.set_wakeup_fd(-1)
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)
        for signum in wanted:
            previous = signal.signal(signum, _taken_by_the_watchdog_thread)
            self._previous[signum] = signal.SIG_DFL if previous is None else previous  # None: one set from C

    def steady_from(self, step: int) -> None:
        """The loop starts: from a beat at ``step`` on, the limit is timeout_s (the steps before it:
        startup_s). Before this call a SIGTERM ends the process at once (set-up has nothing to save)."""
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
            stopped_at = time.monotonic()
            os.kill(os.getpid(), signal.SIGSTOP)  # returns once the process is continued
            last = self._last
            if last <= stopped_at:
                # no beat since: the time stopped is no idle time. _run's own test for a suspension
                # misses it where the main thread beat after this thread's poll was due (it kept
                # the GIL while this thread, woken by the signal, waited for it)
                self._last = last + (time.monotonic() - stopped_at)
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
        """Wait a poll (less when a signal's byte or close()'s arrives; Ctrl-Z's suspends the process
        first); False once closed."""
        if self._wakeup is None:
            return not self._stop.wait(self.cfg.poll_s)
        if select.select([self._wakeup[0]], [], [], self.cfg.poll_s)[0]:
            arrived = os.read(self._wakeup[0], 512)
            if int(signal.SIGTERM) in arrived and self._term_at is None:
                self._term_at = time.monotonic()
                if self._steady_step is None:
                    self._end_in_set_up()
                self.terminate_requested = True
                print(f"[rank {self.rank}] SIGTERM: stopping after this step and saving a checkpoint "
                      f"(within watchdog.term_grace_s={self.cfg.term_grace_s:g}s, else ending at once)",
                      file=sys.stderr, flush=True)
            if int(signal.SIGTSTP) in arrived:
                self._suspend()
        return not self._stop.is_set()

    def _end_in_set_up(self) -> None:
        """A SIGTERM before the loop started (steady_from): no step to finish, nothing to save.
        Waiting for a step that will not come held the process for term_grace_s, saying it would
        save a checkpoint."""
        print(f"[rank {self.rank}] SIGTERM during set-up, before the first step: nothing to save; ending by "
              "SIGTERM now", file=sys.stderr, flush=True)
        faulthandler.cancel_dump_traceback_later()
        self._drop_empty_dump()
        self._record_status("ended by SIGTERM during set-up, before the first step")
        end_by_default(signal.SIGTERM)

    def _end_if_term_overdue(self, now: float) -> None:
        """A SIGTERM the run has not stopped for within term_grace_s: end by SIGTERM now."""
        if self._term_at is None or now - self._term_at <= self.cfg.term_grace_s:
            return
        print(f"[rank {self.rank}] SIGTERM: the run did not stop within watchdog.term_grace_s="
              f"{self.cfg.term_grace_s:g}s (last progress: step {self.step}, stage {self.stage}); ending by "
              "SIGTERM; the last checkpoint saved is the one to resume from", file=sys.stderr, flush=True)
        faulthandler.cancel_dump_traceback_later()
        self._record_status(f"ended by SIGTERM at step {self.step} stage {self.stage}: not stopped within "
                            f"watchdog.term_grace_s={self.cfg.term_grace_s:g}s")
        end_by_default(signal.SIGTERM)

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
            self._end_if_term_overdue(now)
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
        self._record_status(f"watchdog: {reason} at step {self.step} stage {self.stage}; exit {EXIT_WATCHDOG}")
        deadline = time.monotonic() + self.cfg.grace_s
        while time.monotonic() < deadline and not all(
            stackdump_path(self.out_dir, r).exists() and stackdump_path(self.out_dir, r).stat().st_size > 0
            for r in range(self.world)
        ):
            time.sleep(0.1)
        os._exit(EXIT_WATCHDOG)

    def _record_status(self, status: str) -> None:
        """Rank 0: env.json's status says why the run ended, when this thread ends it (the main
        thread, stuck, never will; it said 'running'). Only that key changes: env.json is the
        main thread's, and only its last full write is read here."""
        if self.rank != 0:
            return
        path = self.out_dir / contract.ENV_JSON
        try:
            env = json.loads(path.read_text())
            env["status"] = status
            write_atomic(path, (strict_json.dumps(env, indent=2, default=str) + "\n").encode())
        except FileNotFoundError:  # not written yet (set-up): nothing to correct
            return
        except (OSError, ValueError) as exc:  # a failing disk, a file cut short
            print(f"[watchdog] rank 0: could not record the status in {path}: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._wakeup is not None:  # the thread waits in select on the pipe, not on _stop: wake it
            try:
                os.write(self._wakeup[1], bytes([_CLOSING]))
            except OSError:  # a full pipe wakes it anyway
                pass
        faulthandler.cancel_dump_traceback_later()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.cfg.poll_s + 1)
        if self._wakeup is not None:  # Ctrl-Z and SIGTERM back to their handlers before, the backstop gone
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous = {}
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None
        if self._sigusr1:
            faulthandler.unregister(signal.SIGUSR1)
        self._dump.close()
        self._drop_empty_dump()

    def _drop_empty_dump(self) -> None:
        """An empty dump file is noise, not evidence (the contract reads it as a rank with none)."""
        path = stackdump_path(self.out_dir, self.rank)
        if path.exists() and path.stat().st_size == 0:
            path.unlink()
