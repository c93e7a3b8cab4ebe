"""Findings about resume points: a run resumed from its checkpoint that does not continue the
uninterrupted run, with the first diverging step (the resume gates' notes, validation/judge/resume.py)
and where each of its three processes left its files."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, where
from validation.judge.gates import GateVerdict
from validation.judge.record import PhaseRecord
from validation.judge.resume import LOSS_METRIC, METRICS


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
        out.append(Finding(Severity.CRITICAL, r.phase, f"resume not equivalent in {where(r)}: {lead.note}", detail,
                           "resume", Facts.of(r)))
    return out
