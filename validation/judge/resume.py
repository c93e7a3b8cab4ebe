"""Resume equivalence: a run stopped after N steps and resumed from its checkpoint for the rest,
against an uninterrupted run of the same seed, step by step.

The resumed run's curve is the first half's steps 1..N and the second half's from N + 1 on.
Four gates, the first three each naming the first step that breaks it:

* ``resume_loss_rel_diff``: the largest relative difference of the loss over the uninterrupted
  run's logged steps, within the profile's ``resume_loss_rtol`` (0 where the run is deterministic:
  bit-identical to the printed digits);
* ``resume_lr_rel_diff``: the same for the learning rate, within the same tolerance (the schedule
  must continue where it stopped);
* ``resume_data_gap``: where the resumed run's data starts minus where the first half's ended,
  which must be 0, when both halves record env.json's ``data_position`` (without it the loss
  curve alone tells, and there is no such gate);
* ``resume_first_step``: the first step the second half trained (``trained``), which must
  lie after the stop; UNMEASURED (``Pending.NOT_PROVIDED``) where its files cannot tell: without
  heartbeat records of a step and without its adapter's record of the steps it trained, a second
  half that trained from step 1 again with the same seed logs the first half's losses and learning
  rates, which the other gates read as continued. A first record says only that the half began
  at its step or before it, by as many steps as the trainer's records lie apart (``apart``: a
  trainer that beats every 5 steps writes its first at step 5 whether it resumed after step 3 or
  began at step 1), so the gate reads the earliest step the half may have begun at.

A step the uninterrupted run logged and the resumed one did not is NO_DATA, naming the step.

Before any gate, each half is held to what it was asked (``Breach``), since the gates read the
first half's steps up to the stop and the second half's after it, and cannot see either break it:
a first half that ran past the step it was asked to stop after leaves a checkpoint of another step
(the second half then resumes from it, or has nothing left to run); a second half that trained a
step at or before the stop did not resume from the checkpoint (it ignored it, or its loader fell
back to a fresh start), and where the run is deterministic its retrained steps log the same loss
and learning rate as the first half's, which the gates then read as continued. What it trained is
what its own heartbeat records say, or, of a trainer that writes none, the steps its own records
show where its adapter can tell them from those it inherited (env.json's ``adapter.trained``: a
Hugging Face Trainer's TensorBoard events) (``not_resumed``).

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
import functools
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsa.contract import DATA_POSITION, HEARTBEAT_STAGES_IN_STEP
from validation.contract.check import adapter_trained
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
FIRST_STEP_METRIC = "resume_first_step"
METRICS = (LOSS_METRIC, LR_METRIC, DATA_METRIC, FIRST_STEP_METRIC)
#: the gates of every resume point whose halves all ran (the data gap only where both record a data
#: position): a stored PASS without one was judged without that check (store/stale.py)
JUDGED = (LOSS_METRIC, LR_METRIC, FIRST_STEP_METRIC)
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


class BreachKind(enum.StrEnum):
    RAN_PAST_STOP = "ran_past_stop"
    """The first half went on past the step it was asked to stop after."""
    NOT_RESUMED = "not_resumed"
    """The second half trained a step at or before the first half's stop: it did not resume."""


@dataclass(frozen=True)
class Breach:
    """A half of a resume point that did not do what it was asked (the module's docstring): the
    point's verdict before any gate."""

    kind: BreachKind
    resume_after: int
    step: int
    """RAN_PAST_STOP: the furthest step the first half logged or began; NOT_RESUMED: the first step
    the second half trained."""
    rank: int | None = None
    pid: int | None = None
    """NOT_RESUMED: the rank whose heartbeat record shows that step, and its process (where it says one)."""
    records: str | None = None
    files: tuple[str, ...] = ()
    """NOT_RESUMED of a trainer that writes no heartbeats: the records of its own that show the step
    ('its TensorBoard events', check.TrainedSteps), and their files in the half's run directory."""

    def text(self) -> str:
        if self.kind == BreachKind.RAN_PAST_STOP:
            return (f"ran past the step it was asked to stop after: it went on to step {self.step} when asked to "
                    f"stop after step {self.resume_after}")
        again = (f"step {self.step}" if self.step == self.resume_after
                 else f"steps {self.step}-{self.resume_after}")
        process = f", pid {self.pid}" if self.pid is not None else ""
        shown = self.records or f"rank {self.rank}'s heartbeats{process}"
        return (f"did not resume: the second half trained {again} again (it started at step {self.step}, not "
                f"step {self.resume_after + 1}: {shown})")


