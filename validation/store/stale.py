"""Stored records judged against the runbook as it is now, where it matters: a record whose run was
asked for something other than what the runbook's point asks now (a stored 6-step GO is no 60-step
GO) counts as not run (INCOMPLETE, never GO): the report names each key that changed, its value at
the run and now, and the command that re-runs only that point. Its stored verdict, whatever it was,
is no verdict of the point the runbook asks for now.

What a change to each key of a phase means is declared with the key (``Stale`` in
validation/runbook/schema.py, on the fields of validation/runbook/types.py; docs/runbook_format.md
shows it), and each rule has one comparison here (``COMPARE``): any change; only more (a stored
3-run pass holds a pass of every run, so a runbook now asking 1 keeps it); only one asked now of a
passed point (a gate of a new metric or window, a golden comparison: a changed threshold or golden
file is re-checked from what is stored, thresholds.py and report/build.py); an allowance; or none
(through other keys, never). The value compared is what a record keeps of the key: a field of
``Asked`` (judge/asked.py) that names the key, or one every record keeps (``RECORDED``); the
``trainer:`` entry, no key of a phase, has its rule here (``UNDECLARED``). A machine now below the point's
hardware minimum, and a trainer that no longer supports the kind, change it too; so does a check
this harness makes of every passed point of its kind (``KIND_GATES``: a resume point's
``resume_first_step``) that the stored PASS holds no gate of: the harness that judged it did not
make it, and nothing stored can make it now (the gate reads the halves' files), so the point is
to be run again.

The time allowances (``ALLOWANCES``) change a stored result only where the direction of the change
can: raised since the run, they change a run they may have ended (``Limit``: a timed-out run, a
stall-stopped one quiet for less than the new allowance, a failed multi-node run that never logged
a step) and no other (a crash, a failed gate or a pass happened within the old allowance, so within
the new one too). Lowered, they change a run that did not fail and took longer than the new
allowance (its wall time bounds every quiet spell, and the whole of each of its processes): it may
have been stopped now; a failed run stays a failure (it fails the same or sooner), and a pass that
took less than the new allowance passes within it.

Of records of older harnesses, which kept no ``asked`` (or not yet one of its keys), what they
kept is read instead (``OLDER``): their steps (not of a resume point that failed: it stores its
failed half's), their overrides, their world size where below the runbook's (env.json's world,
which a record keeps, is never below the processes launched, and may be above them), their repeats
(their sub-runs) and the step their passed resume first half stopped after. A key a record did not
keep is not compared.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from validation.judge.asked import Asked
from validation.judge.gates import rule, shown_window
from validation.judge.record import KIND_GATES, TRAINER_KINDS, PhaseRecord, PointKey, Status
from validation.judge.verdict import Outcome, process_verdict
from validation.runbook.hardware import shortfalls
from validation.runbook.plan import TRAINER_PARAM, PhasePoint
from validation.runbook.schema import Key, Limit, Stale, keys_of
from validation.runbook.types import Phase, Rendezvous
from validation.store.results import record_key

#: every key of a stored point, by its dotted runbook key (validation/runbook/schema.py)
DECLARED: dict[str, Key] = {**{k.name: k for k in keys_of(Phase)},
                            **{f"launcher.rdzv.{k.name}": k for k in keys_of(Rendezvous)}}

#: the time allowances: every key declared ``Stale.ALLOWANCE``, judged against how the run ended
ALLOWANCES: dict[str, Key] = {name: k for name, k in DECLARED.items() if k.stale is Stale.ALLOWANCE}

#: the rule of what a record keeps of no key of a phase, by its field of ``Asked``: the runbook's
#: ``trainer:`` entry, as it launches the point
UNDECLARED: dict[str, Stale] = {"trainer": Stale.EXACT}

#: the label of the ``trainer:`` entry's changes, whose params it compares apart (``_params_of_both``)
TRAINER = dict(Asked.fields())["trainer"].label

#: the rules no stored value is compared by (``Key.note`` says what stands for them)
UNCOMPARED = (Stale.THROUGH, Stale.NEVER)

GATE = dict(Asked.fields())["gates"].label
"""A gate the runbook asks now that the run did not evaluate (a new metric, another window)."""

HARDWARE = "hardware"
"""The machine that ran it is below the point's minimum now (it would be skipped there)."""


