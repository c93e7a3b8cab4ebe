"""Why a run's tokens/s was unsteady: which steps of a failed ``toks_per_s_cv`` gate's window were
slow, and where in those steps the time went, read from the heartbeats. The gate keeps it
(``GateResult.unsteady``); the gate's finding and the report's failure section print it, and its
advice follows from each slow step's ``Cause``. It explains the verdict, never moves it.

**Slow steps.** The window's typical step is the median ``step_time_s`` of its logged steps that are
not slow, and a step is slow when it took more than SLOW times that. Both are found together: the
median of the whole window first, then every step above SLOW times it taken out and the median of
the rest taken, until no step of the rest lies above SLOW times their median (the slow steps only
grow and the rest never empties, so it ends). A stall lengthens a few steps, and in a short window
(6 steps) two or three of them pull the whole window's median halfway to the stalled pace, where a
step 1.3x the steady one is no longer 1.2x that median. A window with no slow step (a gentle drift,
an even jitter) claims nothing: no explanation is made of it. Beside the slow steps, the window's
toks_per_s_cv without them (as the metric computes it: population stdev over the mean).

**Drift.** A window of DRIFT_STEPS timed steps or more whose step times follow the steps' order
(their rank correlation with the step DRIFT or more, either way) drifted: the time rose (memory or a
queue growing, clocks lowering) or fell (a warm-up the window still holds) step after step, and the
steps its far end holds are no few slow steps. It is said so, with the medians of the window's first
and last thirds, and no step is called slow. In fewer steps one or two stalls at the window's end rank
as a drift does, so a short window is read for slow steps only. A drift needs no heartbeats.

**Spans.** A rank writes a heartbeat record as it enters each stage of a step (nsa/contract.py
HEARTBEAT_STAGES_IN_STEP: data, graph or forward and backward, optimizer) and a ``step`` record once
the step is logged (a ``checkpoint`` or ``profile`` record after it, where there is one). In its
heartbeats a step runs from the step record of the step before to its own; each record in between
opens a span that lasts to the next record, the work of the stage it entered: ``step`` the trainer's
work between steps (logging, printing), ``checkpoint`` the checkpoint's, ``data`` the loader's,
``graph``, ``forward`` and ``backward`` the host launching the step's device work. A stage entered
more than once in a step (micro-batches) has its spans summed. The last span, which ends at the
step record, is the wait for the GPU: the host reads the step's loss to log it, so it waits there
for all the work queued before (in this trainer that span is its ``optimizer`` stage, which holds
the step's one host sync). A step whose step before has no step record (not logged) has no spans.
Each span of a slow step is set against its typical length, the median of the same stage's span
over the window's steps that are not slow, on the same rank; the step's excess is its spans' sum
less their typical lengths'.

**Cause**, by the first rule that holds on a rank:

1. ``WHOLE_HOST``: every host span of the step (all but the wait, two at least) lasted GREW times its
   typical or more. The process, or the machine under it, ran slower through the whole step (a
   garbage collection, another thread holding the GIL, other work on the machine), not one stage's
   work. A host that stalls launches the device's work late, and the device then runs it as fast as
   ever, so the wait for it does not grow, or grows where the host came back late to read the result:
   the words show the wait beside the host spans.
2. ``STAGE``: the host span with the largest excess lasted GREW times its typical or more and holds
   HOLDS of the step's excess or more: that stage's own work took longer (a stage that no steady
   step enters, such as a checkpoint, has no typical and counts whole).
3. ``GPU_WAIT``: the wait holds HOLDS of the step's excess or more: the device's work took longer
   (other work on the GPU, lowered clocks), or the host stalled inside that span alone (the
   optimizer's launches, the logging); heartbeats cannot tell these apart.
4. ``UNCLEAR``: none of these: the excess lies in some host spans and not all, or the heartbeats show
   none (their step time against training.csv's).

``NO_STAGES``: the rank's heartbeats hold no span of the step.

**Ranks.** The explanation needs rank 0's heartbeats (the rank whose training.csv logs the steps).
Each rank whose heartbeats the run left is read on its own: a rank that stalls makes the others wait
for it in the step's collectives, inside their wait for the GPU. So a step's cause is the host cause
(WHOLE_HOST, STAGE) of the rank whose host spans grew most where a rank has one, else rank 0's.
"""
from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from nsa.contract import heartbeat_name
from validation.contract.files import read_heartbeats, read_training_csv, window_rows
from validation.errors import ArtifactError

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd

