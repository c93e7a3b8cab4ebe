"""Stored records judged against the runbook as it is now, where it matters: a record whose run was
asked for something other than what the runbook's point asks now (a stored 6-step GO is no 60-step
GO) counts as not run (INCOMPLETE, never GO): the report names each key that changed, its value at
the run and now, and the command that re-runs only that point. Its stored verdict, whatever it was,
is no verdict of the point the runbook asks for now.

What a change to each key of a phase means is declared with the key (``Stale`` in
validation/runbook/schema.py, on the fields of validation/runbook/types.py; docs/runbook_format.md
shows it): any change (steps, config, overrides, env, kind, launcher and world size, resume step,
pytest tests and arguments, and the ``trainer:`` entry as it launches the point), only more
(repeats: a stored 3-run pass holds a pass of every run, so a runbook now asking 1 keeps it), only
one asked now of a passed point (a gate of a new metric or window, a golden comparison: a changed
threshold or golden file is re-checked from what is stored, thresholds.py and report/build.py),
through other keys, or never (text for people, where the agents meet). A machine now below the
point's hardware minimum, and a trainer that no longer supports the kind, change it too.

The time allowances (``ALLOWANCES``) change a stored result only where the direction of the change
can: raised since the run, they change a run they may have ended (``Limit``: a timed-out run, a
stall-stopped one quiet for less than the new allowance, a failed multi-node run that never logged
a step) and no other (a crash, a failed gate or a pass happened within the old allowance, so within
the new one too). Lowered, they change a run that did not fail and took longer than the new
allowance (its wall time bounds every quiet spell, and the whole of each of its processes): it may
have been stopped now; a failed run stays a failure (it fails the same or sooner), and a pass that
took less than the new allowance passes within it.

Records keep what was asked (judge/asked.py). Of records of older harnesses, which kept none,
what they kept is read: their steps (not of a resume point that failed: it stores its failed
half's), their overrides, and their world size where below the runbook's (env.json's world, which
a record keeps, is never below the processes launched, and may be above them), their kind, their
timeout, wall time and how they ended, their repeats (their sub-runs), the step their passed
resume first half stopped after, and their machine. A key a record did not keep is not compared.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from validation.judge.asked import Asked
from validation.judge.gates import rule
from validation.judge.record import TRAINER_KINDS, PhaseRecord, Status
from validation.runbook.hardware import shortfalls
from validation.runbook.plan import PhasePoint
from validation.runbook.schema import Key as SchemaKey
from validation.runbook.schema import Limit, Stale, keys_of
from validation.runbook.types import Phase, Rendezvous


class Key(enum.StrEnum):
    """A key of the runbook whose value decides what a point's result means."""

    STEPS = "steps"
    CONFIG = "config"
    OVERRIDE = "override"
    ENV = "env"
    WORLD_SIZE = "world size"
    GATE = "gate"
    """A gate the runbook asks now that the run did not evaluate (a new metric, another window): no
    stored value to re-check it by (a changed threshold is re-checked, thresholds.py)."""
    KIND = "kind"
    REPEATS = "repeats"
    """More runs of the point than the run made (fewer keep a stored result: each run was judged)."""
    RESUME_AFTER = "resume_after"
    GOLDEN_STEPS = "golden_steps"
    """A golden comparison the run was not asked (one asked over other steps is re-checked against
    the golden file as it is now, report/build.py)."""
    LAUNCHER = "launcher"
    TRAINER = "trainer"
    PYTEST = "pytest"
    HARDWARE = "hardware"
    """The machine that ran it is below the point's minimum now (it would be skipped there)."""


#: the time allowances, by their dotted runbook key: every key declared ``Stale.ALLOWANCE``
#: (validation/runbook/schema.py), judged against how the run ended (``_allowance``)
ALLOWANCES: dict[str, SchemaKey] = {
    **{k.name: k for k in keys_of(Phase) if k.stale is Stale.ALLOWANCE},
    **{f"launcher.rdzv.{k.name}": k for k in keys_of(Rendezvous) if k.stale is Stale.ALLOWANCE},
}


