"""Stored gates judged against the runbook's gates as they are now, as golden gates are (goldens.py):
a threshold or an operator changed since the run (a floor raised in the profile, a gate tightened
in the runbook) re-checks the value the run measured, so that a report re-rendered after the change
shows the verdict the runbook asks for now, not the one of the run (a stored PASS of 'toks_per_s_mean
>= 20,000' is no PASS of '>= 30,000').

The value is re-checked only where it means the same: the same metric over the same window. A gate
the runbook asks now that the run was not asked (a new metric, another window) has no stored
value; stale.py counts a passed point with such a gate as not run. Gates the run evaluated and the
runbook no longer asks stay as stored (never a PASS by taking a gate away), as do the golden and
repeat gates (goldens.py) and the gates no threshold decides (a metric the trainer does not
provide, no peak FLOP/s, no data).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from validation.judge.gates import (GOLDEN_METRIC, REPEAT_LOSS_METRIC, Gate, GateResult, GateVerdict, Pending, Window,
                                    check, rule)
from validation.judge.record import PhaseRecord
from validation.judge.verdict import rejudge
from validation.runbook.plan import PhasePoint

#: gates re-checked elsewhere (goldens.py) or by nothing a threshold decides
_NOT_HERE = (GOLDEN_METRIC, REPEAT_LOSS_METRIC)
_DECIDED_WITHOUT_THRESHOLD = (Pending.NOT_PROVIDED, Pending.NO_PEAK, Pending.NO_GOLDEN)


@dataclass(frozen=True)
class Rechecked:
    """One stored gate whose threshold or operator the runbook changed since the run."""

    then: GateResult
    now: GateResult

    def text(self) -> str:
        return (f"{self.then.metric} ({self.then.window}): {rule(self.then.op, self.then.threshold)} at the run, "
                f"{rule(self.now.op, self.now.threshold)} now; "
                f"{self.then.verdict} then, {self.now.verdict} now")


def asked_now(point: PhasePoint, stored: GateResult) -> Gate | None:
    """The runbook's gate of the same metric and window as ``stored``, None where it asks none."""
    window = Window.parse(stored.window)
    return next((g for g in point.gates() if g.metric == stored.metric and g.window == window), None)


def _source(now: Gate) -> str:
    """Where the gate's threshold now comes from: a profile key, or the runbook's own number."""
    return (f"the profile's {now.threshold_ref} makes the gate" if now.threshold_ref
            else "the runbook's gate is")


def recheck(rec: PhaseRecord, point: PhasePoint) -> tuple[PhaseRecord, list[Rechecked]]:
    """``rec`` with each gate whose threshold or operator changed re-checked against the runbook's
    gate now, its verdict derived again where one did; what changed."""
    gates, found = [], []
    for g in rec.gates:
        now = asked_now(point, g)
        if (now is None or g.metric in _NOT_HERE or g.pending in _DECIDED_WITHOUT_THRESHOLD
                or g.verdict == GateVerdict.NO_DATA or (now.op, now.threshold) == (g.op, g.threshold)):
            gates.append(g)
            continue
        verdict = check(g.value, now.op, now.threshold)
        again = dataclasses.replace(
            g, op=now.op, threshold=now.threshold, threshold_ref=now.threshold_ref, verdict=verdict,
            pending=Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None,
            note="; ".join(filter(None, [g.note, f"re-checked at report time: {_source(now)} "
                                                  f"{rule(now.op, now.threshold)} now, {rule(g.op, g.threshold)} "
                                                  f"at the run ({g.verdict} then)"])))
        gates.append(again)
        found.append(Rechecked(g, again))
    return (rejudge(rec, gates) if found else rec), found
