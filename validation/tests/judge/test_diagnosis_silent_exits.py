"""Who is blamed where a rank exited 0 early and another, whose collective then broke, caught the
error and exited 1 with no traceback (its own message only): judged from the files a real
three-rank gloo run of a trainer of one's own left (torchrun's log trimmed of its own traceback's
frames, the heartbeats' last records; nothing runs here). The rank that exited non-zero silently
is no failure in its own right once a rank that torchrun lists no failure of had left before the
steps asked for: the one that left is named."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from validation.contract.files import read_heartbeats
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.left import maybe_departed
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.tests.torchrun_summary import Failed, child_failed

EVIDENCE = Path(__file__).parents[1] / "evidence"


def _summary(*also: Failed) -> str:
    """torchrun's summary of SWALLOWED's run: rank 0 failed first (its exit 1), then its agent ended rank
    2, still running; and ``also``."""
    return child_failed("/tmp/b13/myt/train.py", Failed(0, 4075, 1), Failed(2, 4077, -15), *also,
                        time="2026-11-27_23:26:59")


#: MYT_FAULT=return:1@3 (rank 1 returns from main as step 3 starts), every other rank catches its
#: broken all_gather, prints one line and exits 1; torchrun x3, gloo
SWALLOWED = """rank 2: lost a peer, giving up
rank 0: lost a peer, giving up
W1127 23:26:59.306000 4064 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 4077 closing signal SIGTERM
E1127 23:26:59.326000 4064 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 4075) of binary: /venv/bin/python3
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
""" + _summary()
#: each rank's last two heartbeats: rank 1 completed step 2 and never began step 3
BEATS = {0: [{"step": 2, "stage": "step"}, {"step": 3, "stage": "forward"}],
         1: [{"step": 2, "stage": "forward"}, {"step": 2, "stage": "step"}],
         2: [{"step": 2, "stage": "step"}, {"step": 3, "stage": "forward"}]}


def _record(tmp_path: Path, log: str = SWALLOWED) -> PhaseRecord:
    path = tmp_path / "trainer.stderr.log"
    path.write_text(log)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log=path.name,
                  last_heartbeat={k: Beat.of(recs) for k, recs in BEATS.items()})
    return PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=3, exit_code=1, evidence=ev,
                       trainer="my.trainer")


def test_a_rank_that_exited_0_early_is_named_not_the_one_that_swallowed_its_broken_collective(tmp_path):
    rec = _record(tmp_path)
    assert rec.evidence.rank_failures[0].silent  # exit code 1, no exception, no signal
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.LEFT and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 exited 0 early (last heartbeat step 2, stage step)"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert crash.kind == "departed", crash
    assert "rank 1 exited 0 early (last heartbeat step 2 of 8, stage step)" in crash.title, crash.title
    assert "rank 0: exit code 1" not in crash.title, crash.title
    assert "rank 0: last heartbeat step 3, stage forward; exit code 1" in crash.detail, crash.detail
    [advice] = recommendations([crash])
    assert "exited 0 before the steps asked for" in advice and "Rank 0 exited with code 1" not in advice, advice


def _sigtermed(rank: int) -> str:
    """SWALLOWED with torchrun listing ``rank`` too, SIGTERMed by its agent once rank 0 had failed (the
    agent's line that says so beside its SIGTERM of rank 2)."""
    agent = "torch/distributed/elastic/multiprocessing/api.py:1028] Sending process"
    log = SWALLOWED.replace(f"{agent} 4077 closing signal SIGTERM\n", f"{agent} 4077 closing signal SIGTERM\n"
                            f"W1127 23:26:59.306000 4064 {agent} 4076 closing signal SIGTERM\n")
    return log.replace(_summary(), _summary(Failed(rank, 4076, -15)))


def test_a_silent_exit_beside_a_sigtermed_rank_behind_it_names_both(tmp_path):
    """The same silent exit of rank 0 where torchrun lists rank 1 too, SIGTERMed once rank 0 had
    failed: rank 1 may have been running behind (rank 0 failed in its own right) or still exiting
    after its exit 0 (rank 0 caught its collective broken). Once named rank 0 alone."""
    rec = _record(tmp_path, _sigtermed(1))
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [0], verdict_line(rec)
    assert c.or_else is not None and c.or_else.kind == Kind.LEFT and [r.rank for r in c.or_else.ranks] == [1], c
    assert verdict_line(rec).startswith(
        "rank 0 crashed (last heartbeat step 3, stage forward): exit code 1, or rank 1 exited 0 early (last heartbeat "
        "step 2, stage step) and the others failed after it: which came first cannot be told"), verdict_line(rec)


def test_a_stopped_runs_sigterms_say_nothing_of_a_rank_that_may_have_left(tmp_path):
    """The same evidence in a run the harness stopped (its stall watch): the SIGTERMs are its stop's,
    and rank 1, behind, is no rank that may have been exiting."""
    rec = dataclasses.replace(_record(tmp_path, _sigtermed(1)), stalled_s=10.0, exit_code=None)
    assert maybe_departed(rec) == [], rec.evidence.rank_failures


def test_a_silent_exit_beside_sigtermed_ranks_as_far_as_it_is_the_one_named(tmp_path):
    """Rank 1's heartbeats reach rank 0's step (its last record step 3, forward): no rank torchrun
    ended was behind the one that failed, and rank 0 alone is named."""
    rec = _record(tmp_path, _sigtermed(1))
    rec.evidence.last_heartbeat[1] = Beat.of(BEATS[0])
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [0], verdict_line(rec)
    assert c.or_else is None, verdict_line(rec)


def test_a_sigtermed_rank_within_its_heartbeat_interval_is_not_behind(tmp_path):
    """Rank 1 beats every 2 steps (its records: steps 0 and 2): its last record of step 2 may be
    of a rank in step 3 with the others, so it is not behind rank 0 and not named."""
    rec = _record(tmp_path, _sigtermed(1))
    rec.evidence.last_heartbeat[1] = Beat.of([{"step": 0, "stage": "step"}, {"step": 2, "stage": "step"}])
    c = diagnose(rec)
    assert c is not None and [r.rank for r in c.ranks] == [0] and c.or_else is None, verdict_line(rec)


def _recorded(name: str) -> PhaseRecord:
    """A record of the real run in validation/tests/evidence/NAME (see ``test_three_ranks_...``)."""
    run = EVIDENCE / name
    ev = Evidence(rank_failures=rank_failures(run / "trainer.stderr.log"), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(run).items()})
    return PhaseRecord(PointKey("swallow3", "cpu", "quit_rank"), "swallow3/cpu/quit_rank/default", "train",
                       Status.FAIL, "trainer crashed (exit code 1)", steps=8, world_size=3, exit_code=1, evidence=ev,
                       trainer="myt")


