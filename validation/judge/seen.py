"""What the harness saw of a run's processes while it ran: a type the launcher fills
(validation/launch/lives.py) and the judge reads (judge/short_ranks.py), below both."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessSeen:
    """One process of a run as the harness saw it while the run went on (validation/launch/lives.py):
    at each poll it reads the run's files (heartbeats, training.csv) and looks at the process tree,
    so each process's life is placed against the steps the files showed. A rank's is the process
    whose pid its heartbeats carry (``rank_processes``)."""

    pid: int
    alive_at: int
    """The highest step the run's files had shown (0: none yet) when the harness last saw the
    process running, reading them before it looked: the process had not exited when the run got
    that far (which says nothing of whether it was still training)."""
    gone_at: int | None = None
    """The highest step the files showed once the harness had seen the process gone, reading them
    after it looked: the process had ended before the run got past it. None: it was running when the
    harness last looked (the run ended around it, or was stopped)."""
