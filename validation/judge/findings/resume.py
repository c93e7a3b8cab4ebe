"""Findings about resume points: a half that did not do what it was asked (a first half that ran
past its stop, a second half that did not resume), and a run resumed from its checkpoint that does
not continue the uninterrupted run, with the first diverging step (the resume gates' notes,
validation/judge/resume.py) and where each of its three processes left its files."""
from __future__ import annotations

from validation.judge.diagnosis.failed import root_of_evidence
from validation.judge.findings.finding import (Facts, Finding, Severity, attempt_logs, attempts_said, where,
                                               where_run)
from validation.judge.gates import GateVerdict
from validation.judge.record import Evidence, PhaseRecord
from validation.judge.resume import DATA_METRIC, LOSS_METRIC, LR_METRIC, METRICS, BreachKind, Clue, ClueKind


def breached(records: list[PhaseRecord]) -> list[Finding]:
    """A critical finding per resume point that a half decided by doing what it was not asked
    (judge/resume.py ``Breach``; its record is that half's): its words, and the files that show it."""
    out = []
    for r in records:
        breach = r.evidence.resume_breach
        if breach is None:
            continue
        log = _logs(r)
        if breach.kind == BreachKind.RAN_PAST_STOP:
            detail = [f"CSV: {r.out_dir}/training.csv", *log,
                      "the second half was not started: it would have resumed from the checkpoint of another step"]
        else:
            source = next((s.out_dir for s in r.runs if s.name == "first"), None)
            shown = ([f"{breach.records}: {r.out_dir}/{f}" for f in breach.files] if breach.records is not None
                     else [f"heartbeats: {r.out_dir}/heartbeat_rank{breach.rank}.jsonl"])
            detail = [*shown, *log]
            if source is not None:
                detail.append(f"it was to resume from the first half's checkpoint in {source}")
        out.append(Finding(Severity.CRITICAL, r.phase, f"{where_run(r)}: {breach.text()}", detail, str(breach.kind),
                           Facts.of(r)))
    return out


def _logs(r: PhaseRecord) -> list[str]:
    """The process's output logs: what it printed of the stop or the checkpoint it was given (a
    loader's warning on stdout as often as on stderr)."""
    err = r.evidence.stderr_log
    if not err:
        return []
    out = err.removesuffix(".stderr.log") + ".stdout.log"
    return [f"{kind}: {r.out_dir}/{name}" for kind, name in (("stdout", out), ("stderr", err))
            if name in r.evidence.files]


def not_equivalent(records: list[PhaseRecord]) -> list[Finding]:
    """One critical finding per resume point whose resume gates failed: the loss's first
    diverging step in the title when the loss failed, else the first failed gate's; every resume
    gate's note below, then the three runs' directories."""
    out = []
    for r in records:
        gates = [g for g in r.gates if g.metric in METRICS]
        bad = [g for g in gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]
        if r.kind != "resume" or not bad:
            continue
        lead = next((g for g in bad if g.metric == LOSS_METRIC), bad[0])
        detail = [g.text() for g in gates if g is not lead]
        detail += [f"{s.label}: {s.out_dir}/training.csv" for s in r.runs]
        cause = _cause({g.metric: g.verdict for g in gates}, r.evidence.resume_clue)
        out.append(Finding(Severity.CRITICAL, r.phase, f"resume not equivalent in {where(r)}: {lead.note}; {cause}",
                           detail, "resume", Facts.of(r)))
    return out


def _cause(verdicts: dict[str, GateVerdict], clue: Clue | None = None) -> str:
    """What the gates and the loss curve (``clue``) together tell of why: which of what a resume
    restores did not continue."""
    broke = [what for metric, what in ((DATA_METRIC, "its data did not continue where the first half's ended"),
                                       (LR_METRIC, "its learning-rate schedule did not continue"))
             if verdicts.get(metric) == GateVerdict.FAIL]
    if broke:
        return " and ".join(broke)
    if clue is not None and verdicts.get(LR_METRIC) == GateVerdict.PASS:
        recorded = ("; env.json's data_position says the data continued, which the curve does not bear out"
                    if clue.kind == ClueKind.SHIFTED and verdicts.get(DATA_METRIC) == GateVerdict.PASS else "")
        return f"the learning rate continued; {clue.text()}{recorded}"
    if verdicts.get(LR_METRIC) == GateVerdict.PASS and verdicts.get(DATA_METRIC) == GateVerdict.PASS:
        return ("learning rate and data position continued, so the state restored from the checkpoint differs "
                "(optimizer state, RNG state or model weights) or the resumed run's step count is off")
    if verdicts.get(LR_METRIC) == GateVerdict.PASS:
        return ("the learning rate continued; the trainer records no data position (env.json data_position), so the "
                "data, the optimizer, RNG or model state, or the step count may be what differs")
    return "see the gates below"


def resumed_in_place(records: list[PhaseRecord]) -> list[Finding]:
    """A warning per run whose trainer was started again into the same files mid-run (a process
    restarted: torchrun's --max-restarts, a requeued job): the acceptance run met a failure that a
    long run would meet too, and what the report reads of the steps written again is their later
    occurrence. One line per file that shows it, one per restart its adapter read in the trainer's
    log (also one that wrote no step again, which no file shows), and how each attempt ended."""
    out = []
    for r in records:
        ev = r.evidence
        if not ev.reruns and not ev.restarts:
            continue
        firsts = sorted({rerun.first for reruns in ev.reruns.values() for rerun in reruns} |
                        {s.began for s in ev.restarts if s.began is not None})
        steps = ", ".join(str(s) for s in firsts)
        detail = [f"{name}: {'; '.join(rerun.text() for rerun in reruns)}"
                  for name, reruns in sorted(ev.reruns.items())]
        detail += [f"the trainer's log: {restart.text()}" for restart in ev.restarts]
        read = "every number and finding of this run reads the occurrence written later; " if ev.reruns else ""
        detail.append(read + _how_attempts_ended(ev))
        # from step 1 it began again from nothing: no checkpoint was restored
        how = ("started again from step 1 and wrote its steps again" if firsts == [1] else
               f"went back to a checkpoint and wrote again from step {steps}" if ev.reruns else
               f"was started again at step {steps}" if firsts else "was started again")
        out.append(Finding(Severity.WARNING, r.phase, (
            f"trainer resumed in place in {where(r)}: it {how} into the same files"), detail, "resumed_in_place",
            Facts.of(r)))
    return out


def _how_attempts_ended(ev: Evidence) -> str:
    """Each failed attempt's end, where torchrun's log tells them apart (its agent's line per attempt),
    so that no attempt is given another's failure; else the failure the log holds, of the rank that
    failed first, or where to look."""
    if ev.attempts:
        logs = attempt_logs(ev, ev.attempts)
        return f"by torchrun's log{'s' * (', ' in logs)}{logs}, " + attempts_said(ev.attempts)
    log = f" ({ev.stderr_log})" if ev.stderr_log else ""
    root = root_of_evidence(ev)
    failed = ev.rank_failures[root].exception if root is not None else None
    return (f"the earlier process ended as rank {root} failed: {failed}" if failed else
            f"why the earlier process ended is in the trainer's log{log}")