@dataclass(frozen=True)
class Change:
    key: str
    """The word naming what changed: a field's label (``asked.Kept.label``), the dotted runbook key of a
    time allowance or of a key every record keeps, or ``HARDWARE``."""
    stored: str
    """The value at the run ('unset': the run had none)."""
    now: str
    """The value the runbook's point has now."""
    name: str = ""
    """The entry of a mapping (an override, a variable, the launcher's or trainer's key), the metric of a gate."""
    why: str = ""
    """Why the change matters to this run, where that depends on how it ran (an allowance)."""
    by: str = "in the runbook"
    """What asks ``now``: the runbook, or this harness (a check it makes of every point of the kind)."""

    def text(self) -> str:
        what = f"{self.key} {self.name}" if self.name else str(self.key)
        return f"{what} {self.stored} at the run, {self.now} {self.by} now" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Outdated:
    """A stored record of a point the runbook now asks something else of."""

    record: PhaseRecord
    changes: tuple[Change, ...]

    def text(self) -> str:
        return "; ".join(c.text() for c in self.changes)


@dataclass(frozen=True)
class Compared:
    """One value compared between a record and the point: ``then`` read from the record (None: not
    kept), ``now`` from what the point asks, by ``rule``."""

    label: str
    rule: Stale
    then: Any
    now: Any
    key: str
    """The dotted runbook key ('' for the ``trainer:`` entry); an allowance's ``Limit`` is its declaration's."""


def _repeats_run(rec: PhaseRecord) -> int:
    """The runs of a train point, from its sub-runs (a repeated point's are repeat1..repeatK)."""
    return sum(1 for s in rec.runs if s.name.startswith("repeat")) or 1


def _stopped_after(rec: PhaseRecord) -> int | None:
    """The step a resume point's first half stopped after, from its sub-run where it passed (it
    completed exactly the steps it was asked); None where it did not."""
    first = next((s for s in rec.runs if s.name == "first" and s.status == Status.PASS), None)
    return first.last_step if first is not None else None


def _steps_run(rec: PhaseRecord) -> int | None:
    """The steps of a point that ran a trainer (not of a resume point that failed: it stores its
    failed half's)."""
    return rec.steps if rec.kind in TRAINER_KINDS and not (rec.kind == "resume" and rec.failed) else None


#: of a record that did not keep a field of ``Asked`` (a harness older than the field), what it
#: kept instead, and the rule that compares it (env.json's world is never below the processes
#: launched, and may be above them: only more is a change)
OLDER: dict[str, tuple[Callable[[PhaseRecord], Any], Stale]] = {
    "steps": (_steps_run, Stale.EXACT),
    "overrides": (lambda rec: rec.overrides, Stale.EXACT),
    "world_size": (lambda rec: rec.world_size, Stale.MORE),
    "repeats": (_repeats_run, Stale.MORE),
    "resume_after": (_stopped_after, Stale.EXACT),
}

#: keys of a phase every record keeps outside ``asked``, read from the record (0 timeout in
#: hand-built ones: not kept)
RECORDED: dict[str, Callable[[PhaseRecord], Any]] = {
    "kind": lambda rec: rec.kind,
    "timeout_s": lambda rec: rec.timeout_s or None,
}


def _fields(rec: PhaseRecord, point: PhasePoint) -> list[Compared]:
    """Every value to compare, in the order the report names changes: what every record keeps,
    then what it kept of what was asked, each by its key's declared rule."""
    now, then, kind = Asked.of(point, TRAINER_KINDS), rec.asked, point.phase.kind
    out = [Compared(key, DECLARED[key].stale, read(rec), getattr(point.phase, key), key)
           for key, read in RECORDED.items()]
    for name, kept in Asked.fields():
        if kept.kinds and not (rec.kind == kind and kind in kept.kinds):
            continue
        rule_of = DECLARED[kept.key].stale if kept.key else UNDECLARED[name]
        was = getattr(then, name) if then is not None else None
        if then is None or (kept.optional and was is None):  # not kept: what the record kept instead
            if name not in OLDER:
                continue
            read, rule_of = OLDER[name]
            was = read(rec)
            if was is None:
                continue
        if kept.read_now and getattr(now, name) is None:  # unreadable here now: unknown, no change
            continue
        out.append(Compared(kept.label, rule_of, was, getattr(now, name), kept.key))
    return out