@dataclass(frozen=True)
class Change:
    key: Key | str
    """A Key, or the dotted runbook key of a time allowance (``ALLOWANCES``)."""
    stored: str
    """The value at the run ('unset': the run had none)."""
    now: str
    """The value the runbook's point has now."""
    name: str = ""
    """The override or variable (OVERRIDE, ENV), the launcher's or trainer's key (LAUNCHER, TRAINER)."""
    why: str = ""
    """Why the change matters to this run, where that depends on how it ran (an allowance)."""

    def text(self) -> str:
        what = f"{self.key} {self.name}" if self.name else str(self.key)
        return f"{what} {self.stored} at the run, {self.now} in the runbook now" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Outdated:
    """A stored record of a point the runbook now asks something else of."""

    record: PhaseRecord
    changes: tuple[Change, ...]

    def text(self) -> str:
        return "; ".join(c.text() for c in self.changes)


def changes(rec: PhaseRecord, point: PhasePoint) -> tuple[Change, ...]:
    """What the runbook's ``point`` asks now that ``rec``'s run was not asked (none of a SKIP:
    nothing ran; the hardware that skipped it is checked when the point runs)."""
    if rec.status == Status.SKIP:
        return ()
    now = Asked.of(point, TRAINER_KINDS)
    return (*_asked(rec, now), *_recorded(rec, point, now), *_new_gates(rec, point))


def _new_gates(rec: PhaseRecord, point: PhasePoint) -> list[Change]:
    """Of a passed point: the gates it would have to pass now that its run was not asked to (a
    failed point is no GO whatever they say; a record that kept no gates cannot tell)."""
    then = rec.asked.gates if rec.asked is not None else None
    if rec.status != Status.PASS or then is None:
        return []
    out = [Change(Key.GATE, "not asked", f"{rule(g.op, g.threshold)} ({g.window.describe()})", g.metric)
           for g in point.gates() if Asked.gate_key(g) not in then]
    # the golden comparison, a gate of its own: one asked over other steps, or taken away, is
    # re-checked against the golden file or stands as stored (report/build.py)
    if rec.asked.golden_steps == 0 and point.phase.golden_steps:
        out.append(Change(Key.GOLDEN_STEPS, "unset", str(point.phase.golden_steps)))
    return out


def _asked(rec: PhaseRecord, now: Asked) -> tuple[Change, ...]:
    then = rec.asked
    if then is None:
        return _older(rec, now)
    out = []
    if then.steps != now.steps:
        out.append(Change(Key.STEPS, _v(then.steps), _v(now.steps)))
    if then.config != now.config:
        out.append(Change(Key.CONFIG, then.config or "unset", now.config or "unset"))
    out += _mapping(Key.OVERRIDE, then.overrides, now.overrides)
    out += _mapping(Key.ENV, then.env, now.env)
    if then.world_size != now.world_size:
        out.append(Change(Key.WORLD_SIZE, str(then.world_size), str(now.world_size)))
    for key, was, asks in ((Key.LAUNCHER, then.launcher, now.launcher), (Key.TRAINER, then.trainer, now.trainer),
                           (Key.PYTEST, then.pytest, now.pytest)):
        if was is not None and asks is not None:  # None: not kept, or a kind that has none (KIND says)
            out += _mapping(key, was, asks)
    return tuple(out)


def _recorded(rec: PhaseRecord, point: PhasePoint, now: Asked) -> list[Change]:
    """What every record keeps, whether or not it kept what was asked: its kind, its repeats (its
    sub-runs), its timeout and how it ended, its machine; and whether the runbook's trainer still
    runs its kind."""
    phase, out = point.phase, []
    if rec.kind != phase.kind:
        out.append(Change(Key.KIND, rec.kind, phase.kind))
    if rec.kind == phase.kind == "train":
        ran = rec.asked.repeats if rec.asked is not None and rec.asked.repeats is not None else _repeats_run(rec)
        if ran < phase.repeats:
            out.append(Change(Key.REPEATS, str(ran), str(phase.repeats)))
    if rec.kind == phase.kind == "resume":
        kept = rec.asked.resume_after if rec.asked is not None else None
        stopped = kept if kept is not None else _stopped_after(rec)
        if stopped is not None and stopped != phase.resume_after:
            out.append(Change(Key.RESUME_AFTER, str(stopped), str(phase.resume_after)))
    out += _allowances(rec, point, now)
    if rec.hardware is not None:
        short = shortfalls(point.profile, rec.hardware, point.min_gpus)
        if short:
            out.append(Change(Key.HARDWARE, "met the point's minimum", "below it", why="; ".join(short)))
    spec = point.runbook.trainer
    if spec is not None and not spec.supports_phase(phase.kind):
        out.append(Change(Key.TRAINER, f"{phase.kind} supported", f"{phase.kind} not supported", "phases"))
    return out


