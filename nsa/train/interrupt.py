"""Ctrl-C as a clean stop: the first SIGINT asks the loop to stop after the step in flight (all
ranks agree through the step's stats exchange, like an operator's .HALT), the run saves a
checkpoint and exits EXIT_INTERRUPTED, so that ``train.resume=auto`` continues it; a second
SIGINT raises KeyboardInterrupt at once. SIGTERM keeps its default: torchrun sends it to the
surviving ranks when one fails, and the harness reads "killed by SIGTERM" as a peer's collateral
stop, not a failure of its own."""
from __future__ import annotations

import signal
import sys
import threading

from .. import contract

EXIT_INTERRUPTED = contract.EXIT_INTERRUPTED
"""Stopped by Ctrl-C: the shell's convention for a process ended by SIGINT (128 + 2)."""


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