def _exact(rec: PhaseRecord, point: PhasePoint, c: Compared) -> list[Change]:
    """Any change (of a mapping: each entry; a mapping not kept, or not asked of the kind, is not compared)."""
    if isinstance(c.then, Mapping) or isinstance(c.now, Mapping):
        if c.then is None or c.now is None:
            return []
        if c.label == TRAINER:
            return _mapping(c.label, *_params_of_both(c.then, c.now))
        return _mapping(c.label, c.then, c.now)
    return [Change(c.label, _scalar(c.then), _scalar(c.now))] if c.then != c.now else []


def _params_of_both(then: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trainer entries ``then`` and ``now``, of its ``params.K`` those of keys the point
    overrode at the run and overrides now: the entry keeps how a param reaches the trainer only for
    the point's overrides (PhasePoint.trainer_asked), so one on a side alone is an override set or
    dropped, which the overrides' change names, not a param declared or dropped."""
    both = {k for k in then if k.startswith(TRAINER_PARAM)} & set(now)
    return ({k: v for k, v in then.items() if not k.startswith(TRAINER_PARAM) or k in both},
            {k: v for k, v in now.items() if not k.startswith(TRAINER_PARAM) or k in both})


def _more(rec: PhaseRecord, point: PhasePoint, c: Compared) -> list[Change]:
    """Only more than the run made."""
    return [Change(c.label, _scalar(c.then), _scalar(c.now))] if c.then < c.now else []


def _gates(point: PhasePoint) -> dict[str, tuple[str, str]]:
    """Each gate the point asks, by what a record keeps of it: its metric and its rule and window."""
    out = {}
    for g in point.gates():
        window = shown_window(g.metric, g.window.describe())
        out[Asked.gate_key(g)] = (g.metric, rule(g.op, g.threshold) + (f" ({window})" if window else ""))
    return out


#: how a member asked now and not at the run is named (its name, its value): by the label of its field
ADDED_ITEMS: dict[str, Callable[[PhasePoint], dict[str, tuple[str, str]]]] = {"gate": _gates}


def _added(rec: PhaseRecord, point: PhasePoint, c: Compared) -> list[Change]:
    """Of a passed point, only what is asked now and was not at the run: a new member, or a value
    where the run had none (one that changed is re-checked from what is stored, store/thresholds.py
    and report/build.py). A failed point is no GO whatever they say, unless it failed only on
    gates no longer asked (``_failed_only_on_gone``)."""
    if rec.status != Status.PASS:
        return _failed_only_on_gone(rec, point, c.then) if c.label == "gate" else []
    if isinstance(c.now, tuple):
        return [Change(c.label, _asked_then(name, c.then), value, name)
                for member, (name, value) in ADDED_ITEMS[c.label](point).items() if member not in c.then]
    return [Change(c.label, _scalar(c.then or None), _scalar(c.now))] if not c.then and c.now else []


def _asked_then(metric: str, asked_then: tuple[str, ...]) -> str:
    """How the run asked a gate of ``metric`` that the runbook now asks over another window: 'asked
    over last 20 steps' (of Asked.gate_key 'toks_per_s_cv (last 20 steps)'); 'not asked' where it
    asked none."""
    windows = [window for m, window in map(Asked.gate_parts, asked_then) if m == metric]
    return f"asked over {' and '.join(windows)}" if windows else "not asked"


def _failed_only_on_gone(rec: PhaseRecord, point: PhasePoint, asked_then: tuple[str, ...]) -> list[Change]:
    """Each gate of the runbook's (``asked_then``: Asked.gate_key of each) a run failed whose metric
    the runbook no longer gates, where those gates alone failed it (its process ended clean and
    logged a finite loss): its FAIL is no verdict of the point asked now, which no run has judged
    yet. The gates a phase's kind adds itself (a resume phase's) are never taken away."""
    failed = rec.failed_gates()
    if rec.status != Status.FAIL or not failed or process_verdict(Outcome.of_record(rec)) is not None \
            or rec.evidence.nonfinite_loss_step is not None:
        return []
    # by metric: a stored gate's window reads as its run covered it ('steps 1-6, stopped after 3'),
    # and a metric asked now over another window is a change the threshold re-check covers
    asked = {metric for metric, _ in _gates(point).values()}
    runbook_then = {Asked.gate_parts(key)[0] for key in asked_then or ()}
    gone = [g for g in failed if g.metric in runbook_then and g.metric not in asked]
    if len(gone) < len(failed):
        return []
    shown = {g.metric: shown_window(g.metric, g.window) for g in gone}
    return [Change("gate", rule(g.op, g.threshold) + (f" ({shown[g.metric]})" if shown[g.metric] else "") + ", failed",
                   "not asked", g.metric) for g in gone]


def _allowance(rec: PhaseRecord, point: PhasePoint, c: Compared) -> list[Change]:
    """A time allowance changed since the run, where the change may change its result (the module's
    docstring): raised, where it may have ended the run; lowered, where the run did not fail and
    took longer than the new allowance."""
    then, now, limit = c.then, c.now, DECLARED[c.key].limit
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
    return [Change(c.key, f"{then:g}", f"{now:g}", why=why)]


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


#: one comparison per rule a stored value is compared by, in the order the report names their changes
COMPARE: dict[Stale, Callable[[PhaseRecord, PhasePoint, Compared], list[Change]]] = {
    Stale.EXACT: _exact, Stale.MORE: _more, Stale.ALLOWANCE: _allowance, Stale.ADDED: _added}


def changes(rec: PhaseRecord, point: PhasePoint) -> tuple[Change, ...]:
    """What the runbook's ``point`` asks now that ``rec``'s run was not asked (none of a SKIP:
    nothing ran; the hardware that skipped it is checked when the point runs)."""
    if rec.status == Status.SKIP:
        return ()
    compared = _fields(rec, point)
    out: list[Change] = []
    for rule_of, compare in COMPARE.items():
        if rule_of is Stale.ADDED:
            out += _machine(rec, point) + _unjudged(rec, point)
        out += [ch for c in compared if c.rule is rule_of for ch in compare(rec, point, c)]
    return tuple(out)


def _machine(rec: PhaseRecord, point: PhasePoint) -> list[Change]:
    """The machine that ran it, below the point's hardware minimum now; and the runbook's trainer
    no longer running the point's kind."""
    out = []
    if rec.hardware is not None:
        short = shortfalls(point.profile, rec.hardware, point.min_gpus)
        if short:
            out.append(Change(HARDWARE, "met the point's minimum", "below it", why="; ".join(short)))
    spec, kind = point.runbook.trainer, point.phase.kind
    if spec is not None and not spec.supports_phase(kind):
        out.append(Change("trainer", f"{kind} supported", f"{kind} not supported", "phases"))
    return out


def _unjudged(rec: PhaseRecord, point: PhasePoint) -> list[Change]:
    """Of a passed point, each gate its kind is judged by now (``KIND_GATES``) that its record
    holds none of: a PASS of a harness that did not make that check, which the stored record
    cannot make (it reads the run's files), so no verdict of the point as it is judged now."""
    if rec.status != Status.PASS or rec.kind != point.phase.kind:
        return []
    held = {g.metric for g in rec.gates}
    kind = point.phase.kind
    return [Change(GATE, "not judged", "judged", metric, f"of every {kind} point; the harness that judged the run "
                   "did not make this check: run the point again", by="by this harness")
            for metric in KIND_GATES.get(kind, ()) if metric not in held]


def _mapping(label: str, then: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    return [Change(label, _v(then.get(k)), _v(now.get(k)), k) for k in sorted(set(then) | set(now))
            if then.get(k) != now.get(k) or (k in then) != (k in now)]


def _v(value: Any) -> str:
    return "unset" if value is None else str(value)


def _scalar(value: Any) -> str:
    """A scalar key's value as the report shows it (an empty config: 'unset')."""
    return "unset" if value is None or value == "" else str(value)


def realign(records: Iterable[PhaseRecord], points: Iterable[PhasePoint]) -> list[PhaseRecord]:
    """``records``, each of a point the runbook still has under another name given that point's:
    a point is its runbook, profile, phase and sweep values, whatever the order the sweep lists its
    keys in (the store keys it so: results.record_key), while its test id and sweep index follow
    that order. A sweep whose two keys swapped places asks the same points: their records stand.
    Each record also takes its point's accelerator (what its profile runs on), which the report's
    CUDA advice and memory glossary read: a record an older harness stored says "cpu" whatever its
    profile."""
    by_key = {record_key(PointKey(**p.key())): p for p in points}
    out = []
    for r in records:
        p = by_key.get(record_key(r.key))
        if p is not None and r.test_id != p.test_id:
            r = dataclasses.replace(r, test_id=p.test_id, sweep_index=p.index, params_order=list(p.params))
        if p is not None and r.accelerator != p.profile.hardware.accelerator:
            r = dataclasses.replace(r, accelerator=p.profile.hardware.accelerator)
        out.append(r)
    return out


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