def _repeats_run(rec: PhaseRecord) -> int:
    """The runs of a train point, from its sub-runs (a repeated point's are repeat1..repeatK)."""
    return sum(1 for s in rec.runs if s.name.startswith("repeat")) or 1


def _stopped_after(rec: PhaseRecord) -> int | None:
    """The step a resume point's first half stopped after, from its sub-run where it passed (it
    completed exactly the steps it was asked); None where it did not."""
    first = next((s for s in rec.runs if s.name == "first" and s.status == Status.PASS), None)
    return first.last_step if first is not None else None


def _allowances(rec: PhaseRecord, point: PhasePoint, now: Asked) -> list[Change]:
    """The time allowances changed since the run where the change may change its result: the
    timeout (every record keeps it; 0 in hand-built ones: not kept) and, where the record kept
    them, the others (the record's ``asked`` keeps each by its key's last name)."""
    then = rec.asked or Asked()
    out = []
    for name, spec in ALLOWANCES.items():
        if spec.limit is Limit.RUN:
            was, asks = rec.timeout_s or None, point.phase.timeout_s
        else:
            attr = name.rsplit(".", 1)[-1]
            was, asks = getattr(then, attr), getattr(now, attr)
        out += _allowance(rec, name, spec.limit, was, asks)
    return out


def _may_have_ended(rec: PhaseRecord, limit: Limit, now: float) -> bool:
    """Whether the allowance, raised to ``now``, may have ended the stored run: it ended the way
    this allowance ends a run (a run stopped before any step logged may have been stopped by
    either of the stall watch's allowances)."""
    seen, stalled = bool(rec.metrics.steps_completed), rec.stalled_s
    if limit is Limit.RUN:
        return rec.timed_out
    if limit is Limit.QUIET:
        return stalled is not None and now > stalled
    if limit is Limit.START:
        return stalled is not None and not seen and now > stalled
    return rec.failed and not seen


def _allowance(rec: PhaseRecord, key: str, limit: Limit, then: float | None, now: float | None) -> list[Change]:
    """A time allowance changed since the run, where the change may change its result (the module's
    docstring): raised, where it may have ended the run; lowered, where the run did not fail and
    took longer than the new allowance."""
    if then is None or now is None or then == now:
        return []
    if now > then and _may_have_ended(rec, limit, now):
        why = "the run timed out" if limit is Limit.RUN else (
            f"the run was stopped as stalled after {rec.stalled_s:g} s without progress" if rec.stalled_s is not None
            else "the run failed before its first step")
    elif now < then and not rec.failed and rec.wall_s > now:
        why = f"the run took {rec.wall_s:g} s"
    else:
        return []
    return [Change(key, f"{then:g}", f"{now:g}", why=why)]


def _older(rec: PhaseRecord, now: Asked) -> tuple[Change, ...]:
    out = []
    if rec.kind in TRAINER_KINDS and not (rec.kind == "resume" and rec.failed) and rec.steps != now.steps:
        out.append(Change(Key.STEPS, _v(rec.steps), _v(now.steps)))
    out += _mapping(Key.OVERRIDE, rec.overrides, now.overrides)
    if rec.world_size < now.world_size:
        out.append(Change(Key.WORLD_SIZE, str(rec.world_size), str(now.world_size)))
    return tuple(out)


def _mapping(key: Key, then: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    return [Change(key, _v(then.get(k)), _v(now.get(k)), k) for k in sorted(set(then) | set(now))
            if then.get(k) != now.get(k) or (k in then) != (k in now)]


def _v(value: Any) -> str:
    return "unset" if value is None else str(value)


def split(records: Iterable[PhaseRecord], points: Iterable[PhasePoint]) -> tuple[list[PhaseRecord], list[Outdated]]:
    """``records`` (of the runbook's points) whose runs are of the points as the runbook asks them
    now, in their order, and those that are not."""
    by_id = {p.test_id: p for p in points}
    current, outdated = [], []
    for r in records:
        point = by_id.get(r.test_id)
        found = changes(r, point) if point is not None else ()
        if found:
            outdated.append(Outdated(r, found))
        else:
            current.append(r)
    return current, outdated
