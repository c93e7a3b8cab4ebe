"""Resume equivalence: a run stopped after N steps and resumed from its checkpoint for the rest,
against an uninterrupted run of the same seed, step by step.

The resumed run's curve is the first half's steps 1..N and the second half's from N + 1 on.
Three gates, each naming the first step that breaks it:

* ``resume_loss_rel_diff``: the largest relative difference of the loss over the uninterrupted
  run's logged steps, within the profile's ``resume_loss_rtol`` (0 where the run is deterministic:
  bit-identical to the printed digits);
* ``resume_lr_rel_diff``: the same for the learning rate, within the same tolerance (the schedule
  must continue where it stopped);
* ``resume_data_gap``: where the resumed run's data starts minus where the first half's ended,
  which must be 0, when both halves record env.json's ``data_position`` (without it the loss
  curve alone tells, and there is no such gate).

A step the uninterrupted run logged and the resumed one did not is NO_DATA, naming the step.

Where the loss did not continue, its curve says more (``clue``). A step's loss is taken before
its update, so a first resumed step whose loss matches and a later one that does not had its
weights and data restored and its update changed: the optimizer's state (its moments, its step
count) was not restored. A resumed loss that lies clearly closer to the uninterrupted run's a few
steps along (or back) than to its own step is data that starts that many steps off: what a model
sees moves the loss of a step more than a few updates do (the tiny model on CPU, a data position
one step on: mean relative difference 0.027 to the uninterrupted run one step along, 0.073 to the
same step; with the optimizer state lost, the same step was the closest).
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsa.contract import DATA_POSITION
from validation.judge.gates import GateResult, GateVerdict, Pending, check
from validation.judge.metrics import RunData

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd

#: the profile threshold: the largest relative difference of loss and learning rate per step
RTOL_KEY = "resume_loss_rtol"
LOSS_METRIC = "resume_loss_rel_diff"
LR_METRIC = "resume_lr_rel_diff"
DATA_METRIC = "resume_data_gap"
METRICS = (LOSS_METRIC, LR_METRIC, DATA_METRIC)
_WHAT = {"loss": "loss", "lr": "learning rate"}


@dataclass(frozen=True)
class StepDiff:
    """The first step of a column beyond the tolerance."""

    step: int
    got: float
    want: float
    rel: float


@dataclass(frozen=True)
class Comparison:
    """One column of the resumed run against the uninterrupted run's."""

    column: str
    worst: float | None
    """The largest relative difference (None: a step of the uninterrupted run is missing)."""
    first: StepDiff | None
    missing: int | None = None
    """The first step the uninterrupted run logged and the resumed one did not."""


class ClueKind(enum.StrEnum):
    UPDATE = "update"
    """The first step after the resume matches the uninterrupted run and a later one does not."""
    SHIFTED = "shifted"
    """The resumed loss lies closer to the uninterrupted run's some steps along than at its own step."""


#: steps of shift tried either way
MAX_SHIFT = 3
#: a shift is named when its mean relative difference is at most this share of the same step's
SHIFT_RATIO = 0.75
#: steps after the resume a shift must be compared over at least
SHIFT_MIN_STEPS = 3


@dataclass(frozen=True)
class Clue:
    """What the resumed loss curve says of why it did not continue (the module's docstring)."""

    kind: ClueKind
    resume_after: int
    diverged: int | None = None
    """UPDATE: the first step beyond the tolerance."""
    shift: int = 0
    """SHIFTED: the resumed run's step s is closest to the uninterrupted run's s + shift."""
    shifted_rel: float | None = None
    same_rel: float | None = None
    """SHIFTED: the mean relative difference at that shift and at the same step."""
    steps: int = 0
    """SHIFTED: the steps compared at that shift."""

    def text(self) -> str:
        first = self.resume_after + 1
        if self.kind == ClueKind.UPDATE:
            return (f"step {first}, the first after the resume, matches the uninterrupted run and step {self.diverged} "
                    f"does not: the weights and the data of step {first} were restored (its loss is taken before its "
                    "update), its update was not the same: the optimizer's state (its moments, its step count) was not "
                    "restored")
        n = abs(self.shift)
        along = f"{n} step{'s' * (n > 1)} {'later' if self.shift > 0 else 'earlier'}"
        return (f"the resumed loss lies closer to the uninterrupted run's {along} (mean rel difference "
                f"{self.shifted_rel:.3g} over {self.steps} steps, {self.same_rel:.3g} at the same step): its data "
                f"likely starts {n} step{'s' * (n > 1)} {'past' if self.shift > 0 else 'before'} where the first "
                "half's ended")


def clue(reference: pd.DataFrame, resumed: pd.DataFrame, resume_after: int, rtol: float) -> Clue | None:
    """What the resumed run's loss after the resume says (the module's docstring), or None where it
    continued, says neither, or either run did not log the first step after the resume."""
    ref = dict(zip(reference["step"].astype(int), reference["loss"].astype(float)))
    got = {s: v for s, v in zip(resumed["step"].astype(int), resumed["loss"].astype(float)) if s > resume_after}
    first = resume_after + 1
    diverged = next((s for s in sorted(got) if s in ref and _rel(got[s], ref[s]) > rtol), None)
    # the first step after the resume is the witness: without it a drift that an update caused (a loss
    # that falls more slowly) reads like data some steps back
    if diverged is None or first not in got or first not in ref:
        return None
    if diverged > first:
        return Clue(ClueKind.UPDATE, resume_after, diverged=diverged)
    same = _mean_rel(got, ref, 0)
    shifts = [(k, m) for k in range(-MAX_SHIFT, MAX_SHIFT + 1) if k and (m := _mean_rel(got, ref, k)) is not None]
    if same is None or not shifts:
        return None
    k, best = min(shifts, key=lambda km: km[1][0])
    if best[0] > SHIFT_RATIO * same[0]:
        return None
    return Clue(ClueKind.SHIFTED, resume_after, shift=k, shifted_rel=round(best[0], 6), same_rel=round(same[0], 6),
                steps=best[1])


