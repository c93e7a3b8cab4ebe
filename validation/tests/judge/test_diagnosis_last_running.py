"""Who is blamed where every rank but one completed its steps and exited 0, and that one hung after
its last step (a save, a teardown, a loop of its own) until the harness's stall watch stopped the
run: the one process left running hung. The verdict said 'rank 1 stalled in <module>', the word for
ranks of which nothing tells which hung first. Judged as the harness judges a run it stopped, from
the files a real two-rank gloo run of a trainer of one's own left
(validation/tests/evidence/alone2_rank1_hung_after_steps: rank 1 sleeps after its 8th step, before
destroy_process_group; nothing runs here)."""
from __future__ import annotations

from pathlib import Path

from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord
from validation.tests.stopped_run import judged_stopped_run

RUN = Path(__file__).parents[1] / "evidence" / "alone2_rank1_hung_after_steps"


def _judged() -> PhaseRecord:
    return judged_stopped_run(RUN, RUN / "trainer.stderr.log", stalled_s=12.0, stacks_tried=1)


def test_the_one_rank_left_running_after_the_others_exited_is_named_hung():
    rec = _judged()
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 hung in <module> (last heartbeat step 8, stage step) — stalled"), \
        verdict_line(rec)
    [stall] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert stall.title.endswith(": hung: rank 1 in <module>; the other ranks had ended"), stall.title
    assert "rank 0: last heartbeat step 8, stage step; no process left to take a stack of: it had ended (exited 0)" \
        in stall.detail, stall.detail

