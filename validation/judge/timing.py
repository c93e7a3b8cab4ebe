"""Timings you can believe. A timed point (one whose numbers are speeds: train and profile
points) measures the machine it ran on; two that ran at the same time on one machine shared its
cores or GPU, and each one's speed says as much about the other as about itself. Nothing runs
them side by side on purpose (validation/runbook/plan.py ``batches``, ``PhasePoint.timed``); this finds, from the
records alone (host, start, wall time), when it happened anyway (two harness runs at once, a
pytest -n run), and which timed points ran while other work kept the machine's cores busy (their
records' ``load``), so that the report marks those timings, the cross-point speed findings
leave them out and a baseline comparison does not judge them.
"""
from __future__ import annotations

import datetime as _dt

from validation.judge.record import TRAINER_KINDS, PhaseRecord

#: how far two points' intervals must overlap to count: more than the millisecond the times are kept to
OVERLAP_S = 0.01


def _interval(r: PhaseRecord) -> tuple[float, float] | None:
    """(start, end) in Unix seconds. None for records of older harnesses, which kept when they
    were stored (the end), to the second: their start is not known."""
    if "." not in r.started:
        return None
    try:
        start = _dt.datetime.fromisoformat(r.started).timestamp()
    except ValueError:
        return None
    return start, start + r.wall_s


def shared_machine(records: list[PhaseRecord]) -> dict[str, list[str]]:
    """Per timed point that ran while another timed point ran on the same host: those others'
    test ids."""
    # the points that run the trainer are the timed ones (their tokens/s, step times, profiles)
    timed = [(r, iv) for r in records if r.kind in TRAINER_KINDS and r.command and r.hardware
             and (iv := _interval(r)) is not None]
    out: dict[str, list[str]] = {}
    for i, (a, (a0, a1)) in enumerate(timed):
        for b, (b0, b1) in timed[i + 1:]:
            if a.hardware.hostname != b.hardware.hostname:
                continue
            if min(a1, b1) - max(a0, b0) > OVERLAP_S:
                out.setdefault(a.test_id, []).append(b.test_id)
                out.setdefault(b.test_id, []).append(a.test_id)
    return out


def busy_machine(records: list[PhaseRecord]) -> list[PhaseRecord]:
    """The timed points that ran while other work competed for the machine's cores."""
    return [r for r in records if r.kind in TRAINER_KINDS and r.load is not None and r.load.busy]


def reliable(records: list[PhaseRecord]) -> list[PhaseRecord]:
    """The records whose timings shared the machine with no other timed point and no other work,
    and whose trainer's step times its heartbeats do not dispute (judge/clock.py)."""
    apart = set(shared_machine(records)) | {r.test_id for r in busy_machine(records)}
    return [r for r in records if r.test_id not in apart and not (r.evidence.clock and r.evidence.clock.disputed)]
