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



def test_the_advice_of_a_rank_that_outlived_the_others_says_they_had_ended_not_that_they_waited():
    """A user pass, the same run over two nodes: the finding said 'already ended: node 0's
    rank 0 (exited 0)' while its advice said 'the other nodes waited in them' (and the stall's, that a
    rank inside a collective while another is elsewhere means the ranks' steps diverged): nothing
    waited for it; the others had ended."""
    from validation.judge.findings import recommendations
    from validation.judge.nodes import NodeEvidence, NodesEvidence

    rec = _judged()
    [stall] = [f for f in find([rec]) if f.title.startswith("stall in")]
    [advice] = recommendations([stall])
    assert "outlived the other ranks, which had ended" in advice and "steps diverged" not in advice, advice
    rec.evidence.nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])
    [node] = [f for f in find([rec]) if f.kind.startswith("node_")]
    assert node.kind == "node_hung_alone" and "already ended: node 0's rank 0 (exited 0)" in node.title, node
    [advice] = recommendations([node])
    assert "after the ranks of the other nodes had ended" in advice and "waited in them" not in advice, advice
