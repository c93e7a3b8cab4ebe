"""The one diagnosis of a failed point (``diagnose``): of its ways of failing (a non-finite loss the
trainer stopped on, a crash, a stall), the first that blames a rank."""
from __future__ import annotations

from validation.judge.diagnosis.blame import Diagnosis, Kind
from validation.judge.diagnosis.crash import crash
from validation.judge.diagnosis.nonfinite import nonfinite
from validation.judge.diagnosis.stall import stall
from validation.judge.record import PhaseRecord, Status


def diagnose(rec: PhaseRecord) -> Diagnosis | None:
    """What happened to the point's process that the verdict line leads with: its crash's diagnosis
    (a non-finite loss the trainer stopped on included) where it blames a rank, else its stall's;
    None where neither blames one, or the point did not fail. Of a repeated point, the repeat its
    record keeps (another repeat's failure is a finding of its own, never this one's cause)."""
    if rec.status != Status.FAIL:
        return None
    for found in (nonfinite(rec), crash(rec), stall(rec)):
        # a stall after the trainer's non-finite .HALT is the end of a run the non-finite loss decided
        if found is not None and found.ranks and found.kind != Kind.HALT_STALL:
            return found
    return None
