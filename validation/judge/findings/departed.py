"""Ranks that left early (validation/judge/diagnosis/left.py ``departed``) in words: where each was when it
exited 0, for the crash, stall and node findings that name it."""
from __future__ import annotations

from validation.judge.diagnosis.beats import started_last
from validation.judge.diagnosis.left import not_done, remained
from validation.judge.record import PhaseRecord


def departure(rec: PhaseRecord, ranks: list[int]) -> str:
    """'rank 1 exited 0 early (last heartbeat step 4 of 8, stage data)' for each of ``ranks``, with
    ': step 8 not completed' where its last record was within the last step (or, of a rank whose
    records say no step's end, that it started it and which ranks had not completed it)."""
    parts = []
    for k in ranks:
        hb = rec.evidence.last_heartbeat.get(k)
        if hb is None and rec.evidence.no_heartbeats:
            logged = rec.metrics.steps_completed
            csv = (f"training.csv's last step {logged:g} of {rec.steps}" if logged is not None
                   else "training.csv logged no step")
            found = ", and the harness found no process of it" if rec.stopped_by_harness else ""
            parts.append(f"rank {k} exited 0 early (where it stopped is not known: {rec.evidence.no_heartbeats}; "
                         f"{csv}; torchrun reports no failure of it{found})")
            continue
        if hb is None:
            parts.append(f"rank {k} exited 0 early (no heartbeat written: before its first step; torchrun reports no "
                         "failure of it, and the harness found no process of it)")
            continue
        stage = f", stage {hb.stage}" if hb.stage else ""
        if started_last(hb, rec.steps):
            who = ", ".join(map(str, not_done(rec, remained(rec))))
            within = (f": step {hb.step} started; its heartbeats record no step's end, and rank{'s' * (',' in who)} "
                      f"{who} had not completed step {hb.step}")
        else:
            within = f": step {hb.step} not completed" if hb.step == rec.steps else ""
        parts.append(f"rank {k} exited 0 early (last heartbeat step {hb.step} of {rec.steps}{stage}{within})")
    return "; ".join(parts)
