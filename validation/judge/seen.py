"""What the harness saw of a run while it ran: types the launcher fills (validation/launch/lives.py,
validation/launch/watch.py) and the judge reads (judge/short_ranks.py, judge/diagnosis/), below both."""
from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class RankSilence:
    """A rank whose heartbeats showed no new step for the phase's ``stall_s`` or more while another
    rank's went on past its step, as the harness's watch (validation/launch/watch.py) saw it when it
    stopped the run: its process still running (one the harness saw end left, and is judged so:
    judge/short_ranks.py), its last step not the run's last. The others did not wait for it, so the
    run's files kept showing progress: a hang of that rank alone, which no watch of the run's
    highest step can see."""

    rank: int
    step: int
    """The step of its last heartbeat."""
    silent_s: float
    """Seconds its heartbeats had shown no new step when the harness stopped the run."""
    others: dict[int, int] = field(default_factory=dict)
    """The ranks whose heartbeats showed a new step in that time, past its step, each with the step it
    had reached."""
    left_behind: bool = False
    """Whether it had done a step of its own before (its start-up was over) and another rank went past
    its step by more than its own heartbeat interval (one that waits for it in a collective begins the
    step it hung in, no later one): it hung where the others did not wait for it,
    which the watch stops as a stall of that rank. Else the phase's timeout found it so (a rank silent
    within its first step, or one the others had not yet passed by its heartbeat interval)."""

    def went_on(self) -> str:
        """'rank 0 went on to step 40', 'rank 0 went on to step 40 and rank 2 to step 38'."""
        parts = [f"rank {k} went on to step {s}" if i == 0 else f"rank {k} to step {s}"
                 for i, (k, s) in enumerate(sorted(self.others.items()))]
        return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)

    def silence(self) -> str:
        """'its heartbeats showed no new step for 8s while rank 0 went on to step 40'."""
        return f"its heartbeats showed no new step for {self.silent_s:.0f}s while {self.went_on()}"

    def text(self) -> str:
        """'rank 1 hung at step 3: its heartbeats showed no new step for 8s while rank 0 went on to step 40'."""
        return f"rank {self.rank} hung at step {self.step}: {self.silence()}"

    @classmethod
    def from_json(cls, d: dict) -> RankSilence:
        return cls(int(d["rank"]), int(d["step"]), float(d["silent_s"]),
                   {int(k): int(v) for k, v in (d.get("others") or {}).items()}, bool(d.get("left_behind")))
