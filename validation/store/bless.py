"""``nsa-validate bless``: write golden loss curves (validation/store/goldens.py) from stored runs.

The only writer of goldens. It reads the selected points' records from a results directory,
takes the loss of steps 1..golden_steps from each run's training.csv, and replaces exactly those
curves (for the hardware class each run ran on) in the runbook's golden file; every other curve
stays as it was, those another bless writes at the same time included (the file is read and
written under a lock, GoldenFile.editing). All selected points are checked before anything is written: one that has no
finished run stops the bless with an error naming it, and the file is left untouched.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from validation.contract.files import read_training_csv
from validation.judge.record import PhaseRecord, Status
from validation.judge.verdict import gate_verdict, rejudge
from validation.runbook.plan import PhasePoint, expand
from validation.runbook.types import Profile, Runbook
from validation.store.goldens import (
    METRIC,
    Curve,
    GoldenError,
    GoldenFile,
    hardware_class,
    losses,
    point_id,
)
from validation.store import stale
from validation.store.results import ResultStore


@dataclass(frozen=True)
class Blessed:
    point: str
    """'phase/point'."""
    hardware_class: str
    steps: int
    commit: str | None
    """The trainer's commit."""
    harness_commit: str | None
    trainer: str | None
    run: str


def check_store(results_dir: Path) -> None:
    """A GoldenError unless ``results_dir`` holds a result store to bless from (a StoreError where
    a folder on its way cannot be searched)."""
    if not ResultStore(results_dir).exists():
        raise GoldenError(f"no result store in {results_dir} (give the --results-dir a run wrote into)")


def select(runbook: Runbook, profile: Profile, phases: list[str] | None, points: list[str] | None) -> list[PhasePoint]:
    """The points with golden curves that ``--phase`` / ``--point`` name (all of them when neither
    is given); a name that selects nothing golden is an error listing what could be chosen."""
    golden = [p for p in expand(runbook, profile) if p.phase.golden_steps]
    names = [point_id(p) for p in golden]
    if not golden:
        raise GoldenError(f"{runbook.path}: no phase sets golden_steps; nothing to bless")
    for ph in phases or []:
        runbook.phase(ph)  # an unknown phase: RunbookError listing the phases
        if not any(p.phase.name == ph for p in golden):
            raise GoldenError(f"--phase {ph}: this phase has no golden_steps in {runbook.path}; "
                              f"points with goldens: {', '.join(names)}")
    for pt in points or []:
        if pt not in names:
            raise GoldenError(f"--point {pt}: not a point with a golden curve; choose from: {', '.join(names)}")
    if not phases and not points:
        return golden
    return [p for p in golden if p.phase.name in (phases or []) or point_id(p) in (points or [])]


def _failed_beyond_golden(rec: PhaseRecord) -> bool:
    """Whether the stored run is FAIL or ERROR for more than leaving its golden curve. A run whose
    only failed gate is the golden one is what a bless after an intended change to the numerics
    replaces (the report's advice says to bless it); a loss that spiked, diverged or failed any
    other gate would make a bad curve the golden."""
    if rec.status not in (Status.FAIL, Status.ERROR):
        return False
    if rejudge(rec, [g for g in rec.gates if g.metric != METRIC]).status in (Status.FAIL, Status.ERROR):
        return True
    # a repeated point's record keeps the gates of the repeat that decided it: the others' count too
    return any(gate_verdict([g for g in s.gates if g.metric != METRIC])[0] == Status.FAIL for s in rec.runs)


def bless(results_dir: Path, runbook: Runbook, profile: Profile, selected: list[PhasePoint]) -> list[Blessed]:
    """Replace the golden curves of ``selected`` with their stored runs' losses; return what was written."""
    records = {r.test_id: r for r in ResultStore(results_dir).records(runbook.name, profile.name)}
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    todo: list[tuple[str, str, Curve]] = []
    for point in selected:
        pid, n = point_id(point), point.phase.golden_steps
        rec = records.get(point.test_id)
        rerun = (f"nsa-validate run --runbook {runbook.cli_name} --profile {profile.cli_name} "
                 f"--phase {point.phase.name} --results-dir {results_dir}")
        if rec is None:
            raise GoldenError(f"{pid}: no stored record in {results_dir}; run it first ({rerun})")
        if rec.runbook_arg and rec.runbook_arg != runbook.cli_name:  # another runbook file of this name
            raise GoldenError(f"{pid}: its stored run ran from runbook {rec.runbook_arg}, not {runbook.cli_name}; "
                              f"nothing blessed (bless it with --runbook {rec.runbook_arg})")
        # a run the point as the runbook asks it now was not (other steps, config, overrides,
        # environment or world size) gives another curve: the report calls it NOT RUN, and its
        # loss is no golden of the point (a gate added since changes no loss, and does not count)
        changed = [c for c in stale.changes(rec, point) if c.key != stale.GATE]
        if changed:
            raise GoldenError(f"{pid}: its stored run is of what the runbook asks no longer "
                              f"({'; '.join(c.text() for c in changed)}); nothing blessed (re-run it first: {rerun})")
        if not rec.ran or rec.exit_code != 0 or rec.hardware is None:
            raise GoldenError(f"{pid}: its stored run did not finish ({rec.status}: {rec.reason}); nothing blessed "
                              f"(fix it and re-run it first: {rerun})")
        if _failed_beyond_golden(rec):
            raise GoldenError(f"{pid}: its stored run is {rec.status} ({rec.reason}); nothing blessed: the loss of a "
                              f"failed run is no golden curve (fix what failed and re-run it first: {rerun})")
        loss = losses(read_training_csv(results_dir / rec.out_dir), n)
        if any(v is None or v != v for v in loss):
            raise GoldenError(f"{pid}: {rec.out_dir}/training.csv has no finite loss for some of steps 1-{n}; "
                              "nothing blessed")
        # the trainer's commit (this repository's for its own trainer), and this repository's beside it
        todo.append((pid, hardware_class(rec.hardware),
                     Curve(tuple(loss), rec.trainer_sha or (rec.git_sha if rec.own_trainer else None), stamp,
                           rec.hardware.torch, rec.out_dir, rec.trainer, rec.git_sha)))
    with GoldenFile.editing(runbook.path, runbook.name, profile.name) as goldens:
        for pid, hw, curve in todo:
            goldens.put(pid, hw, curve)
    return [Blessed(pid, hw, len(c.loss), c.commit, c.harness_commit, c.trainer, c.run)
            for pid, hw, c in todo]