#: the metric whose failed gate this explains
METRIC = "toks_per_s_cv"
#: a step is slow when it took more than this many times the window's typical step
SLOW = 1.2
#: a span grew when it lasted at least this many times its typical length
GREW = 2.0
#: the share of a step's excess a span must hold for the time to be placed there
HOLDS = 0.5
#: slow steps described one by one (the first line counts them all)
LISTED = 5
#: a window whose step times have this rank correlation with its steps, or more, either way, drifted
DRIFT = 0.9
#: the fewest timed steps a drift is read from (module docstring: Drift)
DRIFT_STEPS = 12
#: the stage of the record a rank writes once a step is logged (nsa/contract.py HEARTBEAT_STAGES_AFTER_STEP)
STEP_RECORD = "step"


class Cause(enum.StrEnum):
    """Where a slow step's extra time went, by the module's rules."""

    WHOLE_HOST = "whole host"
    """Every host span of the step grew: the process or the machine stalled."""
    STAGE = "one stage"
    """One host span grew and holds most of the extra time: that stage's own work."""
    GPU_WAIT = "GPU wait"
    """Only the wait for the GPU (the span that ends at the step record) holds it."""
    UNCLEAR = "unclear"
    """The spans place it in no one stage and not in every host stage."""
    NO_STAGES = "no stages"
    """The heartbeats hold no span of the step."""


#: what each cause says happened, in a finding's words
_SAID = {Cause.WHOLE_HOST: "the whole host stalled", Cause.GPU_WAIT: "only the wait for the GPU grew",
         Cause.UNCLEAR: "no one stage and not every host stage grew", Cause.NO_STAGES: "no heartbeat stages of it"}


def stage_name(stage: str) -> str:
    """'the data stage'; the span opened by a step record is the trainer's work between steps."""
    return "the work between steps" if stage == STEP_RECORD else f"the {stage} stage"


@dataclass(frozen=True)
class Span:
    """One stage's time in a step on one rank: from the record entering it to the next record."""

    stage: str
    """The stage of the record that opens it (whose work it holds)."""
    until: str
    """The stage of the record that closes it."""
    seconds: float
    typical: float | None
    """The median of the same stage's span over the window's steps that are not slow; None where
    none of them has it (a checkpoint written in a slow step only)."""
    wait: bool = False
    """It ends at the step record: the wait for the GPU."""

    @property
    def grew(self) -> bool:
        return self.typical is None or self.seconds >= GREW * self.typical

    @property
    def excess(self) -> float:
        return self.seconds - (self.typical or 0.0)

    def text(self) -> str:
        """'data->graph 2.99 ms (typical 0.47 ms, 6.4x)'."""
        head = f"{self.stage}->{self.until} {self.seconds * 1e3:.2f} ms"
        if self.typical is None:
            return f"{head} (no step that is not slow has it)"
        ratio = f"{self.seconds / self.typical:.1f}x" if self.typical > 0 else "from 0 ms"
        return f"{head} (typical {self.typical * 1e3:.2f} ms, {ratio})"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Span:
        typical = d.get("typical")
        return cls(str(d["stage"]), str(d["until"]), float(d["seconds"]), None if typical is None else float(typical),
                   bool(d.get("wait")))


