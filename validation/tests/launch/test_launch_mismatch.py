"""A collective of another size on one rank, through the harness and a real two-rank torchrun (gloo on CPU):
validation/tests/record_trainer.py's rank 1 all-reduces 7 floats of its own at step 3 (``log_metrics``) on the
default group, where rank 0 all-reduces the step's loss (1 float). gloo's size check fires in the rank that
receives the message of the other size, here rank 0, and aborts it (SIGABRT); the verdict read 'rank 0 crashed
(...): killed by SIGABRT', the rank that never left the common path blamed. The rank the check ended is where
the mismatch was detected; both call sites are named, and of two ranks neither is blamed.

As two nodes of one process each (two torchrun agents on this host), the node finding read "node 0's rank 0 was
killed by SIGABRT ...; the other nodes: ...", with the advice of a rank that died first (the OOM killer): no node
failed of its own, and the listing of the nodes says the ranks' collectives did not match."""
from __future__ import annotations

import re

import pytest

from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import Severity, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.findings.nodes import nodes
from validation.tests.conftest import FakeRun

RECORD_TRAINER = "validation.tests.record_trainer"


@pytest.mark.distributed
def test_torchrun_a_collective_of_another_size_on_rank_1_blames_no_rank_and_names_both_call_sites(tmp_path):
    phase = {"name": "mismatch", "kind": "train", "steps": 8, "timeout_s": 120, "stall_s": 60, "startup_s": 60,
             "env": {"NSA_RECORD_SIZE": "1@3"}, "launcher": {"kind": "torchrun", "nproc": 2},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": RECORD_TRAINER}})
    rec = run.record
    assert rec.status == "FAIL" and rec.stalled_s is None and not rec.timed_out, rec.reason
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and not d.common, d
    aborted = d.detected.ranks
    assert len(aborted) == 1 and rec.evidence.rank_failures[aborted[0]].signal == "SIGABRT", rec.evidence.rank_failures
    assert {at.rank: at.site.func for at in d.ranks} == {0: "main", 1: "log_metrics"}, d
    line = verdict_line(rec)
    assert re.match(rf"the ranks' collectives did not match: gloo's check of a message's size aborted rank {aborted[0]} "
                    r"\(.*Received data size doesn't match expected size\), where the mismatch was detected; rank 0 was "
                    r"in all_reduce at tests/record_trainer.py:\d+ \(main; last heartbeat step 3, stage backward\), "
                    r"rank 1 in all_reduce at tests/record_trainer.py:\d+ \(log_metrics; last heartbeat step 3, stage "
                    r"backward\): nothing tells which of the two left the common path", line), line
    assert "crashed" not in line.split(" — ")[0], line


@pytest.mark.distributed
@pytest.mark.multi_node
def test_two_nodes_a_collective_of_another_size_on_rank_1_is_no_failure_of_the_node_whose_rank_the_check_aborted(
        tmp_path):
    launcher = {"kind": "torchrun", "nproc": 1, "nnodes": 2, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 30}}
    phase = {"name": "mismatch", "kind": "train", "steps": 8, "timeout_s": 120, "stall_s": 60, "startup_s": 60,
             "env": {"NSA_RECORD_SIZE": "1@3"}, "launcher": launcher,
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": RECORD_TRAINER}})
    rec = run.record
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED, (d, rec.reason)
    [aborted] = d.detected.ranks
    node = rec.evidence.nodes.of_rank(aborted).name  # c10d gives either agent either node rank
    [f] = nodes([rec])
    assert (f.severity, f.kind) == (Severity.INFO, "nodes"), f
    assert f.title.endswith("; no node failed of its own: the ranks' collectives did not match across the nodes: "
                            f"gloo's check of a message's size aborted {node}'s rank {aborted}, where the mismatch was "
                            "detected"), f.title
    assert not any("died first" in a for a in recommendations(run.context["findings"]))
