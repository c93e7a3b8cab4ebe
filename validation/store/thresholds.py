"""Stored gates judged against the runbook's gates as they are now, as golden gates are (goldens.py):
a threshold or an operator changed since the run (a floor raised in the profile, a gate tightened
in the runbook) re-checks the value the run measured, so that a report re-rendered after the change
shows the verdict the runbook asks for now, not the one of the run (a stored PASS of 'toks_per_s_mean
>= 20,000' is no PASS of '>= 30,000').

The value is re-checked only where it means the same: the same metric over the same window. Several
gates of one metric and window (a floor and a ceiling) read one value and are each judged by their
own rule; one added beside them since the run is judged from that value too. A gate the runbook
asks now of another metric or window has no stored value; stale.py counts a passed point with such
a gate as not run. Gates the run evaluated and the
runbook no longer asks stay as stored (never a PASS by taking a gate away), as do the golden and
repeat gates (goldens.py) and the gates no threshold decides (a metric the trainer does not
provide, no peak FLOP/s, no data).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from validation.judge.gates import (GOLDEN_METRIC, REPEAT_LOSS_METRIC, Gate, GateResult, GateVerdict, Pending, Window,
                                    check, judged, rule, shown_window)
from validation.judge.record import PhaseRecord
from validation.judge.verdict import rejudge
from validation.runbook.plan import PhasePoint

#: gates re-checked elsewhere (goldens.py) or by nothing a threshold decides
_NOT_HERE = (GOLDEN_METRIC, REPEAT_LOSS_METRIC)
_DECIDED_WITHOUT_THRESHOLD = (Pending.NOT_PROVIDED, Pending.NO_PEAK, Pending.NO_GOLDEN)


@dataclass(frozen=True)
class Rechecked:
    """One gate judged again from a stored value: its threshold or operator changed since the run,
    or the runbook asks it now beside a stored gate of the same metric and window (``then`` None)."""

    then: GateResult | None
    now: GateResult

    def text(self) -> str:
        gate = self.then or self.now
        window = shown_window(gate.metric, gate.window)
        named = f"{gate.metric} ({window})" if window else gate.metric
        if self.then is None:
            return (f"{named}: {rule(self.now.op, self.now.threshold)} asked now, "
                    f"not at the run; {self.now.verdict} now")
        return (f"{named}: {rule(self.then.op, self.then.threshold)} at the run, "
                f"{rule(self.now.op, self.now.threshold)} now; "
                f"{self.then.verdict} then, {self.now.verdict} now")


def _source(now: Gate) -> str:
    """Where the gate's threshold now comes from: a profile key, or the runbook's own number."""
    return (f"the profile's {now.threshold_ref} makes the gate" if now.threshold_ref
            else "the runbook's gate is")


def _key(metric: str, window: Window) -> tuple[str, Window]:
    return metric, window


def recheck(rec: PhaseRecord, point: PhasePoint) -> tuple[PhaseRecord, list[Rechecked]]:
    """``rec`` with its gates judged against the runbook's gates now, its verdict derived again where
    one changed; what changed. The gates of one metric and window all read one stored value: each
    runbook gate of them keeps the stored gate of its operator and threshold, else takes a stored one
    whose rule changed, else (a gate added beside them) is judged from the value; a stored gate the
    runbook no longer asks stays as it was."""
    asked: dict[tuple[str, Window], list[Gate]] = {}
    for g in point.gates():
        asked.setdefault(_key(g.metric, g.window), []).append(g)
    stored: dict[tuple[str, Window], list[GateResult]] = {}
    for g in rec.gates:
        stored.setdefault(_key(g.metric, Window.parse(g.window)), []).append(g)
    replaced: dict[int, GateResult] = {}  # id of a stored gate -> the gate judged now
    added: list[GateResult] = []
    found: list[Rechecked] = []
    for key, kept in stored.items():
        now = asked.get(key, [])
        if not now or any(_as_stored(g) for g in kept):
            continue
        free, changed = list(kept), []
        for n in now:  # first each runbook gate whose stored twin (same rule) is kept as it is
            twin = next((g for g in free if (g.op, g.threshold) == (n.op, n.threshold)), None)
            if twin is None:
                changed.append(n)
            else:
                free.remove(twin)
        for n in changed:
            if free:
                then = free.pop(0)
                again = _judged(then, n, f"{rule(n.op, n.threshold)} now, {rule(then.op, then.threshold)} at the "
                                         f"run ({then.verdict} then)", rec)
                replaced[id(then)] = again
            else:  # asked beside the stored gates of its metric and window: the same value decides it
                then = None
                again = _judged(kept[0], n, f"{rule(n.op, n.threshold)} now, not asked at the run", rec, fresh=True)
                added.append(again)
            found.append(Rechecked(then, again))
    if not found:
        return rec, []
    gates = [replaced.get(id(g), g) for g in rec.gates] + added
    return rejudge(rec, gates), found


def _as_stored(g: GateResult) -> bool:
    """A stored gate that keeps its verdict whatever the threshold: re-checked elsewhere (goldens.py),
    decided by no threshold, or without data."""
    return g.metric in _NOT_HERE or g.pending in _DECIDED_WITHOUT_THRESHOLD or g.verdict == GateVerdict.NO_DATA


def _judged(stored: GateResult, now: Gate, said: str, rec: PhaseRecord, fresh: bool = False) -> GateResult:
    """``stored``'s value judged by the runbook's gate ``now`` (by the rules for a timing that fails
    on a busy machine, ``rec``'s load, and for a trainer whose clock its heartbeats dispute, its
    evidence's), the note saying so."""
    verdict = check(stored.value, now.op, now.threshold)
    note = f"re-checked at report time: {_source(now)} {said}"
    # the busy and clock notes are said again where their rule holds
    kept = None if fresh or stored.pending == Pending.BUSY_MACHINE or stored.overruled else stored.note
    return judged(dataclasses.replace(
        stored, op=now.op, threshold=now.threshold, threshold_ref=now.threshold_ref, verdict=verdict,
        description=now.description if fresh else stored.description,
        pending=Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None, overruled=None,
        note="; ".join(filter(None, [kept, note]))), rec.load, rec.evidence.clock)