def ran_past(run: RunData, stop_after: int) -> Breach | None:
    """Of a first half asked to stop after ``stop_after`` steps: the furthest step its training.csv
    logs or its heartbeats reach, where beyond the stop (a record of a stage within a step there
    says it began that step)."""
    logged = [int(run.csv["step"].max())] if run.csv is not None and not run.csv.empty else []
    beaten = [step for recs in run.heartbeats.values() for rec in recs if (step := _int(rec, "step")) is not None]
    furthest = max(logged + beaten, default=0)
    return Breach(BreachKind.RAN_PAST_STOP, stop_after, furthest) if furthest > stop_after else None


@dataclass(frozen=True)
class Trained:
    """The first step a second half's own records show it trained, and which records show it."""

    step: int
    rank: int | None = None
    pid: int | None = None
    """Of heartbeats: the rank whose record shows that step, and its process (where it says one)."""
    records: str | None = None
    files: tuple[str, ...] = ()
    """Of a trainer that writes no heartbeats: the records of its own that show the step ('its
    TensorBoard events', check.TrainedSteps), and their files in the half's run directory."""

    def shown(self) -> str:
        """'rank 0's heartbeats, pid 7' or 'its TensorBoard events'."""
        process = f", pid {self.pid}" if self.pid is not None else ""
        return self.records or f"rank {self.rank}'s heartbeats{process}"


def trained(first: RunData, second: RunData, resume_after: int) -> list[Trained]:
    """What a second half resumed after ``resume_after`` shows of the steps it trained: the first
    step its own heartbeat records show, then the first its adapter says it trained; each where
    its records tell (none: nothing tells).

    Its own records are those the first half's files do not hold: a trainer that copies the earlier
    run's files into its new directory brings their records along, as it does their rows (which
    ``resumed_curve`` drops), and a record copied is the same event, its time included. A step is
    trained by any own record of it but the stop's own, which only a record of a stage within it
    shows (it began that step), since a process that resumed may well say, in a record of a step
    done, the step its checkpoint holds. Of a trainer without heartbeats, its adapter's record
    (logged: each one done by this process)."""
    copied = {_event(rank, rec) for rank, recs in first.heartbeats.items() for rec in recs}
    beats = [(step, rank, rec) for rank, recs in sorted(second.heartbeats.items()) for rec in recs
             if (step := _int(rec, "step")) is not None and step >= 1
             and (step != resume_after or rec.get("stage") in HEARTBEAT_STAGES_IN_STEP)
             and _event(rank, rec) not in copied]
    out = []
    if beats:
        step, rank, rec = min(beats, key=lambda t: t[0])
        out.append(Trained(step, rank, _int(rec, "pid")))
    own = adapter_trained(second.env)
    if own is not None:
        out.append(Trained(own.first, records=own.records, files=own.files))
    return out


def not_resumed(first: RunData, second: RunData, resume_after: int) -> Breach | None:
    """Of a second half resumed after ``resume_after``: the first step at or before it that its
    own records show it trained (``trained``: its heartbeats', else its adapter's), or None where
    they show none (or nothing tells: ``resume_first_step`` is then UNMEASURED)."""
    again = next((t for t in trained(first, second, resume_after) if t.step <= resume_after), None)
    if again is None:
        return None
    return Breach(BreachKind.NOT_RESUMED, resume_after, again.step, again.rank, again.pid, again.records, again.files)


#: what tells the steps a second half trained, said where nothing did
NO_TRAINED_RECORD = ("the second half left no heartbeat record of a step and its adapter no record of the steps it "
                     "trained, so nothing tells whether it resumed or trained from step 1 again (which, of the same "
                     "seed, logs the first half's losses again)")
HF_TRAINED_HINT = "a Hugging Face Trainer's are its TensorBoard events: --report_to tensorboard"


def apart(shown: Trained, reference: RunData, first: RunData, second: RunData) -> int | None:
    """The most steps the trainer's records of ``shown``'s kind lie apart in the three runs (1: a
    record every step), counted from the start in the two that began at step 1 (the uninterrupted
    run, the first half): a run whose records lie up to k steps apart wrote its first within k steps
    of its start. Of heartbeats, each rank's own records; of an adapter's record, the first step it
    shows of a run from step 1. None where no run shows it."""
    if shown.records is not None:
        return max((t.first for run in (reference, first) if (t := adapter_trained(run.env)) is not None), default=None)
    copied = {_event(rank, rec) for rank, recs in first.heartbeats.items() for rec in recs}
    gaps = []
    for run, start in ((reference, [0]), (first, [0]), (second, [])):
        for rank, recs in run.heartbeats.items():
            steps = sorted({step for rec in recs if (step := _int(rec, "step")) is not None and step >= 1
                            and (run is not second or _event(rank, rec) not in copied)})
            at = start + steps
            gaps += [b - a for a, b in zip(at, at[1:])]
    return max(gaps, default=None)


