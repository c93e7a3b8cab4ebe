"""Gates as data: ``metric <op> threshold`` over a window, evaluated with a fixed operator table.

No expression is ever evaluated: the comparison is looked up in OPS by its symbol, and the
runbook loader refuses any symbol that is not a key of OPS.

A gate on a metric the trainer does not provide is UNMEASURED (``Pending.NOT_PROVIDED``), never
FAIL and never PASS: what it lacks is found in its files at judge time, beside what its runbook
entry declares. A windowed gate whose window the run did not cover is NO_DATA, which fails: four
logged steps are no 'last 10 steps'. A timing (a speed) that fails its gate while other work kept
the machine busy is UNMEASURED too (``Pending.BUSY_MACHINE``), unless it would fail however much
the load slowed it: other work only slows a run, so a timing that passes there passes, and one that
fails measured the machine as much as the trainer.
A gate on the trainer's own clock (its step times and tokens/s) fails whatever its value where its
heartbeats and its process's wall time show steps far longer than it logged (``Overruled.CLOCK``,
judge/clock.py): those numbers are not the run's.
"""
from __future__ import annotations

import enum
import math
import operator
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from validation.judge.clock import CLOCKED, StepClock
from validation.judge.metrics import METRICS, RunData, Source, Timing, compute, uncovered
from validation.judge.unsteady import METRIC as UNSTEADY_METRIC, Unsteady, explain
from validation.machine import MachineLoad

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Window:
    """Which rows of training.csv a metric reads: the last ``last`` steps, or all (None)."""

    last: int | None = None

    def describe(self) -> str:
        return f"last {self.last} steps" if self.last else "all steps"

    @classmethod
    def parse(cls, text: str) -> Window:
        """The window a stored gate result names in ``describe``'s words (anything else: all steps)."""
        m = re.fullmatch(r"last (\d+) steps", text)
        return cls(int(m.group(1))) if m else cls()


def shown_window(metric: str, window: str) -> str:
    """A gate's window as people read it beside the gate: '' for a catalogued metric that takes
    none (it reads the whole run: ``loss_finite``, ``tests_failed``), where 'all steps' would say a
    window it never had; ``window`` (a record's words) otherwise."""
    m = METRICS.get(metric)
    return "" if m is not None and not m.windowed else window


@dataclass(frozen=True)
class Gate:
    """``metric <op> threshold`` over ``window``. ``threshold_ref`` names a profile key."""

    metric: str
    op: str
    threshold: float | None
    window: Window = Window()
    threshold_ref: str | None = None
    description: str = ""


