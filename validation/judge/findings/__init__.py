"""Automatic findings: what a person would otherwise dig out of logs, CSVs and stack dumps.

Each detector reads stored records only, so findings can be recomputed for any results
directory without re-running anything: process failures (crashes, stalls, a .HALT of the trainer's
own), profile points that profiled nothing and failed gates (failures.py), the nodes
of a launch of several nodes (nodes.py), speed across points (throughput.py), where NSA pays
against dense (long_context.py), loss and grad-norm spikes, divergence and a logged non-finite
loss (stability.py), halves of a resume point that ran past their stop or did not resume, resumed
runs that do not continue the uninterrupted one and trainers that resumed in place mid-run
(resume.py), memory that keeps growing (memory.py), points that ran at different commits of the
trainer (commits.py), trainers whose logged step times are far shorter than the steps their
heartbeats show (clock.py), pytest and preflight points that failed in their
own way (checks.py); a failed toks_per_s_cv gate names its window's slow steps and where their time
went, by the run's heartbeats (judge/unsteady.py, in failures.py);
advice.py turns findings into what to do next, saying only what is true of the trainer that ran;
a crash or stall finding carries the rank(s) it blames (culprit.py), which the point's verdict line
names first (headline.py).
"""
from __future__ import annotations

from typing import Mapping

from validation.judge.findings.advice import recommendations
from validation.judge.findings.checks import failed_checks
from validation.judge.findings.clock import untrue_clocks
from validation.judge.findings.commits import mixed_commits
from validation.judge.findings.failures import (
    artifact_errors,
    crashes,
    failed_gates,
    halts,
    imbalance,
    short_runs,
    stalls,
    unprofiled,
)
from validation.judge.findings.finding import Finding, Severity, point_label, where
from validation.judge.findings.long_context import long_context, planned_longest
from validation.judge.findings.memory import memory_growth
from validation.judge.findings.nodes import nodes
from validation.judge.findings.resume import breached, not_equivalent, resumed_in_place
from validation.judge.findings.stability import divergence, nonfinite, spikes
from validation.judge.findings.throughput import (
    CROSS_POINT,
    best_setting,
    busy_timings,
    cliffs,
    fallbacks,
    host_bound,
    shared_timings,
    slowdowns,
)
from validation.judge.record import PhaseRecord

DETECTORS = (crashes, stalls, halts, nodes, short_runs, unprofiled, untrue_clocks, shared_timings, busy_timings, cliffs,
             host_bound, imbalance, fallbacks,
             artifact_errors, failed_checks, failed_gates, best_setting, breached, not_equivalent, resumed_in_place,
             nonfinite, divergence,
             spikes, slowdowns, memory_growth, mixed_commits)
_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


def find(records: list[PhaseRecord], extra: list[Finding] | None = None,
         thresholds: Mapping[str, float | None] | None = None, longest: Mapping[str, int] | None = None
         ) -> list[Finding]:
    """Every detector's findings, and ``extra`` ones found elsewhere (a baseline comparison),
    critical first. ``thresholds``: the profile's, for the checks across points that have one
    (long context's speed-up, judged at ``longest``: long_context.planned_longest of the runbook's
    points, when known)."""
    out = [f for detect in DETECTORS for f in detect(records)] + long_context(records, thresholds, longest)
    out += list(extra or [])
    return sorted(out, key=lambda f: _ORDER[f.severity])


def of_point(record: PhaseRecord) -> list[Finding]:
    """The critical findings a point has on its own, not those only its sweep shows (CROSS_POINT):
    each makes the report NO-GO though the point may have passed its gates (a loss that went NaN
    or diverged where no gate checks it), so its test fails as the CLI's exit status does."""
    return [f for f in find([record]) if f.severity == Severity.CRITICAL and f.kind not in CROSS_POINT]


__all__ = ["CROSS_POINT", "DETECTORS", "Finding", "Severity", "find", "of_point", "planned_longest", "point_label",
           "recommendations", "where"]
