"""What ends a launched tree when the harness process dies without killing it (``kill -9``, the
OOM killer, a crash in C code): the harness's own kill (validation/launch/process.py) runs only
while the harness does.

A launched tree has two parts, and each needs its own way:

- The launched process (a plain trainer, a torchrun agent, srun) is started with a parent-death
  signal (Linux's ``prctl(PR_SET_PDEATHSIG)``, set in the child before exec; elsewhere none),
  which the kernel sends it as the harness dies. The kernel sends it when the *thread* that
  started the child ends, not the process: each launch's processes are started, supervised and
  killed within one ``run_group`` call on one thread, which returns only once they are dead, so
  the signal comes only with the harness's death.
- What it starts does not inherit the signal (fork clears it), and torchrun starts each worker in
  a session of its own, out of reach of any process-group signal: a torchrun agent's ranks
  outlive a SIGKILLed agent. So the harness starts a warden, once: a small process in a session
  of its own (a Ctrl-C in the terminal stops the harness, which kills its trees itself) that
  waits on a pipe only the harness holds open. At the pipe's end (the harness gone, however)
  it kills every process carrying the harness's token, which every launch's environment holds
  beside the launch's own (validation/launch/tree.py), and exits. At the harness's own exit it
  is stopped without a sweep: every launch has ended by then.

srun is the exception (``Command.forwards_signals``): it forwards a SIGTERM to every task of its
step on every node, where slurmstepd, not anything here, started the torchrun agents and their
ranks; so srun gets SIGTERM as its death signal, and its launch does not carry the harness's
token: a warden's SIGKILL of srun would end it before it forwarded the signal, leaving the other
nodes' ranks running. Those ranks are Slurm's to end (its KillWait after the SIGTERM).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Callable

import psutil

from validation import REPO_ROOT
from validation.launch.tree import ProcessTree

#: the token of this harness process, in the environment of every launch the warden is to kill
#: when the harness dies (validation/launch/tree.py's RUN_TOKENS)
HARNESS_TOKEN = uuid.uuid4().hex
#: prctl's option that sets the calling process's parent-death signal (linux/prctl.h)
_PR_SET_PDEATHSIG = 1
#: libc, where prctl is (loaded here, before any fork: the child only calls it)
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

_MODULE = "validation.launch.warden"
_lock = threading.Lock()
#: the write end of the warden's pipe, open for the harness's whole life (None: no warden tried yet)
_pipe: int | None = None
#: the warden's process, held so that Python does not take it for one forgotten
_warden: subprocess.Popen | None = None


def dies_with_harness(sig: signal.Signals) -> Callable[[], None] | None:
    """What a child runs before exec so that ``sig`` ends it once the harness dies (Popen's
    ``preexec_fn``); None where the system has no parent-death signal."""
    if _LIBC is None:
        return None
    prctl, harness = _LIBC.prctl, os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != harness:  # the harness died before the signal was set: it will never come
            os._exit(1)

    return arm


def keep_watch() -> None:
    """Start this harness process's warden, once (at its first launch). A warden that cannot start
    leaves launched processes their death signal alone: the harness goes on without it."""
    global _pipe, _warden
    with _lock:
        if _pipe is not None:
            return
        read_end, _pipe = os.pipe()  # not inherited by any launch: only the harness holds it
        atexit.register(_dismiss)  # first: a stop signal may cut the start short once the warden runs
        try:
            _warden = subprocess.Popen([sys.executable, "-m", _MODULE, HARNESS_TOKEN], cwd=REPO_ROOT, stdin=read_end,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            pass
        finally:
            os.close(read_end)


def _dismiss() -> None:
    """At the harness's own exit every launch has ended (its ``run_group`` killed whatever was left
    of it): the warden goes without a sweep, so that no process of the harness outlives it. It is
    found among the harness's children, also where a stop signal cut its start short."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[-2:] == [_MODULE, HARNESS_TOKEN]:
                child.kill()
                child.wait(timeout=5)


def main(argv: list[str]) -> int:
    """The warden: wait for the harness's end of the pipe (stdin) to close, then kill every
    process carrying the harness's token (``argv[0]``)."""
    while os.read(0, 4096):
        pass
    ProcessTree(argv[0]).kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
