"""The nodes of a launch whose ranks' collectives were at fault (validation/judge/findings/nodes.py ``COLLECTIVES``):
no node failed of its own, and the listing of where each rank ran says so in the nodes' terms. gloo's check of a
message's size aborts the rank that received the other size (SIGABRT): the node finding read "node 0's rank 0 was
killed by SIGABRT in size [default]; the other nodes: ...", with the advice of a rank that died first ("SIGKILL with
no traceback is usually the kernel's OOM killer"), beside the collective-mismatch finding that says the rank a check
ended is where it was detected, not the culprit; torch's check under TORCH_DISTRIBUTED_DEBUG=DETAIL read "node 0's
rank 0 failed: RuntimeError: Detected mismatch between collectives on ranks" the same way. Of ranks whose collectives
went out of step, the listing said nothing of it.

Judged from the files real runs of validation/tests/record_trainer.py as two nodes x one process on one host left
(torchrun nnodes 2, c10d at localhost, 6 steps; validation/tests/evidence/nodes2_*: NSA_RECORD_SIZE=1@3, with
TORCH_DISTRIBUTED_DEBUG=DETAIL, NSA_RECORD_TWICE=1@3, and with NSA_RECORD_HOLD=1 and stall_s 40), and from one changed
where the same SIGABRT is not a check's; nothing runs here."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import Severity, find, recommendations
from validation.judge.findings.nodes import nodes
from validation.judge.record import PhaseRecord
from validation.tests.stopped_run import judged_run, judged_stopped_run

EVIDENCE = Path(__file__).parents[1] / "evidence"
STEPS = 6
#: the node finding's advice of a rank that died first
DIED_FIRST = "A rank on one node died first"


def _node_finding(rec: PhaseRecord):
    [f] = nodes([rec])
    return f


def _crashed(name: str) -> PhaseRecord:
    return judged_run(EVIDENCE / name, "node0.stderr.log", 1, steps=STEPS)


def test_a_nodes_rank_aborted_by_gloos_size_check_is_no_failure_of_that_node():
    rec = _crashed("nodes2_mismatch_rank0_aborted")
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and d.detected.ranks == (0,), d
    assert rec.evidence.rank_failures[0].signal == "SIGABRT", rec.evidence.rank_failures
    f = _node_finding(rec)
    assert (f.severity, f.kind) == (Severity.INFO, "nodes"), f
    assert f.title.endswith("; no node failed of its own: the ranks' collectives did not match across the nodes: "
                            "gloo's check of a message's size aborted node 0's rank 0, where the mismatch was "
                            "detected"), f.title
    assert "killed by SIGABRT by gloo's check of a message's size" in f.detail[0], f.detail
    advice = recommendations(find([rec]))
    assert not any(DIED_FIRST in a for a in advice) and any("not the culprit" in a for a in advice), advice


def test_a_mismatch_torchs_detail_check_raised_in_every_node_is_no_failure_of_a_node():
    rec = _crashed("nodes2_mismatch_detail")
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and d.detected.ranks == (0, 1), d
    f = _node_finding(rec)
    assert (f.severity, f.kind) == (Severity.INFO, "nodes"), f
    assert f.title.endswith("; no node failed of its own: the ranks' collectives did not match across the nodes: "
                            "torch's check of the collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL) raised in node 0's rank "
                            "0, node 1's rank 1, where the mismatch was detected"), f.title
    assert not any(DIED_FIRST in a for a in recommendations(find([rec])))


def test_a_nodes_rank_killed_by_sigabrt_from_elsewhere_is_still_that_nodes_failure(tmp_path):
    """The same run without gloo's word of its check (a SIGABRT sent from elsewhere, `kill -ABRT`): the rank died
    first in its own right, and the node finding says so as before."""
    run = tmp_path / "run"
    shutil.copytree(EVIDENCE / "nodes2_mismatch_rank0_aborted", run)
    log = run / "node0.stderr.log"
    log.write_text("".join(ln for ln in log.read_text().splitlines(keepends=True)
                           if not ln.startswith(("terminate called", "  what():"))))
    rec = judged_run(run, "node0.stderr.log", 1, steps=STEPS)
    assert diagnose(rec).kind != Kind.MISMATCHED, diagnose(rec)
    f = _node_finding(rec)
    assert (f.severity, f.kind) == (Severity.CRITICAL, "node_failed"), f
    assert f.title.startswith("node 0's rank 0 was killed by SIGABRT in ddp [default]"), f.title
    assert any(DIED_FIRST in a for a in recommendations(find([rec])))


def test_a_nodes_rank_that_failed_in_a_step_the_other_nodes_rank_completed_is_out_of_step_across_the_nodes():
    rec = _crashed("nodes2_outofstep_rank1_failed")
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and not d.waiting, d
    f = _node_finding(rec)
    assert (f.severity, f.kind) == (Severity.INFO, "nodes"), f
    assert f.title.endswith("; no node failed of its own: the ranks' collectives were out of step across the nodes: "
                            "node 1's rank 1 failed in a collective during step 6, a step node 0's rank 0 had "
                            "completed before it exited 0"), f.title


def test_a_nodes_rank_left_waiting_in_a_step_the_other_nodes_rank_completed_is_out_of_step_across_the_nodes():
    run = EVIDENCE / "nodes2_outofstep_rank1_waited"
    rec = judged_stopped_run(run, run / "node0.stderr.log", stalled_s=40.0, stacks_tried=1, steps=STEPS)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.waiting, d
    f = _node_finding(rec)
    assert (f.severity, f.kind) == (Severity.INFO, "nodes"), f
    assert f.title.endswith("; no node failed of its own: the ranks' collectives were out of step across the nodes: "
                            "node 1's rank 1 waited in a collective, with no partner left, during step 6, a step node "
                            "0's rank 0 had completed before it exited 0"), f.title
    assert not any("nothing waited for it" in a for a in recommendations(find([rec])))


def test_the_nodes_timing_column_says_a_step_apart_of_ranks_out_of_step_is_no_lateness():
    """Rank 1's extra all-reduce at step 3 paired with rank 0's of step 3, and each of rank 1's after it with rank
    0's of the next step: from there on rank 1's heartbeats of a step number came a step (about 51 ms) after rank
    0's of the same number. The listing read 'node 1 ...; median step 51.6 ms, 51.1 ms behind the earliest rank', a
    slow node: the ranks were in lock-step, a step number naming different steps on them."""
    rec = _crashed("nodes2_outofstep_rank1_failed")
    line = _node_finding(rec).detail[1]
    assert "behind" not in line, line
    assert re.search(r"; median step 51\.6 ms, 51\.1 ms after the earliest rank's heartbeats of the same step number, "
                     r"which is no lateness: the ranks' collectives were out of step, so a step number named different "
                     r"steps on different ranks; agent exit 1", line), line


def test_the_nodes_timing_column_of_a_rank_suspected_out_of_step_says_what_the_delay_may_be(tmp_path):
    """No stack of node 1's rank 1 (py-spy could not take one): out of step is suspected (it may have hung of its
    own within the step), and so the listing says its delay may be lateness or a step apart; no node finding
    says the ranks' collectives were out of step."""
    run = tmp_path / "run"
    shutil.copytree(EVIDENCE / "nodes2_outofstep_rank1_waited", run)
    (run / "harness_stacks" / "rank1.txt").unlink()
    index = run / "harness_stacks" / "index.json"
    [taken] = json.loads(index.read_text())
    index.write_text(json.dumps([{**taken, "method": "none", "path": None, "note": (
        "py-spy could not take its stack (py-spy is not installed); it has no SIGUSR1 handler to ask instead")}]))
    rec = judged_stopped_run(run, run / "node0.stderr.log", stalled_s=40.0, stacks_tried=1, steps=STEPS)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.suspected, d
    f = _node_finding(rec)
    assert "out of step" not in f.title, f.title
    assert re.search(r"; median step 51\.1 ms, 50\.9 ms after the earliest rank's heartbeats of the same step number: "
                     r"lateness, or, if the ranks' collectives were out of step, no lateness but a step number naming "
                     r"different steps on different ranks; agent", f.detail[1]), f.detail[1]