@dataclass(frozen=True)
class SlowStep:
    """A step of the window that took more than SLOW times its typical step, and where its time went."""

    step: int
    seconds: float
    """Its step_time_s in training.csv."""
    ratio: float
    """``seconds`` over the window's typical step."""
    cause: Cause
    rank: int | None = None
    """The rank whose heartbeats give the cause (module docstring: Ranks); None of NO_STAGES."""
    stage: str | None = None
    """Of Cause.STAGE: the stage whose work grew."""
    spans: tuple[Span, ...] = ()
    """That rank's spans of the step, in the order its records opened them (the wait last)."""

    @property
    def excess(self) -> float:
        """The step's time in its rank's heartbeats less its spans' typical lengths."""
        return sum(s.excess for s in self.spans)

    def said(self) -> str:
        """'the whole host stalled', 'the data stage grew'."""
        return f"{stage_name(self.stage or '?')} grew" if self.cause == Cause.STAGE else _SAID[self.cause]

    def text(self, ranks: int) -> str:
        """What the step's spans show: its cause, why, and every span against its typical length."""
        on = f" (rank {self.rank}'s heartbeats)" if ranks > 1 and self.rank is not None else ""
        head = f"step {self.step}{on}: {self.said()}"
        if self.cause == Cause.NO_STAGES:
            return (f"{head}: no rank's heartbeats hold a span of it (a step record of it and of the step before "
                    "it, with stage records between)")
        over = f"the step's {self.excess * 1e3:.2f} ms over its typical spans"
        top = max((s for s in self.spans if s.wait == (self.cause == Cause.GPU_WAIT)), key=lambda s: s.excess,
                  default=None)
        why = {Cause.WHOLE_HOST: f"every host stage's span at {GREW:g}x its typical or more",
               Cause.STAGE: f"its span holds {_share(top, self.excess)} of {over}",
               Cause.GPU_WAIT: f"it holds {_share(top, self.excess)} of {over}; heartbeats cannot tell a slower "
                               "device from a host stalled inside that span alone",
               Cause.UNCLEAR: f"{over}"}[self.cause]
        host = ", ".join(s.text() for s in self.spans if not s.wait)
        wait = next((s.text() for s in self.spans if s.wait), None)
        return f"{head} ({why}): {host}" + (f"; the wait for the GPU, {wait}" if wait else "")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SlowStep:
        return cls(int(d["step"]), float(d["seconds"]), float(d["ratio"]), Cause(d["cause"]),
                   None if d.get("rank") is None else int(d["rank"]), d.get("stage"),
                   tuple(Span.from_json(s) for s in d.get("spans") or ()))


def _share(span: Span | None, excess: float) -> str:
    return "?" if span is None or excess <= 0 else f"{span.excess / excess:.0%}"


@dataclass(frozen=True)
class Drift:
    """A window whose step time rose or fell step after step (module docstring: Drift)."""

    first_s: float
    """The median step time of the window's first third."""
    last_s: float
    """The median step time of its last third."""
    third: int
    """The steps in each third."""
    rho: float
    """The step times' rank correlation with the steps."""

    @property
    def way(self) -> str:
        return "rose" if self.rho > 0 else "fell"

    def summary(self) -> str:
        """'step time rose through the window, 20.50 to 38.20 ms'."""
        return f"step time {self.way} through the window, {self.first_s * 1e3:.2f} to {self.last_s * 1e3:.2f} ms"

    def text(self, steps: int) -> str:
        return (f"the window's {steps} logged steps' time {self.way} step after step (rank correlation with the step "
                f"{self.rho:.2f}): median {self.first_s * 1e3:.2f} ms over its first {self.third} steps, "
                f"{self.last_s * 1e3:.2f} ms over its last {self.third}: a drift, not a few slow steps")

    @classmethod
    def from_json(cls, d: Any) -> Drift | None:
        if not isinstance(d, dict):
            return None
        return cls(float(d["first_s"]), float(d["last_s"]), int(d["third"]), float(d["rho"]))


