"""Findings about memory that kept growing over a run (validation/judge/memory.py): which ranks,
how fast, and at which step they would run out at that rate. A warning: the acceptance run may
end long before a leak matters, a run of days does not. The mem_growth_gb gate, where a phase
has one, judges; this says who grows and when it would end."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, Watched, watched_runs
from validation.judge.record import PhaseRecord


def memory_growth(records: list[PhaseRecord]) -> list[Finding]:
    """One warning per run with ranks whose memory kept growing: the fastest in the title, each
    rank in the detail, and why no step of running out is given where env.json does not say how
    much memory a device has."""
    out = []
    for r in records:
        for run in watched_runs(r):  # every repeat of a repeated point
            finding = _growth(r, run)
            if finding is not None:
                out.append(finding)
    return out


def _growth(r: PhaseRecord, run: Watched) -> Finding | None:
    grown = sorted(run.signs.memory_growth, key=lambda g: -g.gb_per_1k_steps)
    if not grown:
        return None
    ranks = ", ".join(str(g.rank) for g in sorted(grown, key=lambda g: g.rank))
    fastest = grown[0]
    soonest = min((g for g in grown if g.runs_out_at is not None), key=lambda g: g.runs_out_at, default=None)
    ends = (f"; at this rate rank {soonest.rank} reaches the device's {soonest.device_gb:g} GiB at about step "
            f"{soonest.runs_out_at:,}" if soonest is not None else "")
    detail = [g.text() for g in grown]
    if soonest is None:
        detail.append("env.json records no device_mem_gb (one device's memory, GiB), so no step of running out "
                      "is projected")
    detail.append(f"CSV and heartbeats: {' and '.join(run.out_dirs)}")
    rate = (f"ranks {ranks}, up to {fastest.gb_per_1k_steps:.3g} GiB per 1000 steps (rank {fastest.rank})"
            if len(grown) > 1 else f"rank {ranks} at {fastest.gb_per_1k_steps:.3g} GiB per 1000 steps")
    return Finding(Severity.WARNING, r.phase, f"memory keeps growing in {run.where}: {rate}{ends}", detail,
                   "memory_growth", Facts.of(r))
