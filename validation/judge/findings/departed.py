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

Only ranks that wrote a heartbeat (they ran) and whose last heartbeat is before the last step
asked for count: a rank that finished its steps and exited while another hung after them did not
leave early.
"""
from __future__ import annotations

from validation.contract.torchrun_log import root_rank
from validation.judge.record import PhaseRecord


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
            and (hb := ev.last_heartbeat.get(k)) is not None and hb.step is not None and hb.step < rec.steps]
    others = set(failures) | running
    return gone if gone and others else []


def departure(rec: PhaseRecord, ranks: list[int]) -> str:
    """'rank 1 exited 0 early (last heartbeat step 4 of 8, stage data)' for each of ``ranks``."""
    parts = []
    for k in ranks:
        hb = rec.evidence.last_heartbeat[k]
        stage = f", stage {hb.stage}" if hb.stage else ""
        parts.append(f"rank {k} exited 0 early (last heartbeat step {hb.step} of {rec.steps}{stage})")
    return "; ".join(parts)