@dataclass(frozen=True)
class Unsteady:
    """Why a failed toks_per_s_cv gate's window was unsteady: its slow steps, each with where its time
    went, or its drift."""

    steps: int
    """The window's logged steps."""
    typical_s: float
    """The median step_time_s of the window's steps that are not slow."""
    slow: tuple[SlowStep, ...]
    cv_without: float | None
    """toks_per_s_cv of the window without its slow steps (None where their tokens/s have no mean)."""
    ranks: int = 1
    """The ranks whose heartbeats were read."""
    drift: Drift | None = None
    """Where the window drifted (then no step is slow and no heartbeat read)."""

    @property
    def causes(self) -> tuple[Cause, ...]:
        """Each cause of a slow step, in the order the steps ran."""
        return tuple(dict.fromkeys(s.cause for s in self.slow))

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages whose own work grew (Cause.STAGE), in the order the steps ran."""
        return tuple(dict.fromkeys(s.stage for s in self.slow if s.cause == Cause.STAGE and s.stage))

    def summary(self) -> str:
        """'1 slow step: the whole host stalled (step 7)'; 'slow steps 7, 8: only the wait for the GPU
        grew (step 7), the whole host stalled (step 8)'; 'step time rose through the window, 20.50 to 38.20 ms'."""
        if self.drift is not None:
            return self.drift.summary()
        groups: dict[str, list[int]] = {}
        for s in self.slow:
            groups.setdefault(s.said(), []).append(s.step)
        n = len(self.slow)
        return f"{n} slow step{'s' if n > 1 else ''}: " + ", ".join(
            f"{said} ({'steps' if len(steps) > 1 else 'step'} {', '.join(map(str, steps))})"
            for said, steps in groups.items())

    def lines(self, heartbeats: str) -> list[str]:
        """The slow steps and the spread without them; each listed step's spans; the heartbeat
        files read (``heartbeats``: their paths as the finding names them); of a drift, the drift."""
        if self.drift is not None:
            return [self.drift.text(self.steps)]
        n = len(self.slow)
        listed = ", ".join(f"step {s.step} {s.seconds * 1e3:.2f} ms ({s.ratio:.2f}x)" for s in self.slow[:LISTED])
        more = f" and {n - LISTED} more" if n > LISTED else ""
        without = "it" if n == 1 else "them"
        cv = "has no mean" if self.cv_without is None else f"is {self.cv_without:.4g}"
        head = (f"{n} of the window's {self.steps} logged steps slow (over {SLOW:g}x its typical step, "
                f"{self.typical_s * 1e3:.2f} ms, the median of those that are not): {listed}{more}; without {without} "
                f"the window's toks_per_s_cv {cv}")
        return [head, *(s.text(self.ranks) for s in self.slow[:LISTED]), f"heartbeats: {heartbeats}"]

    @classmethod
    def from_json(cls, d: Any) -> Unsteady | None:
        """A stored gate's ``unsteady``; None where it holds none."""
        if not isinstance(d, dict):
            return None
        cv = d.get("cv_without")
        return cls(int(d["steps"]), float(d["typical_s"]), tuple(SlowStep.from_json(s) for s in d.get("slow") or ()),
                   None if cv is None else float(cv), int(d.get("ranks", 1)), Drift.from_json(d.get("drift")))


def explain(csv: pd.DataFrame | None, heartbeats: Mapping[int, Sequence[Mapping[str, Any]]],
            last: int | None) -> Unsteady | None:
    """The drift or the slow steps of the window of the last ``last`` logged steps (all: None) of a
    run's training.csv as read, with where each slow step's time went by its heartbeats (per rank,
    their records in file order); None where the window has fewer than two timed steps, or, where it
    did not drift, rank 0 left no heartbeats or none of its steps is slow."""
    if csv is None or csv.empty or "step_time_s" not in csv:
        return None
    rows = window_rows(csv, last)
    times = {int(s): float(t) for s, t in zip(rows["step"], rows["step_time_s"]) if math.isfinite(t) and t > 0}
    if len(times) < 2:
        return None
    drift = _drift(times)
    if drift is not None:
        return Unsteady(len(times), statistics.median(times.values()), (), None, 0, drift)
    if not heartbeats.get(0):
        return None
    typical, slow = _slow(times)
    if not slow:
        return None
    toks = [float(v) for s, v in zip(rows["step"], rows["toks_per_s"]) if int(s) in times and int(s) not in slow]
    mean = statistics.fmean(toks) if toks else 0.0
    cv = statistics.pstdev(toks) / mean if mean > 0 and all(map(math.isfinite, toks)) else None
    steady = [s for s in times if s not in slow]
    read = {r: _rank_spans(recs, times) for r, recs in heartbeats.items() if recs}
    steps = []
    for step in sorted(slow):
        by_rank = {r: _typed(spans.get(step), spans, steady) for r, spans in read.items()}
        rank, found = _blamed(by_rank)
        cause, stage = _cause(found)
        steps.append(SlowStep(step, times[step], times[step] / typical, cause, None if cause == Cause.NO_STAGES
                              else rank, stage, found))
    return Unsteady(len(times), typical, tuple(steps), cv, len(read))


def from_files(out_dir: Path, last: int | None) -> Unsteady | None:
    """``explain`` of the training.csv and heartbeats a run left in ``out_dir``, as they are now;
    None where they cannot be read."""
    try:
        return explain(read_training_csv(out_dir), read_heartbeats(out_dir), last)
    except (ArtifactError, OSError):
        return None


def heartbeat_files(out_dir: str, unsteady: Unsteady) -> str:
    """The heartbeat files an explanation read, as a finding names them: rank 0's, or every rank's."""
    ranks = sorted({s.rank for s in unsteady.slow if s.rank is not None} | {0})
    return " and ".join(f"{out_dir}/{heartbeat_name(r)}" for r in ranks)