class GateVerdict(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    NO_DATA = "NO_DATA"
    """The metric could not be computed from files that should carry it: a failure."""
    UNMEASURED = "UNMEASURED"
    """Nothing to judge by yet; ``Pending`` says why."""


class Pending(enum.StrEnum):
    """Why a gate is UNMEASURED: never a failure of the trainer, never a pass either."""

    THRESHOLD = "threshold to be measured"
    """The profile's threshold is null ('to be measured')."""
    NOT_PROVIDED = "metric the trainer does not provide"
    """The trainer's files lack what the metric reads (or its runbook entry says it lacks it)."""
    NO_GOLDEN = "no golden curve"
    """A golden-loss gate without a blessed curve for this point and hardware class."""
    NO_PEAK = "the hardware profile names no peak FLOP/s"
    """A gate on a metric that divides by the device's peak (mfu) on a profile without one."""
    BUSY_MACHINE = "a timing that failed while other work kept the machine busy"
    """A timing's gate failed on a run other processes competed with for the cores (its value is
    kept: a threshold changed since is judged from it again, by the same rule)."""


class Overruled(enum.StrEnum):
    """Why a gate FAILed whatever its value said."""

    CLOCK = "the trainer's step times disagree with the time the harness saw"
    """A gate on the trainer's own clock (judge/clock.py CLOCKED) of a run whose steps took far
    longer than it logged (StepClock.disputed): its value is kept, not believed."""


#: the golden-loss gate's metric, and that of a golden point's repeats against each other
#: (validation/store/goldens.py evaluates both)
GOLDEN_METRIC = "golden_loss_rel_diff"
REPEAT_LOSS_METRIC = "repeat_loss_rel_diff"


@dataclass(frozen=True)
class GateResult:
    metric: str
    op: str
    threshold: float | None
    window: str
    value: float | None
    verdict: GateVerdict
    threshold_ref: str | None = None
    description: str = ""
    note: str = ""
    """What this evaluation found beyond the number (the golden-loss gate's first diverging step,
    what the trainer's files lack, a window the run did not cover)."""
    pending: Pending | None = None
    """Why the verdict is UNMEASURED (None for any other verdict)."""
    overruled: Overruled | None = None
    """Why the verdict is FAIL whatever the value (None where the value decided)."""
    unsteady: Unsteady | None = None
    """Of a toks_per_s_cv gate that failed on its value: the window's slow steps and where their time
    went (judge/unsteady.py); None for any other gate, and where its run's files cannot say."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateResult:
        verdict = GateVerdict(data["verdict"])
        pending = data.get("pending")
        if pending is None and verdict == GateVerdict.UNMEASURED:  # records written before Pending
            pending = Pending.NO_GOLDEN if data.get("note") else Pending.THRESHOLD
        overruled = data.get("overruled")
        return cls(data["metric"], data["op"], data["threshold"], data["window"], data["value"], verdict,
                   data.get("threshold_ref"), data.get("description") or "", data.get("note") or "",
                   Pending(pending) if pending else None, Overruled(overruled) if overruled else None,
                   Unsteady.from_json(data.get("unsteady")))

    def text(self) -> str:
        """'metric = value, needs op threshold (window)', then the note when there is one."""
        val = "no data" if self.value is None else f"{self.value:.4g}"
        window = shown_window(self.metric, self.window)
        return f"{self.metric} = {val}, needs {rule(self.op, self.threshold)}" + (f" ({window})" if window else "") + (
            f": {self.note}" if self.note else "")


def rule(op: str, threshold: float | None) -> str:
    """'>= 4', or '>= (to be measured)' for a null threshold."""
    return f"{op} {'(to be measured)' if threshold is None else f'{threshold:g}'}"


def check(value: float | None, op: str, threshold: float | None) -> GateVerdict:
    if threshold is None:
        return GateVerdict.UNMEASURED
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return GateVerdict.NO_DATA
    return GateVerdict.PASS if OPS[op](value, threshold) else GateVerdict.FAIL


def judged(result: GateResult, load: MachineLoad | None, clock: StepClock | None = None) -> GateResult:
    """``result`` (its verdict from ``check``): FAIL where it reads the trainer's clock and ``clock``
    (the run's) is disputed, whatever its value. On a run other work competed with (``load``): a
    timing that failed fails where it would fail however much the load slowed it (a speed
    ``load.slowdown`` times higher, a duration as many times shorter), else it is UNMEASURED;
    anything else as it is (other work only slows a run: a timing that passed passes)."""
    if (clock is not None and clock.disputed and result.metric in CLOCKED
            and result.verdict in (GateVerdict.PASS, GateVerdict.FAIL)):
        # the busy machine's rule is not for these: the trainer's numbers are wrong, not the machine's
        return replace(result, verdict=GateVerdict.FAIL, overruled=Overruled.CLOCK, note="; ".join(filter(None, [
            result.note, f"not judged on the trainer's own numbers: {clock.text()}"])))
    timing = METRICS[result.metric].timing
    if result.verdict != GateVerdict.FAIL or timing is None or load is None or not load.busy:
        return result
    said = f"the machine was busy with other work: {load.describe()}"
    alone = _alone(result.value, timing, load.slowdown)
    if alone is not None and check(alone, result.op, result.threshold) == GateVerdict.FAIL:
        return replace(result, note="; ".join(filter(None, [result.note, (
            f"{said}; it fails even at {alone:.4g}, the most a run alone could have reached (at most "
            f"{load.slowdown:.1f}x slower)")])))
    return replace(result, verdict=GateVerdict.UNMEASURED, pending=Pending.BUSY_MACHINE,
                   note="; ".join(filter(None, [result.note, said])))


def _alone(value: float | None, timing: Timing, slowdown: float) -> float | None:
    """The best a timing could have been without the load that slowed it ``slowdown`` times at
    most; None for one no bound says how far the load moved (a spread)."""
    if value is None or timing == Timing.SPREAD:
        return None
    return value * slowdown if timing == Timing.SPEED else value / slowdown


def evaluate(gates: Sequence[Gate], run: RunData, unprovided: Mapping[str, str],
             load: MachineLoad | None = None, clock: StepClock | None = None) -> list[GateResult]:
    """Each gate's value and verdict. ``unprovided``: metric -> what the trainer lacks for it;
    ``load``: how busy other work kept the machine during the run; ``clock``: its trainer's step
    times against the harness's (judge/clock.py)."""
    out = []
    for g in gates:
        base = dict(metric=g.metric, op=g.op, threshold=g.threshold, window=g.window.describe(),
                    threshold_ref=g.threshold_ref, description=g.description)
        if g.metric in unprovided:
            out.append(GateResult(**base, value=None, verdict=GateVerdict.UNMEASURED, note=unprovided[g.metric],
                                  pending=Pending.NOT_PROVIDED))
            continue
        if run.peak_flops is None and any(i.source == Source.HARDWARE for i in METRICS[g.metric].reads):
            out.append(GateResult(**base, value=None, verdict=GateVerdict.UNMEASURED, pending=Pending.NO_PEAK,
                                  note="the profile's hardware section names no peak_bf16_tflops"))
            continue
        value = compute(g.metric, run, g.window.last)
        verdict = check(value, g.op, g.threshold)
        out.append(explained(judged(GateResult(**base, value=value, verdict=verdict,
                                               note=uncovered(METRICS[g.metric], g.window, run) if value is None else "",
                                               pending=Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None),
                                    load, clock), lambda last: explain(run.csv, run.heartbeats, last)))
    return out


def explained(result: GateResult, explain_window: Callable[[int | None], Unsteady | None]) -> GateResult:
    """``result`` with why its window's tokens/s were unsteady (``explain_window`` of its window's
    steps: judge/unsteady.py) where it is a toks_per_s_cv gate that failed on its value and holds
    none yet; without one where it no longer failed so (a threshold re-checked at report time)."""
    failed = (result.metric == UNSTEADY_METRIC and result.verdict == GateVerdict.FAIL and result.overruled is None
              and result.value is not None)
    if not failed:
        return replace(result, unsteady=None) if result.unsteady is not None else result
    if result.unsteady is not None:
        return result
    return replace(result, unsteady=explain_window(Window.parse(result.window).last))