def _mean_rel(got: dict[int, float], ref: dict[int, float], shift: int) -> tuple[float, int] | None:
    """The mean relative difference of got[s] and ref[s + shift] over the finite pairs, and their
    count; None with fewer than SHIFT_MIN_STEPS."""
    pairs = [(v, ref[s + shift]) for s, v in got.items()
             if s + shift in ref and math.isfinite(v) and math.isfinite(ref[s + shift])]
    if len(pairs) < SHIFT_MIN_STEPS:
        return None
    return sum(_rel(a, b) for a, b in pairs) / len(pairs), len(pairs)


def resumed_curve(first: pd.DataFrame, second: pd.DataFrame, resume_after: int) -> pd.DataFrame:
    """The resumed run's training.csv rows: the first half's up to ``resume_after``, the second's
    after it (a trainer that copies the earlier rows into its new directory is read the same)."""
    import pandas as pd

    rows = pd.concat([first[first["step"] <= resume_after], second[second["step"] > resume_after]])
    return rows.sort_values("step", kind="stable").reset_index(drop=True)


def resumed_run(first: RunData, second: RunData, resume_after: int, steps: int) -> RunData:
    """The resumed run as the phase's gates read it: the second half's process and files, with
    the first half's steps before its own in training.csv, asked for all ``steps``."""
    return dataclasses.replace(second, csv=resumed_curve(first.csv, second.csv, resume_after), steps_requested=steps)


def compare(resumed: pd.DataFrame, reference: pd.DataFrame, column: str, rtol: float) -> Comparison:
    got = dict(zip(resumed["step"].astype(int), resumed[column].astype(float)))
    worst, first = 0.0, None
    for step, want in zip(reference["step"].astype(int), reference[column].astype(float)):
        if step not in got:
            return Comparison(column, None, first, step)
        rel = _rel(got[step], want)
        worst = max(worst, rel)
        if first is None and rel > rtol:
            first = StepDiff(step, got[step], want, rel)
    return Comparison(column, worst, first)


def _rel(got: float, want: float) -> float:
    if got == want:  # also two equal infinities
        return 0.0
    if not (math.isfinite(got) and math.isfinite(want)):
        return math.inf
    return abs(got - want) / max(abs(want), 1e-12)


def _where(step: int, resume_after: int) -> str:
    """Where a step lies against the stop: a divergence before it is the first half's own."""
    if step <= resume_after:
        return f"before the stop after step {resume_after}: the first half already differs from the uninterrupted run"
    if step == resume_after + 1:
        return f"the first step after the resume at step {resume_after}"
    return f"{step - resume_after} steps after the resume at step {resume_after}"


def _note(c: Comparison, resume_after: int, last: int) -> str:
    what = _WHAT[c.column]
    if c.missing is not None:
        return f"the resumed run logged no {what} for step {c.missing}, which the uninterrupted run logged"
    if c.first is not None:
        f = c.first
        return (f"first diverging step {f.step} ({_where(f.step, resume_after)}): {what} {f.got:.6g} resumed vs "
                f"{f.want:.6g} uninterrupted (rel {f.rel:.3g})")
    same = "identical at every logged step" if c.worst == 0 else f"largest rel difference {c.worst:.3g}"
    return f"{what} of steps 1-{last} continued: {same}"


def gates(reference: pd.DataFrame, first: pd.DataFrame, second: pd.DataFrame, resume_after: int,
          rtol: float | None, first_env: dict[str, Any] | None, second_env: dict[str, Any] | None) -> list[GateResult]:
    """The resume gates of one point (see the module's docstring)."""
    resumed = resumed_curve(first, second, resume_after)
    last = int(reference["step"].max())
    window = f"steps 1-{last}, stopped after {resume_after}"
    out = []
    for column, metric in (("loss", LOSS_METRIC), ("lr", LR_METRIC)):
        c = compare(resumed, reference, column, rtol if rtol is not None else 0.0)
        note = _note(c, resume_after, last)
        if rtol is None:
            note = f"tolerance to be measured (profile {RTOL_KEY}); " + note
        verdict = check(c.worst, "<=", rtol)
        out.append(GateResult(metric, "<=", rtol, window, c.worst, verdict, RTOL_KEY,
                              f"{_WHAT[column]} per step of the resumed run against an uninterrupted run of the same "
                              "seed", note, Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None))
    ended, started = _position(first_env, "end"), _position(second_env, "start")
    if ended is not None and started is not None:
        gap = float(started - ended)
        note = (f"the first half ended at data position {ended:g} and the resumed run started at {started:g}"
                + ("" if gap == 0 else f": {abs(gap):g} {'skipped' if gap > 0 else 'read again'}"))
        out.append(GateResult(DATA_METRIC, "==", 0.0, f"env.json {DATA_POSITION}", gap, check(gap, "==", 0.0),
                              None, "the resumed run's data starts where the first half's ended", note))
    return out


def _position(env: dict[str, Any] | None, end: str) -> float | None:
    pos = (env or {}).get(DATA_POSITION)
    value = pos.get(end) if isinstance(pos, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