def _drift(times: Mapping[int, float]) -> Drift | None:
    """The window's drift (module docstring: Drift), or None."""
    if len(times) < DRIFT_STEPS:
        return None
    import pandas as pd  # here, not at import: module docstring of validation/contract/files.py

    ordered = [times[s] for s in sorted(times)]
    ranks = pd.Series(ordered).rank().tolist()  # ties share their mean rank
    if len(set(ranks)) < 2:
        return None
    rho = statistics.correlation(ranks, [float(i) for i in range(len(ordered))])
    if abs(rho) < DRIFT:
        return None
    third = len(ordered) // 3
    return Drift(statistics.median(ordered[:third]), statistics.median(ordered[-third:]), third, rho)


def _slow(times: Mapping[int, float]) -> tuple[float, set[int]]:
    """The window's typical step time and its slow steps (the module docstring)."""
    slow: set[int] = set()
    while True:
        typical = statistics.median(t for s, t in times.items() if s not in slow)
        more = {s for s, t in times.items() if s not in slow and t > SLOW * typical}
        if not more:
            return typical, slow
        slow |= more


#: a step's spans on one rank: (stage, wait) -> [seconds, the stage of the record that first closed it]
_Raw = dict[tuple[str, bool], list[Any]]


def _rank_spans(records: Sequence[Mapping[str, Any]], steps: Mapping[int, float]) -> dict[int, _Raw]:
    """Per step of ``steps``, its spans in one rank's records (the module docstring: Spans); a step
    without them is left out."""
    beats = [r for r in records if isinstance(r.get("time"), (int, float)) and not isinstance(r.get("time"), bool)]
    ends = {r.get("step"): i for i, r in enumerate(beats) if r.get("stage") == STEP_RECORD}
    out: dict[int, _Raw] = {}
    for step in steps:
        first, last = ends.get(step - 1), ends.get(step)
        if first is None or last is None or last - first < 2:
            continue
        raw: _Raw = {}
        for i in range(first, last):
            opened, closed = beats[i], beats[i + 1]
            key = (str(opened.get("stage") or "?"), i == last - 1)
            seconds = float(closed["time"]) - float(opened["time"])
            if key in raw:
                raw[key][0] += seconds
            else:
                raw[key] = [seconds, str(closed.get("stage") or "?")]
        out[step] = raw
    return out


def _typed(raw: _Raw | None, spans: Mapping[int, _Raw], steady: Sequence[int]) -> tuple[Span, ...]:
    """A step's spans on a rank, each against the median of the same span over its steady steps."""
    if raw is None:
        return ()
    out = []
    for key, (seconds, until) in raw.items():
        seen = [spans[s][key][0] for s in steady if s in spans and key in spans[s]]
        out.append(Span(key[0], until, seconds, statistics.median(seen) if seen else None, key[1]))
    return tuple(out)


def _blamed(by_rank: Mapping[int, tuple[Span, ...]]) -> tuple[int, tuple[Span, ...]]:
    """The rank a step's cause is read from (the module docstring: Ranks) and its spans."""
    host = {r: spans for r, spans in by_rank.items() if _cause(spans)[0] in (Cause.WHOLE_HOST, Cause.STAGE)}
    if host:
        rank = max(host, key=lambda r: sum(max(s.excess, 0.0) for s in host[r] if not s.wait))
        return rank, host[rank]
    rank = 0 if by_rank.get(0) else min((r for r, spans in by_rank.items() if spans), default=0)
    return rank, by_rank.get(rank, ())


def _cause(spans: tuple[Span, ...]) -> tuple[Cause, str | None]:
    """The cause a rank's spans of a slow step give, and of Cause.STAGE its stage (the module
    docstring's rules, in order)."""
    if not spans:
        return Cause.NO_STAGES, None
    host = [s for s in spans if not s.wait]
    excess = sum(s.excess for s in spans)
    if len(host) >= 2 and all(s.grew for s in host):
        return Cause.WHOLE_HOST, None
    top = max(host, key=lambda s: s.excess, default=None)
    if top is not None and top.grew and excess > 0 and top.excess >= HOLDS * excess:
        return Cause.STAGE, top.stage
    wait = next((s for s in spans if s.wait), None)
    if wait is not None and excess > 0 and wait.excess >= HOLDS * excess:
        return Cause.GPU_WAIT, None
    return Cause.UNCLEAR, None
