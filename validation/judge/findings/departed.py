"""Which ranks of a run of several left early: ended with exit 0 and no failure of their own,
before the steps asked for, while the other ranks still needed them. The others then fail in
their collectives after it (gloo: 'Connection closed by peer', a peer's failure, not their own)
or wait for it until the stall watch stops the run, so the rank that left is the one to name;
its own files show nothing wrong.

How a rank is known to have left with exit 0, under torchrun (its agent is what reports ends):

- the run failed: torchrun lists every worker that did not succeed, those it stopped with SIGTERM
  too; a rank of the world it does not list had exited 0 before the others failed;
- the harness stopped a stalled or timed-out run: it looked for every rank's process to take its
  stack (TakenStack), so a rank it found no process of had ended; with no failure of it in
  torchrun's logs, with exit 0 (torchrun ends every worker when one fails).

Only ranks that wrote a heartbeat (they ran) and whose last heartbeat says they did not complete
the last step asked for count (``incomplete``): a step before it, or the last step itself in a
record of a stage within a step, whose ``step`` is the step in progress (the contract,
nsa/contract.py ``HEARTBEAT_STAGES_IN_STEP``). A rank whose last record may say it completed the
last step (a ``step`` record, a checkpoint or profile after it, a stage the contract does not name,
none) did not leave early: it finished its steps and exited while another hung after them.
"""
from __future__ import annotations

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.contract.torchrun_log import root_rank
from validation.judge.record import Beat, PhaseRecord


def incomplete(beat: Beat | None, steps: int) -> bool:
    """The rank whose last heartbeat is ``beat`` did not complete ``steps``: its last record is of
    an earlier step, or of a stage within the last one (that step in progress). False where the
    record may say the last step was completed, or says no step."""
    if beat is None or beat.step is None:
        return False
    return beat.step < steps or (beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP)


def departed(rec: PhaseRecord) -> list[int]:
    """The ranks that left early (see the module's docstring), lowest first; [] when none did or
    nothing tells (one process, a failure of some rank's own, a process of unknown rank)."""
    ev = rec.evidence
    if rec.world_size < 2 or not rec.steps or root_rank(ev.rank_failures) is not None:
        return []
    failures = ev.rank_failures
    if rec.stalled_s is not None or rec.timed_out:
        if any(t.rank is None for t in ev.taken_stacks):
            return []  # a process of unknown rank may be the one that seems gone
        running = {t.rank for t in ev.taken_stacks}
    elif rec.exit_code not in (0, None) and failures:
        running = set()
    else:
        return []
    gone = [k for k in range(rec.world_size) if k not in failures and k not in running
            and incomplete(ev.last_heartbeat.get(k), rec.steps)]
    others = set(failures) | running
    return gone if gone and others else []


def departure(rec: PhaseRecord, ranks: list[int]) -> str:
    """'rank 1 exited 0 early (last heartbeat step 4 of 8, stage data)' for each of ``ranks``, with
    ': step 8 not completed' where its last record was within the last step."""
    parts = []
    for k in ranks:
        hb = rec.evidence.last_heartbeat[k]
        stage = f", stage {hb.stage}" if hb.stage else ""
        within = f": step {hb.step} not completed" if hb.step == rec.steps else ""
        parts.append(f"rank {k} exited 0 early (last heartbeat step {hb.step} of {rec.steps}{stage}{within})")
    return "; ".join(parts)
