"""Steps a trainer wrote more than once. A trainer resumed in place (torchrun's ``--max-restarts``,
a job requeued onto the same out_dir) logs the steps after its checkpoint again, after what the
process before it wrote: into training.csv (unless it truncates it) and into its heartbeat files.
What the later process wrote is what happened; the earlier occurrences of those steps, and any
step the earlier process reached beyond them, are superseded. The readers (files.py) keep the
latest occurrence and say what they dropped, so that windows, step counts, a stall's 'after step
N', step times and loss curves read one history.

A rerun begins at an entry whose step goes back: in training.csv a row whose step is not above
the last kept row's (one row per step); in a heartbeat file (several records share a step, one per
stage) a record written by another process (its ``pid``) at a step not beyond the last kept
record's, or a record below it of a stage within a step (or of no stage), or of a step done that
the file holds already. A record written once a step is done may come late, once (this project's
trainer writes those of the steps it profiles after the profile's record: 3 profile, 2 step, 3
step), so its step going back alone is no rerun.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Rerun:
    """One resume in place, as a file shows it."""

    first: int
    """The step the later process wrote again first."""
    through: int
    """The highest step the superseded entries had reached."""
    dropped: int
    """Entries (rows, records) of the earlier process that it superseded."""

    def text(self) -> str:
        # 'went back', not 'wrote steps 36-37 again': a process that resumed at 36 and hung in 37 wrote
        # only 36 again, and the earlier process's 37 is superseded all the same
        return (f"went back from step {self.through} to step {self.first} ({self.dropped} earlier "
                f"entr{'y' if self.dropped == 1 else 'ies'} superseded)")


def latest(steps: Sequence[int | None], *, one_per_step: bool, new_process: Sequence[bool] | None = None,
           late: Sequence[bool] | None = None) -> tuple[list[int], list[Rerun]]:
    """The indices of the entries a rerun did not supersede, in file order, and the reruns found
    (module docstring). ``steps``: each entry's step (None: an entry of no step, always kept);
    ``one_per_step``: a repeated step begins a rerun (training.csv); ``new_process``: per entry,
    whether a process other than the previous entry's wrote it; ``late``: per entry, whether it
    may come after entries of later steps (a heartbeat record written once its step was done)."""
    kept: list[int] = []
    reruns: list[Rerun] = []
    top: int | None = None
    for i, step in enumerate(steps):
        new = new_process is not None and new_process[i]
        back = step is not None and top is not None and (
            (step <= top and (one_per_step or new)) or (step < top and not (late is not None and late[i])))
        if back:
            dropped = [k for k in kept if steps[k] is not None and steps[k] >= step]
            kept = [k for k in kept if steps[k] is None or steps[k] < step]
            reruns.append(Rerun(step, top, len(dropped)))
            top = max((steps[k] for k in kept if steps[k] is not None), default=None)
        kept.append(i)
        if step is not None:
            top = step if top is None else max(top, step)
    return kept, reruns


@dataclass(frozen=True)
class Restart:
    """A later process of a run that a restart began in the same files (torchrun's
    ``--max-restarts``), as its adapter reads the trainer's log (env.json's ``adapter.restarts``). A
    rerun in training.csv shows a restart only where the later process logged a step again: not one
    that resumed at the step after the last one logged, nor one that ended before its first step."""

    attempt: int
    """Which process of the run it was: 2 the first restart."""
    began: int | None
    """The step it began at (its checkpoint's step + 1); None where its log does not say."""
    after: int | None
    """The last step the process before it logged; None where that one logged none."""
    last: int | None
    """The last step it logged; None where it logged none."""

    def text(self) -> str:
        """'attempt 2 began at step 6 (attempt 1 had logged up to step 11) and logged no step'."""
        began = "began at a step its log does not say" if self.began is None else f"began at step {self.began}"
        before = (f"attempt {self.attempt - 1} had logged no step" if self.after is None else
                  f"attempt {self.attempt - 1} had logged up to step {self.after}")
        logged = "logged no step" if self.last is None else f"logged up to step {self.last}"
        return f"attempt {self.attempt} {began} ({before}) and {logged}"
