"""Progress of a running trainer, watched by the harness itself: a new step in its heartbeats
(``heartbeat_rank*.jsonl``) or its training CSV, above the highest seen, or in a file that went
back (a trainer resumed in place writes the steps after its checkpoint again, below the highest,
and is making progress while it does). A trainer that hangs writes neither, whatever its own
watchdog does, so no new step for the phase's ``stall_s`` is a stall.

Each rank's heartbeat file is watched on its own too: ranks that do not wait for each other every
step (or a rank whose loop runs on apart from the others') keep the run's highest step growing
while one of them hangs. A rank whose heartbeats showed no new step for ``stall_s`` while another
rank's went past it is a stall of that rank (``StepWatch.silent``: ``RankSilence.left_behind``).

Each look reads only the bytes appended since the last one (a file that shrank or was replaced
is read again from its start), so watching a long run costs no more than its newest lines.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

from nsa.contract import HEARTBEAT_PATTERN, HEARTBEAT_STAGE_HALT, HEARTBEAT_STAGES_AFTER_STEP
from validation.judge.seen import RankSilence

HEARTBEATS = "heartbeat_rank*.jsonl"


@dataclass(frozen=True)
class Watch:
    """What the harness watches in one trainer run, and what it does on a stall."""

    progress_dir: Path
    """Where the trainer writes its heartbeats (the run directory, or a trainer's own directory)."""
    csv: Path
    """Its training CSV, whose first column is the step (with or without a header)."""
    stall_s: float
    """No growth of the highest step for this long, once a first step was seen, is a stall:
    stacks are taken and the tree killed."""
    startup_s: float
    """Before the first step is done: no new step this long is a stall too (start-up and the first
    step take longer than a step: imports, compilation, graph capture)."""
    run_dir: Path
    """Where the stacks the harness takes go (``harness_stacks/``)."""
    single_process: bool
    """The python launcher: the launched process itself is rank 0. Under torchrun the launched
    process is the agent, no rank; its workers carry RANK in their environment."""
    step_of: Callable[[str], int | None] | None = None
    """The step a line of ``csv`` shows, where the file is a trainer's own log rather than a CSV
    (its adapter's reading); None: the first cell of a row."""
    live_steps: Callable[[], int | None] | None = None
    """The highest step a trainer's own files show now, for a format with no line per step (its
    adapter's reader: TensorBoard events, checkpoints); None: the CSV and heartbeats say it."""
    last_step: int | None = None
    """The last step the trainer is asked to complete: a rank whose heartbeats reached it finished,
    and its silence after it is no hang. None: not known (every silent rank counts)."""


class _Tail:
    """The unread end of one growing file."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode, self.partial = path, 0, None, b""

    def new_lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:  # replaced or truncated
                    self.inode, self.offset, self.partial = st.st_ino, 0, b""
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return lines


def _step(line: bytes) -> tuple[int | None, int | None, bool, bool]:
    """The step of a heartbeat record (JSON) or a CSV row (its first cell), the record's pid,
    whether it says that step was completed (a CSV row, or a heartbeat of a stage written once a
    step is done: nsa/contract.py; a record within a step says only that the step began), and
    whether it is a halt record (the rank stopped with the run); None for a header, a torn line or
    anything else."""
    text = line.strip()
    if text.startswith(b"{"):
        try:
            rec = json.loads(text)
            step, pid, stage = rec.get("step"), rec.get("pid"), rec.get("stage")
        except (ValueError, AttributeError):
            return None, None, False, False
        return _whole(step), _whole(pid), stage in HEARTBEAT_STAGES_AFTER_STEP, stage == HEARTBEAT_STAGE_HALT
    first = text.split(b",", 1)[0].strip()
    return (int(first) if first.isdigit() else None), None, True, False


def _whole(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class _Pace:
    """One rank's progress, as its heartbeat file shows it."""

    step: int
    """The step of its latest record (after a resume in place, below steps it showed before)."""
    since: float
    """When (time.monotonic()) its heartbeats last showed a new step."""
    top: int = 0
    """The highest step it showed."""
    every: int = 1
    """Its heartbeat interval in steps: the largest rise of its step from one record to the next (a
    rank that beats every E steps is silent for E steps' time between its records)."""
    stepped: bool = False
    """It showed a step done (a record of a stage after a step, or of a step above 1)."""
    halted: bool = False
    """Its latest record is a halt record: it stopped with the run."""

    def new(self, step: int) -> bool:
        """Whether ``step`` is progress of this rank: above its highest, or another step than its
        latest in a file that went back (a resume in place writes steps again)."""
        return step > self.top or (step != self.step and (step < self.step or self.step < self.top))


class StepWatch:
    """The highest step any watched file has shown so far, each file's last step, and each rank's
    pace (``silent``)."""

    def __init__(self, progress_dir: Path, csv: Path, step_of: Callable[[str], int | None] | None = None,
                 live_steps: Callable[[], int | None] | None = None):
        self.progress_dir, self.csv, self.step_of, self.live_steps = progress_dir, csv, step_of, live_steps
        self.highest: int | None = None
        self.stepped = False
        """Whether a file showed a step completed (not one only begun): until then the run is
        starting up (its first step may take a compilation's time)."""
        self._tails: dict[Path, _Tail] = {}
        self._last: dict[Path, int] = {}
        self._pid_of: dict[int, int] = {}
        """rank -> the pid of its latest heartbeat that carries one."""
        self._paces: dict[int, _Pace] = {}
        """rank -> its progress, from its first record of a step begun (step 1 or later)."""

    @property
    def pids(self) -> dict[int, int]:
        """pid -> rank, as the ranks' latest heartbeats say."""
        return {pid: rank for rank, pid in self._pid_of.items()}

    def look(self, now: float | None = None) -> bool:
        """Read what was appended since the last look (at ``now``, time.monotonic()'s); True when
        a new step came: above the highest, or in a file that had gone back below it, another step
        than that file's last (the records of one step's stages are no progress), or the first step
        was done (the end of start-up: the stall clock starts there, not at that step's first record)."""
        now = time.monotonic() if now is None else now
        paths = [self.csv, *(p for p in self.progress_dir.glob(HEARTBEATS) if HEARTBEAT_PATTERN.match(p.name))]
        progressed = False
        for path in paths:
            tail = self._tails.setdefault(path, _Tail(path))
            beat = HEARTBEAT_PATTERN.match(path.name)
            for line in tail.new_lines():
                if path == self.csv and self.step_of is not None:  # a trainer's log line of a step it did
                    step, pid, done, halt = self.step_of(line.decode(errors="replace")), None, True, False
                else:
                    step, pid, done, halt = _step(line)
                if beat and pid is not None:
                    self._pid_of[int(beat.group(1))] = pid
                if step is None:
                    continue
                if beat and step >= 1:
                    self._pace(int(beat.group(1)), step, done, halt, now)
                # a record within step k > 1 says step k - 1 was done
                if not self.stepped and (done or step > 1):
                    self.stepped = progressed = True
                last = self._last.get(path)
                rerun = last is not None and step != last and (step < last or last < (self.highest or 0))
                if self.highest is None or step > self.highest or rerun:
                    progressed = True
                self.highest = step if self.highest is None else max(self.highest, step)
                self._last[path] = step
        live = self.live_steps() if self.live_steps is not None else None
        if live is not None and live >= 1 and (self.highest is None or live > self.highest or not self.stepped):
            progressed, self.highest, self.stepped = True, max(live, self.highest or live), True
        return progressed

    def _pace(self, rank: int, step: int, done: bool, halt: bool, now: float) -> None:
        """A record of ``rank`` of a step begun, read at ``now``."""
        pace = self._paces.get(rank)
        if pace is None:
            pace = self._paces[rank] = _Pace(step, now, step)
        elif pace.new(step):
            if step > pace.step:
                pace.every = max(pace.every, step - pace.step)
            pace.step, pace.since, pace.top = step, now, max(pace.top, step)
        # a record within step k > 1 says step k - 1 was done
        pace.stepped, pace.halted = pace.stepped or done or step > 1, halt

    def silent(self, now: float, stall_s: float, last_step: int | None,
               gone: Collection[int] = ()) -> list[RankSilence]:
        """The ranks whose heartbeats showed no new step for ``stall_s`` or more, as of ``now``, while
        another rank's showed new steps past theirs, lowest first; left behind
        (``RankSilence.left_behind``) where it had done a step and another went past its step by more
        than its own heartbeat interval (a rank that merely lags, or beats every few steps, shows its next
        step before that). Never a rank whose
        last step is ``last_step`` or later (it finished), whose latest record is a halt record (it
        stopped with the run), or whose process (the pid of its heartbeats) is among ``gone``, those
        the harness saw end: a rank that exited left, which its heartbeats and process are judged
        by (judge/short_ranks.py). A rank that writes no heartbeat is never watched for this."""
        out = []
        for rank, pace in sorted(self._paces.items()):
            quiet = now - pace.since
            finished = last_step is not None and pace.step >= last_step
            if quiet < stall_s or finished or pace.halted or self._pid_of.get(rank) in gone:
                continue
            others = {k: p.step for k, p in sorted(self._paces.items())
                      if k != rank and p.since > pace.since and p.step > pace.step}
            if others:
                # more than its interval: a rank that waits for it in a collective can begin the step
                # it hung in, no later one
                behind = pace.stepped and any(s > pace.step + pace.every for s in others.values())
                out.append(RankSilence(rank, pace.step, round(quiet, 1), others, behind))
        return out
