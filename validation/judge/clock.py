"""The trainer's own step times against the time the harness can see for itself.

training.csv's ``step_time_s`` and ``toks_per_s`` are the trainer's word: a timer that leaves out
the slow part of each step (a device not synchronised before the clock is read, the optimizer or
the data outside the timed region) logs a fraction of the step and a multiple of its speed, and
every gate on those speeds passes. Two clocks it does not hold are there to check it: the ``time``
of its heartbeats, written as the steps go (the contract's, nsa/contract.py), and the wall time
of its process, which the harness measures (a bound: start-up is in it, so no step takes longer).
Where the steps they show take far longer than the step time it logs (``StepClock.disputed``), its
speeds are not to be believed: the finding is critical (findings/clock.py) and the point's gates on
them fail (gates.py ``judged``).

Not judged (None): a run converted by an adapter (its heartbeats are made from the trainer's log
afterwards, not written as it ran), a run whose heartbeats carry no ``time`` or too few steps for
a median, and one that logs no step time (nor tokens/s with env.json's tokens per step).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from validation.contract.check import adapter_name
from nsa.contract import HEARTBEAT_STAGES_AFTER_STEP, HEARTBEAT_STAGES_IN_STEP
from validation.judge.metrics import CATALOGUE, RunData, Source

#: how many times longer than training.csv's median step time the harness may see each step take
#: before the trainer's timings are not believed. A timer around the whole step reads the spacing
#: of its heartbeats within a few percent (what lies outside it, a heartbeat's write and a row's
#: logging, takes milliseconds); one that misses the step's slow part is off by as much as it
#: misses: at 1.5x its tokens/s are half again what the run did. A timer that leaves out half of
#: each step reads 2x, far enough past the bound that a run's noise cannot hide it, as it could at
#: a bound of 2x. Both sides are medians, so an evaluation or a checkpoint between some steps
#: moves neither.
CLOCK_FACTOR = 1.5
#: heartbeat intervals (one step's first record to the next step's) needed to judge: with fewer,
#: one pause (a compile, an evaluation) is half the median
MIN_INTERVALS = 4
#: training.csv's columns that are the trainer's own clock, directly or over its tokens per step
CLOCK_COLUMNS = ("step_time_s", "toks_per_s")
#: stages a trainer announces work between steps by (a checkpoint, a profile's summary): the time
#: from such a record to the next step's first is no step's
PAUSES = tuple(stage for stage in HEARTBEAT_STAGES_AFTER_STEP if stage != "step")
#: the metrics that read them: the gates that a disputed clock fails
CLOCKED = frozenset(m.name for m in CATALOGUE
                    if any(i.source == Source.CSV and i.name in CLOCK_COLUMNS for i in m.reads))


@dataclass(frozen=True)
class StepClock:
    """One run's step time as its trainer logged it, beside the time per step its heartbeats and
    its process's wall time show."""

    logged_s: float
    """training.csv's median step time over the run: ``step_time_s``, or where the trainer writes
    none, env.json's tokens_per_step over its median ``toks_per_s`` (``logged_from`` says which)."""
    logged_from: str
    """The training.csv column ``logged_s`` was read from (one of CLOCK_COLUMNS)."""
    rows: int
    """training.csv rows it is the median of."""
    beat_s: float
    """The median time per step between ``rank``'s heartbeats (each interval over the steps it spans)."""
    rank: int
    """The rank whose heartbeats show the shortest steps (every rank's would do in lock-step training)."""
    intervals: int
    """Heartbeat intervals ``beat_s`` is the median of."""
    wall_step_s: float | None = None
    """The process's wall time over the steps it ran (start-up included: no step takes longer);
    None where the harness did not time it."""

    @property
    def seen_s(self) -> float:
        """The time per step the harness can vouch for: the heartbeats', no more than the wall time allows."""
        return self.beat_s if self.wall_step_s is None else min(self.beat_s, self.wall_step_s)

    @property
    def ratio(self) -> float:
        return self.seen_s / self.logged_s

    @property
    def disputed(self) -> bool:
        """Each step took more than CLOCK_FACTOR times the step time the trainer logged."""
        return self.ratio > CLOCK_FACTOR

    def text(self) -> str:
        """'training.csv's median step_time_s is 0.02 s (30 rows); rank 0's heartbeats show 0.302 s a
        step (the median of 29 intervals) and the process ran 0.445 s a step, start-up included: each
        step took 15.1x the time logged'."""
        logged = ("step_time_s" if self.logged_from == "step_time_s" else
                  "step time (env.json's tokens_per_step over its toks_per_s)")
        wall = ("" if self.wall_step_s is None else
                f" and the process ran {self.wall_step_s:.3g} s a step, start-up included")
        return (f"training.csv's median {logged} is {self.logged_s:.3g} s ({self.rows} rows); rank {self.rank}'s "
                f"heartbeats show {self.beat_s:.3g} s a step (the median of {self.intervals} intervals){wall}: each "
                f"step took {self.ratio:.1f}x the time logged")