def first_step_gate(reference: RunData, first: RunData, second: RunData, resume_after: int) -> GateResult:
    """``resume_first_step``: the earliest step the second half may have begun at, after the stop;
    UNMEASURED where its files do not tell (the module's docstring)."""
    shown = trained(first, second, resume_after)
    description = "the first step the resumed second half trained: after the stop, not again from its start"
    gate = functools.partial(GateResult, FIRST_STEP_METRIC, ">", float(resume_after), "the second half's own records")
    if not shown:
        adapter = (second.env or {}).get("adapter")
        hint = f" ({HF_TRAINED_HINT})" if isinstance(adapter, dict) and adapter.get("name") == "hf_trainer" else ""
        return gate(None, GateVerdict.UNMEASURED, None, description, NO_TRAINED_RECORD + hint, Pending.NOT_PROVIDED)
    again = min(shown, key=lambda t: t.step)
    if again.step <= resume_after:  # a record of a step it trained: not_resumed's breach
        return gate(float(again.step), GateVerdict.FAIL, None, description,
                    f"the second half began at step {again.step} ({again.shown()}), not after the stop after step "
                    f"{resume_after}")
    # each kind of record bounds the start on its own: the tightest is the latest earliest step
    bounds = [(t, k, t.step - k + 1 if k is not None else None)
              for t in shown for k in [apart(t, reference, first, second)]]
    t, k, earliest = max(bounds, key=lambda b: b[2] or 0)
    after = "the first after the stop" if earliest == resume_after + 1 else f"after the stop after step {resume_after}"
    if k == 1:
        return gate(float(earliest), GateVerdict.PASS, None, description,
                    f"the second half began at step {t.step} ({t.shown()}), {after}")
    what = "heartbeat record" if t.records is None else "record"
    said = f"the second half's first {what} is of step {t.step} ({t.shown()}), and "
    if earliest is not None and earliest > resume_after:
        return gate(float(earliest), GateVerdict.PASS, None, description,
                    said + f"this trainer's records lie up to {k} steps apart, so it began at step {earliest} or "
                    f"later, {after}")
    spread = (f"this trainer's records lie up to {k} steps apart, so it began at step {max(earliest, 1)} or later"
              if earliest is not None else "no run shows how far apart this trainer's records lie")
    return gate(None, GateVerdict.UNMEASURED, None, description,
                said + spread + ": nothing tells whether it resumed or trained from step 1 again (which, of the same "
                "seed, logs the first half's losses again)", Pending.NOT_PROVIDED)


def _int(rec: dict[str, Any], key: str) -> int | None:
    """A record's integer field (a step, a pid); None where it holds none (or a bool, or a float)."""
    v = rec.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _event(rank: int, rec: dict[str, Any]) -> str:
    """What makes a heartbeat record the one event it records, wherever a file holds it."""
    return json.dumps([rank, rec.get("time"), rec.get("step"), rec.get("stage"), rec.get("pid")])


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


def placed(step: int, resume_after: int) -> str:
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
        return (f"first diverging step {f.step} ({placed(f.step, resume_after)}): {what} {f.got:.6g} resumed vs "
                f"{f.want:.6g} uninterrupted (rel {f.rel:.3g})")
    same = "identical at every logged step" if c.worst == 0 else f"largest rel difference {c.worst:.3g}"
    return f"{what} of steps 1-{last} continued: {same}"


def gates(uninterrupted: RunData, first: RunData, second: RunData, resume_after: int,
          rtol: float | None) -> list[GateResult]:
    """The resume gates of one point (see the module's docstring)."""
    first_env, second_env, reference = first.env, second.env, uninterrupted.csv
    resumed = resumed_curve(first.csv, second.csv, resume_after)
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
    out.append(first_step_gate(uninterrupted, first, second, resume_after))
    return out


def _position(env: dict[str, Any] | None, end: str) -> float | None:
    pos = (env or {}).get(DATA_POSITION)
    value = pos.get(end) if isinstance(pos, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
