"""The diagnosis of ranks whose collectives went out of step, as their ends show it (``out_of_step``): a rank
failed in a collective within a step that another rank had completed before it exited 0.

A rank completes a step only once every collective of it has completed, with every rank's part. So where a
rank exited 0 having completed step N, it had called each collective of step N and the others had met it
there; a rank still inside step N, in one of that step's collectives, when the exited rank's end broke it
(gloo: 'Connection closed by peer'), was left without a partner because its earlier collectives had taken the
exited rank's later ones: it had called more collectives than the exited rank by then. One rank called a
collective the other did not (a rank-conditional one: a loss all-reduced again for logging on one rank), or
skipped one the other called, earlier in the run; a collective of the same size pairs silently with the
other's next one, so nothing failed there, and each collective after it met another of the other rank's than
its own. Which rank did, and at which step, the evidence does not tell.

That is not the early exit the same ends may seem to show: a rank that exited 0 early (its heartbeats stop
before the last step, ``departed``) did not complete the step the others failed in; one that exited 0 after
its last step while the others failed in a collective after theirs (a final barrier: their heartbeats say they
completed the last step too) left them after the loop (Kind.ENDED)."""
from __future__ import annotations

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.judge.diagnosis.blame import Diagnosis, Kind, RankAt, diagnosis_of, earlier_beat, logs_of
from validation.judge.record import PhaseRecord


def out_of_step(r: PhaseRecord, ended: list[int]) -> Diagnosis | None:
    """Of a failed run where no rank failed in its own right, none left early and ``ended`` exited 0 (``exited_0``):
    the ranks that failed in a collective within a step one of ``ended`` had completed (the module's docstring),
    beside those of ``ended`` that had completed it. None where no rank failed so, or torchrun started the
    workers again (a rank's last heartbeat may then be an earlier attempt's: a rank that exited 0 in the last
    one need have written none)."""
    ev = r.evidence
    if any(a.restarted for a in ev.attempts):
        return None
    beats = ev.last_heartbeat
    done = {k: b.done for k in ended if (b := beats.get(k)) is not None and b.done is not None}
    if not done:
        return None
    furthest = max(done.values())
    # a record of a stage within a step says the step was in progress only where the rank's records mark a
    # step's end at all (Beat.ends_steps); its traceback ending in a collective says where it failed in it
    within = {k: b.step for k, f in ev.rank_failures.items()
              if f.collective is not None and f.raised_at is not None and not f.own
              and (b := beats.get(k)) is not None and b.step is not None and b.stage in HEARTBEAT_STAGES_IN_STEP
              and b.ends_steps and earlier_beat(ev, k) is None and b.step <= furthest}
    if not within:
        return None
    last = max(within.values())
    completed = sorted(k for k, step in done.items() if step >= last)
    failed = tuple(RankAt.of(r, k, frame=ev.rank_failures[k].collective, cause=ev.rank_failures[k].cause or "",
                             site=ev.rank_failures[k].raised_at) for k in sorted(within))
    return diagnosis_of(Kind.OUT_OF_STEP, failed, r, ended=tuple(RankAt.of(r, k) for k in completed),
                        logs=logs_of(r, [*within, *completed]))