def step_clock(run: RunData, wall_s: float | None) -> StepClock | None:
    """The run's ``StepClock`` (``wall_s``: its process's wall time, as the harness measured it);
    None where it cannot be judged (the module's docstring says when)."""
    if run.csv is None or run.csv.empty or adapter_name(run.env) is not None:
        return None
    logged = _logged(run)
    if logged is None:
        return None
    logged_s, column, rows = logged
    # of each rank that exists, its intervals (a file of a rank at or above the world size is malformed)
    beats = {r: gaps for r, recs in run.heartbeats.items()
             if r < run.world_size and len(gaps := [g for g in step_spans(recs) if g >= 0]) >= MIN_INTERVALS}
    if not beats:
        return None
    medians = {r: statistics.median(g) for r, g in beats.items()}
    rank = min(medians, key=medians.get)
    steps = _steps_ran(run.heartbeats[rank])
    wall = wall_s / steps if wall_s and steps else None
    return StepClock(round(logged_s, 6), column, rows, round(medians[rank], 6), rank, len(beats[rank]),
                     None if wall is None else round(wall, 6))


def step_spans(recs: list[dict[str, Any]]) -> list[float]:
    """A rank's wall time per step as its heartbeats show it (``step_times`` without the steps)."""
    return [span for _, span in step_times(recs)]


def step_times(recs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, seconds) of a rank's steps as its heartbeats show them. Where they mark steps' starts
    (a record of a stage within the step) and ends (a record of a stage after it), each such step's
    span, from its first record to its first record after it, or to the next step's start where that
    comes first (the end records of steps logged in a batch after them): work between steps (a
    checkpoint, an evaluation after every step) is in none. Else the time between consecutive steps'
    first records over the steps between (a trainer may beat every N steps), leaving out the
    intervals after a step whose records announce work after it (``PAUSES``), whose end no record
    marks; an interval is the earlier step's where its first record marks the step's start, else the
    later one's (first records that mark steps' ends)."""
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    first: dict[int, float] = {}
    opens: set[int] = set()  # steps whose first record marks their start
    paused: set[int] = set()
    for r in recs:
        step, t, stage = r.get("step"), r.get("time"), r.get("stage")
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not isinstance(t, (int, float)):
            continue
        k = int(step)
        if k not in first:
            first[k] = float(t)
            if stage in HEARTBEAT_STAGES_IN_STEP:
                opens.add(k)
        if stage in HEARTBEAT_STAGES_IN_STEP:
            started.setdefault(k, float(t))
        elif stage in HEARTBEAT_STAGES_AFTER_STEP:
            ended.setdefault(k, float(t))
            if stage in PAUSES:
                paused.add(k)
    # a step is over once the next one starts: a trainer that logs a window's steps after it (a
    # profiled window, a batch of rows written at once) writes their end records late
    order = sorted(started)
    next_start = {a: started[b] for a, b in zip(order, order[1:]) if started[b] >= started[a]}
    whole = [(k, min(ended[k], next_start.get(k, ended[k])) - started[k]) for k in order
             if k in ended and ended[k] >= started[k]]
    if len(whole) >= MIN_INTERVALS:
        return whole
    steps = sorted(first)
    return [(a if a in opens else b, (first[b] - first[a]) / (b - a)) for a, b in zip(steps, steps[1:])
            if b > a and a not in paused]


def _logged(run: RunData) -> tuple[float, str, int] | None:
    """(median step time, the column it comes from, rows) of training.csv: its step_time_s where
    written, else tokens_per_step over toks_per_s; None where neither gives a positive time."""
    csv = run.csv
    times = [float(v) for v in csv["step_time_s"] if math.isfinite(v) and v > 0] if "step_time_s" in csv else []
    if times:
        return statistics.median(times), "step_time_s", len(times)
    per_step = (run.env or {}).get("tokens_per_step")
    if not isinstance(per_step, (int, float)) or isinstance(per_step, bool) or not per_step > 0:
        return None
    rates = [float(v) for v in csv["toks_per_s"] if math.isfinite(v) and v > 0] if "toks_per_s" in csv else []
    return (per_step / statistics.median(rates), "toks_per_s", len(rates)) if rates else None


def _steps_ran(recs: list[dict[str, Any]]) -> int:
    """The steps a rank's heartbeats span (a trainer that beats every N steps spans fewer than it
    ran, which makes the wall time a step only larger: still a bound)."""
    steps = [int(r["step"]) for r in recs if isinstance(r.get("step"), (int, float)) and not isinstance(r["step"], bool)]
    return max(steps) - min(steps) + 1 if steps else 0