@pytest.mark.parametrize("name, silent", [("swallow3_leaver_sigtermed", [1]), ("swallow3_two_silent", [0, 1])])
def test_three_ranks_whose_leaver_torchrun_sigtermed_name_it_beside_the_silent_ones(name, silent):
    """Real runs, torchrun x3 on gloo, of a trainer of one's own (not in this repository):
    rank 2 destroys its process group and returns from main as step 3 starts, its interpreter's exit
    then taking 1 s (an atexit hook); the other ranks catch their broken all_reduce, print one line
    and exit 1 (os._exit). Before rank 2 had ended, torchrun saw a silent exit and ended rank 2 with
    SIGTERM. swallow3_leaver_sigtermed: rank 0 waited 0.5 s before its exit 1 and was SIGTERMed too,
    so rank 1's exit 1 was torchrun's only failure besides them, and the verdict named rank 1 alone:
    'rank 1 crashed (last heartbeat step 3, stage forward): exit code 1'. swallow3_two_silent: both
    exited 1 at once, and no rank was named. Now rank 2 is named beside them, and that which came
    first cannot be told."""
    rec = _recorded(name)
    assert rec.evidence.rank_failures[2].signal == "SIGTERM", rec.evidence.rank_failures  # the evidence is as said
    c = diagnose(rec)
    assert c is not None and [r.rank for r in c.ranks] == silent and c.kind == Kind.CRASHED, verdict_line(rec)
    assert c.or_else is not None and [r.rank for r in c.or_else.ranks] == [2], verdict_line(rec)
    assert "rank 2 exited 0 early (last heartbeat step 2, stage step)" in verdict_line(rec), verdict_line(rec)
    assert "which came first cannot be told" in verdict_line(rec), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert "rank 2 exited 0 early (last heartbeat step 2 of 8, stage step)" in crash.title, crash.title
    [advice] = recommendations([crash])
    assert "rank 2 may have exited 0 early" in advice, advice


def test_three_ranks_whose_leavers_exit_0_torchrun_saw_name_it_alone():
    """The same trainer, rank 2 leaving with os._exit(0) at once: torchrun saw its exit 0 before the
    others' exit 1 and lists no failure of it (swallow3_exit0_seen), so it left, and it alone is named."""
    rec = _recorded("swallow3_exit0_seen")
    assert 2 not in rec.evidence.rank_failures, rec.evidence.rank_failures  # the evidence is as said
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.LEFT and [r.rank for r in c.ranks] == [2] and c.or_else is None, c


def test_the_node_finding_of_a_silent_exit_beside_a_sigtermed_rank_behind_it_names_both(tmp_path):
    """The evidence of ``test_a_silent_exit_beside_a_sigtermed_rank_behind_it_names_both`` over two
    nodes (rank 0 on node 0; ranks 1 and 2 on node 1): the node finding named node 0's rank 0 alone
    as having failed, beside a verdict that names rank 1 too."""
    rec = _record(tmp_path, _sigtermed(1))
    rec.evidence.nodes = NodesEvidence("torchrun", "localhost:1", 6.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1, 2])])
    [node] = [f for f in find([rec]) if f.kind == "node_failed"]
    assert node.title.startswith(
        "node 0's rank 0 failed: exit code 1 in ddp [default] (log node0.stderr.log), or node 1's rank 1 exited 0 "
        "early (last heartbeat step 2 of 8, stage step) and it failed after it: which came first cannot be told; "
        "the other nodes: "), node.title
