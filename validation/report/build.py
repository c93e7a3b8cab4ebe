"""GO / NO-GO reports: stored records -> a flat context -> Jinja template (reports/report.md.j2)
-> Markdown, plus one PNG per train phase of loss (against its golden), tokens/s and memory (with
the gates' thresholds) and per-rank step time over steps (validation/report/plots.py).

Status: NO-GO when any point failed or errored (or a finding across points is critical);
INCOMPLETE when a point of the runbook has no record, was skipped, or has a threshold still 'to
be measured'; GO otherwise. ``render`` returns the verdict with the path: nobody reads it back
out of the Markdown.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import enum
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jinja2

from nsa.atomic import write_atomic
from nsa.contract import ENV_JSON
from validation import DEFAULT_RESULTS_DIR, REPO_ROOT, TEMPLATE_DIR
from validation.contract.check import adapter_unreadable
from validation.errors import StoreError
from validation.judge.findings import find, planned_longest
from validation.judge.findings.advice import recommendations
from validation.judge.findings.finding import Finding, Severity, own_reason, point_label, where
from validation.judge.findings.headline import blame
from validation.judge.findings.profiles import other_profile_files
from validation.judge.gates import GateResult, Pending, explained
from validation.judge.record import OWN_TRAINER, PhaseRecord, Status
from validation.judge.timing import busy_machine, shared_machine
from validation.judge.unsteady import from_files
from validation.judge.verdict import rejudge
from validation.machine import Machine
from validation.report.plots import make_plots, prune, publish
from validation.report.tables import (
    BUSY_MARK,
    SHARED_MARK,
    artifact_rows,
    cell,
    counts,
    failure_rows,
    gate_rows,
    glossary,
    metric_legend,
    minute,
    missing_line,
    phase_tables,
    ran_span,
    reproduce_rows,
    rerun_line,
    rerun_phases_line,
    root_assignment,
    started,
    toggles,
)
from validation.runbook.plan import PhasePoint, expand
from validation.runbook.types import Profile, Runbook
from validation.store import baseline as baseline_cmp
from validation.store import goldens, stale, thresholds
from validation.store.results import ResultStore, remove_report, report_path


class Verdict(enum.StrEnum):
    GO = "GO"
    NO_GO = "NO-GO"
    INCOMPLETE = "INCOMPLETE"


_BADGE = {Verdict.GO: "✅", Verdict.NO_GO: "❌", Verdict.INCOMPLETE: "⏳"}
#: outdated points the summary names where one change is every one's (the Not run list has all)
OUTDATED_NAMED = 4


@dataclass(frozen=True)
class Rendered:
    path: Path
    verdict: Verdict
    reason: str
    events: Path | None = None
    """Where the points' TensorBoard event files went (the session's tensorboard option), if any."""


def _env() -> jinja2.Environment:
    # Markdown, not HTML: escaping is the `cell` filter's job, so autoescape is off on purpose.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["cell"] = cell
    return env


def status_of(records: list[PhaseRecord], missing: list[str], findings: list[Finding],
              outdated: list[stale.Outdated] | None = None, unknown: str | None = None,
              unjudged: list[str] | None = None, interrupted: Interruption | None = None) -> tuple[Verdict, str]:
    """The report's verdict and why. ``missing``: the runbook's points without a record;
    ``outdated``: those whose record is of a run the runbook asks something else of now (not run
    either: their stored verdict is not of the point as it is asked); ``unknown``: why the
    runbook's points are not known (it could not be loaded): no GO can be said then;
    ``unjudged``: gates outside the records that could not be judged ('long_run [default]: the
    tokens/s regression gate against the baseline: ...'): no GO either; ``interrupted``: the run
    writing the report was stopped, so the points it was asked to run again show earlier runs'
    records (of another trainer's code, it may be): no GO either, while a failure stored stays one."""
    outdated = outdated or []
    failed = [r for r in records if r.failed]
    critical = [f for f in findings if f.severity == Severity.CRITICAL]
    if failed:
        errors = sum(r.status == Status.ERROR for r in failed)  # the tables count them apart from FAIL
        which = "" if not errors else (" (ERROR)" if errors == len(failed) else f" ({errors} of them ERROR)")
        asked = len(records) + len(missing) + len(outdated)
        return Verdict.NO_GO, f"{len(failed)} of {asked} phase point(s) failed{which}: " + ", ".join(
            _failed_point(r) for r in failed[:6]) + (" ..." if len(failed) > 6 else "")
    if critical:
        return Verdict.NO_GO, _critical_reason(critical)
    pending = [r for r in records if r.status in (Status.SKIP, Status.UNMEASURED)]
    if missing or pending or outdated or unknown or unjudged or interrupted:
        parts = [f"{len(missing) + len(outdated)} point(s) not run"] if missing or outdated else []
        if outdated:  # a stored run of another point than the runbook asks now: named, with what changed
            parts[0] += f" ({len(outdated)} of them stored from a run of what the runbook asks no longer: {_outdated_text(outdated)})"
        if pending:
            parts.append(f"{len(pending)} skipped or unmeasured")
            # why the first is not done (a metric the trainer lacks first: the reader must not
            # take it for a GO), which says what to do (a skip's hardware, a curve to bless, ...)
            unprovided = [r for r in pending if any(g.pending == Pending.NOT_PROVIDED for g in r.gates)]
            first = (unprovided or pending)[0]
            parts.append(f"{where(first)}: {first.reason}")
        if unknown:
            parts.append(unknown)
        if unjudged:
            parts.append(f"{len(unjudged)} gate(s) against the baseline not judged ({unjudged[0]})")
        if interrupted:
            parts.append(f"the run that wrote this report was stopped by {interrupted.signal} before it judged every "
                         "point it was asked to run: no GO from its stored records (`nsa-validate report` renders "
                         "the store alone)")
        return Verdict.INCOMPLETE, "; ".join(parts)
    if not records:
        return Verdict.INCOMPLETE, "no results stored"
    return Verdict.GO, f"all {len(records)} phase point(s) passed their gates"


def _outdated_text(outdated: list[stale.Outdated]) -> str:
    """'alpha [default], beta [default]: steps 6 at the run, 8 in the runbook now' where one change
    is every point's; else the first point's and how many others changed otherwise."""
    names = [where(o.record) for o in outdated]
    if len({o.text() for o in outdated}) == 1:
        listed = ", ".join(names[:OUTDATED_NAMED]) + (f" and {len(names) - OUTDATED_NAMED} more"
                                                      if len(names) > OUTDATED_NAMED else "")
        return f"{listed}: {outdated[0].text()}"
    more = len(names) - 1
    return (f"{names[0]}: {outdated[0].text()}; {more} more with {'its' if more == 1 else 'their'} own "
            f"change{'s' if more > 1 else ''} (listed under Not run)")


def _critical_reason(critical: list[Finding]) -> str:
    """'1 critical finding: <its title>' / '3 critical findings, the first: <title>'. The title names
    the phase and point (a cliff names the sweep point it fell at); it said '1 critical finding(s)
    across phase points' of a finding about one point."""
    if len(critical) == 1:
        return f"1 critical finding: {critical[0].title}"
    return f"{len(critical)} critical findings, the first: {critical[0].title}"


def _failed_point(r: PhaseRecord) -> str:
    """'long_run [default] (rank 1 hung at step 5, stage backward (in wait))': the point, and the
    rank (and node) its crash or stall finding blames; of a repeated point, each failed repeat and
    whom it blames (headline.blame); where none is blamed, its verdict's reason ('fsdp [default]
    (idle_ranks = 1, needs == 0)'), so that every failed point says why."""
    return f"{where(r)} ({blame(r) or own_reason(r)})"


def _select(records: list[PhaseRecord], points: list[PhasePoint] | None
            ) -> tuple[list[PhaseRecord], list[str], list[PhaseRecord]]:
    """The records of the runbook's current points in runbook order, the points without one,
    and the stored records of points the runbook no longer has (a phase renamed or removed, a
    sweep value dropped)."""
    if points is None:
        return sorted(records, key=lambda r: (r.phase, r.sweep_index)), [], []
    records = stale.realign(records, points)
    order = {p.test_id: i for i, p in enumerate(points)}
    current = sorted((r for r in records if r.test_id in order), key=lambda r: order[r.test_id])
    have = {r.test_id for r in current}
    gone = sorted((r for r in records if r.test_id not in order), key=lambda r: r.test_id)
    return current, [t for t in order if t not in have], gone


@dataclass(frozen=True)
class GoldenRecheck:
    """What re-checking the stored golden gates against the golden file as it is now found."""

    file: str
    """The golden file's full path: goldens/ beside the runbook (a copy of it looks beside itself)."""
    exists: bool
    """Whether it exists: a runbook copied elsewhere without its goldens/ looks for it in vain."""
    checked: int
    changed: list[str]
    """One line per gate whose verdict changed since the run ('phase [point]: PASS at the run, FAIL now')."""
    not_checked: list[str]
    """One line per gate that could not be evaluated again (its training.csv is gone)."""
    no_golden: list[str]
    """One 'phase [point]' per gate with no golden curve in the file now: nothing to re-check
    against (the gate is UNMEASURED, naming the bless command); not counted in ``checked``."""


def _recheck_goldens(records: list[PhaseRecord], points: list[PhasePoint], results_dir: Path, runbook: Runbook,
                     profile: Profile) -> tuple[list[PhaseRecord], GoldenRecheck | None]:
    """Every stored golden gate evaluated again against the golden file as it is now (a curve
    blessed or replaced since the run changes the verdict the report shows, and says so): the
    records, re-judged where a gate changed, and what was found."""
    by_id = {p.test_id: p for p in points}
    out, checked, changed, not_checked, no_golden = [], 0, [], [], []
    for r in records:
        point = by_id.get(r.test_id)
        stored = next((g for g in r.gates if g.metric == goldens.METRIC), None)
        if point is None or stored is None or not r.ran or r.hardware is None:
            out.append(r)
            continue
        check = goldens.recheck(point, stored, Path(results_dir), r.out_dir, r.hardware)
        if check.now is None:
            not_checked.append(f"{where(r)} ({check.why_not}; the gate as stored at the run is shown)")
        elif check.now.pending == Pending.NO_GOLDEN:
            no_golden.append(where(r))
        else:
            checked += 1
        if check.changed:
            changed.append(f"{where(r)}: {stored.verdict} at the run, {check.now.verdict} now")
        if check.now is not None and check.now != stored:  # a new verdict, or what it says now (a file blessed since)
            r = rejudge(r, [check.now if g is stored else g for g in r.gates])
        out.append(r)
    if not checked and not not_checked and not no_golden:
        return out, None
    file = goldens.GoldenFile.for_pair(runbook.path, runbook.name, profile.name)
    return out, GoldenRecheck(str(file.path), file.exists, checked, changed, not_checked, no_golden)


def _recheck_thresholds(records: list[PhaseRecord], points: list[PhasePoint]) -> tuple[list[PhaseRecord], list[str]]:
    """Every stored gate whose threshold or operator the runbook changed since the run, re-checked
    against the gate as it is now (store/thresholds.py): the records, re-judged where one did, and
    one line per such gate ('phase [point]: metric (window): >= 1 at the run, >= 2 now; PASS then,
    FAIL now')."""
    by_id = {p.test_id: p for p in points}
    out, lines = [], []
    for r in records:
        point = by_id.get(r.test_id)
        if point is not None and r.ran:
            r, found = thresholds.recheck(r, point)
            lines += [f"{where(r)}: {c.text()}" for c in found]
        out.append(r)
    return out, lines


def _explain_unsteady(records: list[PhaseRecord], results_dir: Path) -> list[PhaseRecord]:
    """Each record's and each of its processes' failed toks_per_s_cv gates explained (gates.py
    ``explained``): a gate the store holds without an explanation (a record of an older harness, a
    gate failed only as re-checked at report time) from its run's training.csv and heartbeats as
    they are now, one that no longer fails without it. A resume point's gates read its two halves'
    files together, which no one directory holds: its gates stay as stored."""
    def of(gates: list[GateResult], out_dir: str) -> list[GateResult]:
        return [explained(g, functools.partial(from_files, results_dir / out_dir)) for g in gates]

    return [r if r.kind == "resume" or not r.out_dir else dataclasses.replace(
        r, gates=of(r.gates, r.out_dir), runs=[dataclasses.replace(s, gates=of(s.gates, s.out_dir)) for s in r.runs])
        for r in records]


def adapter_reads(records: list[PhaseRecord], results_dir: Path) -> list[str]:
    """Per point of a trainer read through an adapter, what it read and what nothing gave, as the
    adapter wrote it into the run's env.json (``adapter``: validation/contract/adapters)."""
    out = []
    for r in records:
        try:
            said = json.loads((results_dir / r.out_dir / "env.json").read_text()).get("adapter") if r.out_dir else None
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(said, dict) or not isinstance(said.get("read"), dict):
            continue
        line = f"{r.key.phase} [{point_label(r)}]: {said.get('name')} read " + "; ".join(
            f"`{f}` ({what})" for f, what in said["read"].items())
        if unreadable := adapter_unreadable({"adapter": said}):
            line += "; UNREADABLE: " + "; ".join(f"`{f}` ({why})" for f, why in unreadable.items())
        if isinstance(filtered := said.get("filtered_nonfinite_loss"), str):
            # the Trainer's own logs say loss 0 at those steps: the report says why it reads them as NaN
            line += f"; NON-FINITE LOSS: {filtered}"
        if isinstance(evaluated := said.get("evaluations"), str):
            # the step times under the throughput gates are the training's: say which evaluations they leave out
            line += f"; EVALUATION TIME LEFT OUT: {evaluated}"
        gaps = said.get("unmeasured")
        if isinstance(gaps, dict) and gaps:
            line += "; UNMEASURED: " + "; ".join(f"{k} ({why})" for k, why in gaps.items())
        out.append(line)
    return out


def _store_arg(results_dir: Path) -> str | None:
    """The results directory as a rerun command names it: None for the default ./results."""
    resolved = Path(results_dir).resolve()
    return None if resolved == DEFAULT_RESULTS_DIR.resolve() else str(resolved)


def _with_rerun(f: Finding, runbook: str | None, profile: str | None, results_dir: str | None,
                root: str) -> Finding:
    """The finding with the re-run line of the point it names (``Finding.rerun``) last in its
    detail: the Reproduce lines' command, with this report's runbook, profile and results directory."""
    if f.rerun is None:
        return f
    line = rerun_line(f.rerun, runbook, profile, results_dir, root)
    return dataclasses.replace(f, detail=[*f.detail, f"re-run only this point: `{line}`"])


@dataclass(frozen=True)
class Interruption:
    """The run that writes a report was stopped by a signal: the report holds the records stored
    before, which are no verdict of that run, and says so."""

    signal: str
    """'SIGINT'"""
    points: tuple[str, ...] = ()
    """Test ids of the pair's points the signal cut short: their new runs were not recorded."""


def interruption_text(cut: Interruption, records: list[PhaseRecord], unrecorded: list[str]) -> str:
    """What the report says of a run stopped as it was written: where it stopped and what the
    rows of the points it cut short are. ``unrecorded``: test ids without a current record."""
    stored = {r.test_id: r for r in records}

    def row(test_id: str) -> str:
        r = stored.get(test_id)
        if r is not None:
            return f"`{test_id}` (its row is its earlier record, {r.status}, of a run started {minute(started(r))})"
        return f"`{test_id}` ({'NOT RUN: no current record' if test_id in unrecorded else 'no record'})"

    where = (f"while {', '.join(row(t) for t in cut.points)} ran; that run was not recorded" if cut.points
             else "between points (none was cut short)")
    return (f"the run that wrote this report was stopped by {cut.signal} {where}. The status above is of the "
            "records stored, never GO for a stopped run: the points it did not reach show their earlier "
            "records, where the store holds them. Run them again for a verdict")


def build_context(results_dir: Path, runbook_name: str, profile_name: str, *, runbook: Runbook | None,
                  profile: Profile | None, plots: list[dict[str, str]] | None = None,
                  now: str | None = None, baseline: Path | None = None,
                  interrupted: Interruption | None = None) -> dict[str, Any]:
    """The report's context. ``interrupted``: the run writing it was stopped by a signal."""
    points = expand(runbook, profile) if runbook is not None and profile is not None else None
    records, missing, gone = _select(ResultStore(results_dir).records(runbook_name, profile_name), points)
    rechecked, outdated, regated = None, [], []
    if points is not None:
        records, outdated = stale.split(records, points)
        records, regated = _recheck_thresholds(records, points)
        records, rechecked = _recheck_goldens(records, points, results_dir, runbook, profile)
    records = _explain_unsteady(records, Path(results_dir))
    comparison = None
    if baseline is not None:
        threshold = profile.thresholds.get(baseline_cmp.REGRESSION_KEY) if profile else None
        base_records = baseline_cmp.load(baseline, results_dir, runbook_name, profile_name)
        comparison = baseline_cmp.compare(records, base_records, baseline, threshold)
    extra = (comparison.findings() if comparison else []) + (other_profile_files(records, profile.cli_name)
                                                             if profile else [])
    findings = find(records, extra, profile.thresholds if profile else None,
                    planned_longest((p.phase.name, p.params) for p in points) if points is not None else None)
    status, why = status_of(records, missing, findings, outdated, _unknown_plan(records, runbook, profile),
                            comparison.unjudged_lines() if comparison else None, interrupted)
    store_arg = _store_arg(results_dir)
    root = root_assignment(runbook.trainer.root.env if runbook and runbook.trainer else None, records)
    findings = [_with_rerun(f, runbook and runbook.cli_name, profile and profile.cli_name, store_arg, root)
                for f in findings]
    # where every stored record is outdated, the machine they ran on is still the one to name
    hw = next((r.hardware for r in [*records, *(o.record for o in outdated)] if r.hardware), None)
    sha = next((r for r in records if r.git_sha), None)
    shas = list(dict.fromkeys(r.git_sha for r in records if r.out_dir and r.git_sha))
    foreign = [r for r in records if r.trainer != OWN_TRAINER]
    trainer = next((r for r in foreign if r.trainer_sha), foreign[0] if foreign else None)
    gates = gate_rows(records) + (comparison.gate_rows() if comparison else [])
    phases = phase_tables(records, set(shared_machine(records)), {r.test_id for r in busy_machine(records)})
    return {
        "title": f"NSA Acceptance Report: {runbook_name} on {profile_name}",
        "status": str(status),
        "badge": _BADGE[status],
        "status_reason": why,
        "interrupted": interruption_text(interrupted, records, missing + [o.record.test_id for o in outdated])
                       if interrupted else None,
        "generated": now or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "ran_span": ran_span(records),
        "runbook": runbook_name,
        "runbook_path": _rel(runbook.path) if runbook else None,
        "runbook_source": runbook.source if runbook else None,
        # a profile file outside runbooks/profiles/ is named by its path: its thresholds are the user's
        "profile": profile_name if profile is None or profile.cli_name == profile_name
                   else f"{profile_name} ({profile.cli_name})",
        "profile_description": profile.description if profile else None,
        "profile_hardware": _hw_need(profile) if profile else None,
        "profile_notes": profile.notes if profile else None,
        "peak_tflops": profile.hardware.peak_bf16_tflops if profile else None,
        "hardware": _hw_text(hw),
        "torch": hw and hw.torch,
        "cuda": hw and hw.cuda,
        "python": hw and hw.python,
        "git_sha": f"the points ran at {len(shas)} commits: {', '.join(shas)}" if len(shas) > 1
                   else sha.git_sha if sha else None,
        "git_sha_source": sha.git_sha_source if sha and len(shas) < 2 else None,
        "trainer": trainer and trainer.trainer,
        "trainer_sha": trainer and trainer.trainer_sha,
        "trainer_sha_source": trainer and trainer.trainer_sha_source,
        # of a trainer read through an adapter, the env.json that names no commit may be the adapter's
        "trainer_env_by": trainer and trainer.evidence.written_by and trainer.evidence.written_by.said(ENV_JSON),
        "adapter_reads": adapter_reads(foreign, Path(results_dir)),
        "goldens": rechecked,
        "thresholds_changed": regated,
        "counts": counts(records, missing + [o.record.test_id for o in outdated]),
        "toggles": toggles(records),
        "findings": findings,
        "recommendations": recommendations(findings, lambda phases: rerun_phases_line(
            phases, runbook.cli_name if runbook else runbook_name, profile.cli_name if profile else profile_name,
            store_arg, root)),
        "gates": gates,
        "metric_legend": metric_legend(gates),
        "glossary": glossary(phases, {g["metric"] for g in gates}),
        "baseline": comparison,
        "regression_key": baseline_cmp.REGRESSION_KEY,
        "phases": phases,
        "shared_mark": SHARED_MARK,
        "busy_mark": BUSY_MARK,
        "failures": failure_rows(records),
        "missing": missing,
        "missing_line": missing_line(points or [], missing, runbook and runbook.cli_name,
                                     profile and profile.cli_name, store_arg, root),
        "outdated": [{"test_id": o.record.test_id, "status": str(o.record.status), "why": o.text(),
                      "rerun": rerun_line(o.record, runbook and runbook.cli_name, profile and profile.cli_name,
                                          store_arg, root)} for o in outdated],
        "stale": [f"`{r.test_id}` ({r.status} at the run)" for r in gone],
        "artifacts": artifact_rows(records),
        "reproduce": reproduce_rows(records, runbook and runbook.cli_name, profile and profile.cli_name, store_arg,
                                    root),
        "plots": plots or [],
        "verdict": status,
    }


def _unknown_plan(records: list[PhaseRecord], runbook: Runbook | None, profile: Profile | None) -> str | None:
    """Why the runbook's points are unknown (its file, or its profile's, could not be loaded: the
    report renders the stored records alone), or None. Which points were not run is unknown then."""
    if runbook is not None and profile is not None or not records:
        return None
    latest = max(records, key=lambda r: r.started)
    what = (f"the runbook these records ran from ({latest.runbook_arg or latest.key.runbook})" if runbook is None
            else f"the profile these records ran with ({latest.profile_arg or latest.key.profile})")
    return (f"{what} could not be loaded, so which of its points were not run is unknown "
            f"(`nsa-validate report --runbook PATH` judges them against it)")


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _hw_need(p: Profile) -> str:
    h = p.hardware
    if h.accelerator == "cpu":
        return "CPU (no GPU needed)"
    need = f"{max(h.min_gpus, 1)}x CUDA GPU" + (f" ({h.gpu_name})" if h.gpu_name else "")
    return need + (f", >= {h.min_gpu_mem_gb:g} GiB each" if h.min_gpu_mem_gb else "")


def _hw_text(hw: Machine | None) -> str:
    if hw is None:
        return "unknown (no records)"
    return f"{hw.describe()} on {hw.hostname}"


def withdraw_all(results_dir: str | Path) -> list[Path]:
    """Remove every report of the results directory, and return them: its store can no longer be
    read, so none of them is backed by it any more."""
    gone = sorted(p for p in (Path(results_dir) / "reports").glob("*__*.md") if p.is_file())
    for path in gone:
        remove_report(path)
    return gone


def render(results_dir: str | Path, runbook_name: str, profile_name: str, *, runbook: Runbook | None = None,
           profile: Profile | None = None, plots: bool = True, now: str | None = None,
           template: str = "report.md.j2", baseline: Path | None = None,
           interrupted: Interruption | None = None) -> Rendered:
    """Write <results>/reports/<runbook>__<profile>.md (and its plots); return it with its verdict.
    With ``baseline`` (another results directory) each point is compared with its stored twin
    there (validation/baseline.py); with ``interrupted``, the report says that the run writing it
    was stopped, and where. A file it cannot write (a full disk, a read-only folder) is a
    StoreError naming the report, the previous one left as it was."""
    results_dir = Path(results_dir)
    path = report_path(results_dir, runbook_name, profile_name)
    report_dir = path.parent
    stem = f"{runbook_name}__{profile_name}"
    plot_list: list[dict[str, str]] = []
    plot_dir = report_dir / "plots"
    staging: Path | None = None
    store = ResultStore(results_dir)
    # an interrupt at any moment leaves the previous report with every plot it names, and no temp file
    try:
        with contextlib.ExitStack() as held:
            # the results directory's lock from the first read of the store to the report's write:
            # a record stored meanwhile waits for the report and then removes it (ResultStore), so
            # no report says what the store no longer holds
            held.enter_context(store.locked())
            if plots:
                recs = store.records(runbook_name, profile_name)
                points = expand(runbook, profile) if runbook is not None and profile is not None else None
                if points is not None:  # a run of what the runbook asks no longer is not plotted as its point
                    recs = stale.split(stale.realign(recs, points), points)[0]
                # drawn beside the plots the previous report names, which stay until it is replaced
                staging = held.enter_context(_staging(plot_dir))
                plot_list = make_plots(results_dir, recs, plot_dir, stem, points, staging=staging)
            ctx = build_context(results_dir, runbook_name, profile_name, runbook=runbook, profile=profile,
                                plots=plot_list, now=now, baseline=baseline, interrupted=interrupted)
            ctx["results_prefix"] = os.path.relpath(results_dir, report_dir)
            text = render_text(ctx, template)
            report_dir.mkdir(parents=True, exist_ok=True)
            # the new plots first (the old report names the same phases' or others, which stay), then
            # the report (whole or not at all, for everyone to read), then the old report's plots the
            # new one does not name
            moved = publish(staging, plot_dir, stem) if staging is not None else None
            write_atomic(path, text, mode=0o644)
            if moved is not None:
                prune(plot_dir, stem, keep=moved)
    except OSError as exc:
        raise StoreError.of_os("cannot write the report", path, exc) from None
    return Rendered(path, ctx["verdict"], ctx["status_reason"])


STAGING_PREFIX = ".staging-"


@contextlib.contextmanager
def _staging(plot_dir: Path) -> Iterator[Path]:
    """A new folder under ``plot_dir`` to draw one report's plots in, removed on the way out.
    Every render holds the results directory's lock while its folder exists (``render``), so the
    staging folders a render finds are of renders killed before they could remove theirs
    (SIGKILL runs no ``finally``): they are removed first."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    for left in plot_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(left, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=plot_dir))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def render_text(ctx: dict[str, Any], template: str = "report.md.j2") -> str:
    return _env().get_template(template).render(**ctx)
