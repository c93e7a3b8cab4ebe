"""torchrun's report as it gives up on its workers, written from a few values: the ChildFailedError
line its agent's traceback ends with and the summary under it ('Failures:', 'Root Cause (first
observed failure):', each failed worker's time, host, rank, exitcode, error_file and traceback), in
torch 2.x's format (torch/distributed/elastic/multiprocessing/errors/__init__.py,
``ChildFailedError.format_msg``). For tests that judge a torchrun log of their own making; a log
captured from a real run stays as captured (validation/tests/evidence/)."""
from __future__ import annotations

import signal
from dataclasses import dataclass

CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
#: what torchrun says of a worker that exited non-zero and left no error file (no @record)
NO_ERROR_FILE = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
#: torchrun draws its rules as wide as the widest line, at most this wide
_MAX_WIDTH = 60


@dataclass(frozen=True)
class Failed:
    """One failed worker as torchrun's summary lists it."""

    rank: int
    pid: int
    exitcode: int
    """Negative: killed by that signal."""
    local_rank: int | None = None
    """Its rank on its node; None: its global rank (a launch of one node)."""

    def entry(self, idx: int, time: str, host: str) -> str:
        """Its entry, numbered ``idx``."""
        local = self.rank if self.local_rank is None else self.local_rank
        if self.exitcode < 0:
            name = signal.Signals(-self.exitcode).name
            signame, message = f" ({name})", f"Signal {-self.exitcode} ({name}) received by PID {self.pid}"
        else:
            signame, message = "", NO_ERROR_FILE
        return (f"[{idx}]:\n  time      : {time}\n  host      : {host}\n"
                f"  rank      : {self.rank} (local_rank: {local})\n"
                f"  exitcode  : {self.exitcode} (pid: {self.pid}) {signame}\n"
                f"  error_file: <N/A>\n  traceback : {message}")


def child_failed(script: str, root: Failed, *others: Failed, time: str = "2026-12-06_01:04:17",
                 host: str = "localhost") -> str:
    """torchrun's ChildFailedError line and its summary of ``script``'s workers: ``root`` the first
    observed failure, ``others`` the workers it also lists (those it ended once ``root`` had failed),
    numbered after ``root`` in the order given."""
    entries = [f.entry(i, time, host) for i, f in enumerate([root, *others])]
    title = f"{script} FAILED"
    width = min(max(len(ln) for ln in [title, *"\n".join(entries).splitlines()]), _MAX_WIDTH)
    return (f"{CHILD_FAILED}\n{'=' * width}\n{title}\n{'-' * width}\nFailures:\n"
            + ("\n".join(entries[1:]) or "  <NO_OTHER_FAILURES>")
            + f"\n{'-' * width}\nRoot Cause (first observed failure):\n{entries[0]}\n{'=' * width}\n")
