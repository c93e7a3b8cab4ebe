"""Ctrl-C as a clean stop: the first SIGINT asks the loop to stop after the step in flight (all
ranks agree through the step's stats exchange, like an operator's .HALT), the run saves a
checkpoint and exits EXIT_INTERRUPTED, so that ``train.resume=auto`` continues it; a second
SIGINT raises KeyboardInterrupt at once. SIGTERM (a preemption) is taken by the watchdog's
thread (nsa/train/watchdog.py), which also ends a run that cannot stop by SIGTERM itself: torchrun
sends SIGTERM to the surviving ranks when one fails, and the harness reads "killed by SIGTERM" as
a peer's collateral stop, not a failure of its own.

Each stop request is a StopRequest; the ranks exchange theirs with the step's stats and take
the highest, so every rank stops after the same step for the same reason."""
from __future__ import annotations

import signal
import sys
import threading
from enum import IntEnum

from .. import contract

EXIT_INTERRUPTED = contract.EXIT_INTERRUPTED
"""Stopped by Ctrl-C: the shell's convention for a process ended by SIGINT (128 + 2)."""
EXIT_TERMINATED = contract.EXIT_TERMINATED


class StopRequest(IntEnum):
    """Why a run stops after the step in flight, by precedence (the highest of the ranks' wins)."""

    NONE = 0
    HALT = 1
    """An operator's .HALT."""
    CTRL_C = 2
    SIGTERM = 3

    def reason(self, step: int) -> str:
        """env.json's status for a run stopped after ``step``."""
        return {StopRequest.HALT: f"stopped by operator .HALT after step {step}",
                StopRequest.CTRL_C: f"interrupted (Ctrl-C) after step {step}",
                StopRequest.SIGTERM: f"stopped by SIGTERM after step {step}"}[self]

    @property
    def exit_status(self) -> int:
        return {StopRequest.CTRL_C: EXIT_INTERRUPTED, StopRequest.SIGTERM: EXIT_TERMINATED}.get(self, contract.EXIT_OK)


class CtrlC:
    """Installs the SIGINT handler while the loop runs (main thread only; elsewhere Python
    cannot install one and Ctrl-C keeps its default). ``requested`` turns True on the first
    SIGINT. A context manager; the previous handler is restored on exit."""

    def __init__(self, rank: int):
        self.rank = rank
        self.requested = False
        self._installed = False
        self._previous = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._first)
            self._installed = True
        return self

    def _first(self, signum, frame) -> None:
        self.requested = True
        print(f"[rank {self.rank}] Ctrl-C: stopping after this step and saving a checkpoint; "
              "press it again to stop at once", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc) -> None:
        if self._installed:  # None: a handler not set from Python, restored as the default
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False
