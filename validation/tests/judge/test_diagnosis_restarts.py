"""A run that torchrun --max-restarts started again into the same log is judged by its last
attempt: the ranks' ends are read from the part of the log after the attempt before it ended (its
agent's failure line per attempt), and each earlier attempt's failure is said as that attempt's.
The crash finding once joined the last attempt's exit (SIGKILL) to the first attempt's exception,
read from the whole log: 'rank 1: RuntimeError: ...', a cause no process of the run's end had. The
log is a user's two-rank run of a trainer of their own; nothing runs here. The rank an attempt's
exception was looked up by was once the local rank torchrun's agent names the failed worker by, which
on a node of several is not its global rank; and a later attempt after one failure line (a stall, a
success) was read as the first attempt's end."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from validation.contract.torchrun_log import AgentSeen, AttemptEnd, attempt_ends, rank_failures
from validation.judge.evidence import collect
from validation.judge.findings import find
from validation.judge.findings.advice import recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.tests.stopped_run import judged_run, judged_stopped_run
from validation.tests.torchrun_summary import Failed, child_failed

_AGENT = "E1206 01:04:1{i}.920000 16491 torch/distributed/elastic/multiprocessing/api.py:1002] "
_SIGNAL = "W1206 01:04:1{i}.888000 16491 torch/distributed/elastic/multiprocessing/api.py:1028] "
_RAISED = "RuntimeError: shard 7 is truncated at step 12"

_RAISES = "".join(f"[rank1]: {ln}\n" for ln in [
    "Traceback (most recent call last):",
    '  File "/home/u/mine/mytrain.py", line 88, in <module>',
    "    batch = next(shards)",
    _RAISED])
_AGENT_TRACEBACK = """\
Traceback (most recent call last):
  File "/home/u/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
"""


def _ended(i: int, ended: int, failed: int, code: int) -> str:
    """The agent's lines as an attempt ends: it signals the worker still running (pid ``ended``), then
    says which failed first (local rank 1, pid ``failed``)."""
    return (_SIGNAL.format(i=i) + f"Sending process {ended} closing signal SIGTERM\n" + _AGENT.format(i=i)
            + f"failed (exitcode: {code}) local_rank: 1 (pid: {failed}) of binary: /home/u/.venv/bin/python3\n")


#: attempt 1: rank 1 raises at step 12, the agent ends rank 0; attempt 2: rank 1 is killed by
#: SIGKILL (the out-of-memory killer's), the agent ends rank 0, and torchrun gives up: its summary
LOG = (_RAISES + _ended(1, 701, 702, 1) + _ended(7, 703, 704, -9) + _AGENT_TRACEBACK
       + child_failed("/home/u/mine/mytrain.py", Failed(1, 704, -9), Failed(0, 703, -15)))


def _record(tmp_path: Path, log: str) -> PhaseRecord:
    path = tmp_path / "trainer.stderr.log"
    path.write_text(log)
    run = RunData(tmp_path, world_size=2, exit_code=1, steps_requested=30)
    run.rank_failures = rank_failures(path)
    return PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", out_dir="runs/x", evidence=collect(run, path, []),
                       exit_code=1, world_size=2, steps=30, trainer="myt")


def test_the_crash_is_the_last_attempts_and_an_earlier_attempts_exception_is_its_own(tmp_path):
    rec = _record(tmp_path, LOG)
    f = rec.evidence.rank_failures
    assert f[1].signal == "SIGKILL" and f[1].exception is None and f[1].pid == 704, f
    assert f[0].by_agent and not f[0].own, f
    assert rec.evidence.attempts == [AttemptEnd(1, 1, 702, 1, _RAISED, restarted=True, rank=1),
                                     AttemptEnd(2, 1, 704, -9, rank=1)], rec.evidence.attempts
    assert verdict_line(rec).startswith("rank 1 crashed (no heartbeat written): killed by SIGKILL"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title == "crash in ddp [default]: exit code 1: rank 1: killed by SIGKILL", crash.title
    assert "shard 7" not in " ".join(crash.detail[:-1]), crash.detail
    assert crash.detail[-1] == ("earlier attempts, each followed by torchrun starting the workers again "
                                "(trainer.stderr.log): attempt 1 ended as rank 1 (pid 702) failed: "
                                f"{_RAISED}"), crash.detail


def test_a_run_that_was_not_restarted_reads_as_it_did(tmp_path):
    """The second attempt's lines taken out: one attempt, whose exception is rank 1's end, and no
    word of earlier attempts."""
    once = (_RAISES + _ended(1, 701, 702, 1) + _AGENT_TRACEBACK
            + child_failed("/home/u/mine/mytrain.py", Failed(1, 702, 1), Failed(0, 701, -15)))
    rec = _record(tmp_path, once)
    assert rec.evidence.rank_failures[1].exception == _RAISED and rec.evidence.rank_failures[1].exit_code == 1
    assert rec.evidence.attempts == [AttemptEnd(1, 1, 702, 1, _RAISED, rank=1)], rec.evidence.attempts
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.startswith(f"crash in ddp [default]: exit code 1: rank 1: {_RAISED}, at "), crash.title
    assert not any(d.startswith("earlier attempts") for d in crash.detail), crash.detail


# --- recorded runs: the harness's own runs (torch 2.13 on CPU, gloo) of a trainer of one's own (not in
# this repository: the contract's files, an all_reduce a step, its faults chosen by the attempt,
# TORCHELASTIC_RESTART_COUNT) under torchrun --max-restarts=1; each folder holds torchrun's logs as
# the harness kept them, the trainer's files and the harness's nodes.json or stacks

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: two nodes x one process (two agents, c10d on localhost): rank 1, node 1's only worker (local rank 0),
#: raises in attempt 1 (step 4) and again in attempt 2 (step 3); rank 0 fails after it each time
NODES_TWICE = EVIDENCE / "nodes2_restart_rank1_twice"
#: the same launch, rank 1 raising in attempt 1 only: attempt 2 runs its 8 steps, both agents exit 0
NODES_THEN_OK = EVIDENCE / "nodes2_restart_rank1_then_ok"
#: one node x two processes: rank 1 raises in attempt 1 (step 4), one failure line; in attempt 2 it stops
#: itself (SIGSTOP) at step 3, rank 0 waits in its all_reduce, and the harness's stall watch ends the run
FROZEN_LATER = EVIDENCE / "restart2_rank1_frozen_later"
#: the same launch (6 steps, --max-restarts=2), rank 0 sleeping 6 s in step 3 of attempt 1 while rank 1
#: raises there: node 1's agent restarts its workers, and node 0's, seeing node 1 wait at the rendezvous,
#: stops its healthy rank 0 (SIGTERM, no failure line, no restart counted) to join the same round. In
#: attempt 2 rank 1 fails in init_process_group and rank 0 on its broken connection (node 0's first
#: failure line); in attempt 3 both hang in init_process_group and the harness's stall watch ends the run
PEER_STOPPED = EVIDENCE / "nodes2_restart_peer_stopped"
#: srun of torchrun, two Slurm nodes x one process (--max-restarts=2 through PET_MAX_RESTARTS): rank 1
#: raises in attempt 1; every restart's workers then fail in init_process_group. Node 0's agent (the
#: store's) fails in each attempt and gives up after attempt 3 with its summary; node 1's, whose attempt
#: 2 it stopped for node 0's restart, still had a restart left after attempt 3's failure line and lost
#: the rendezvous going to start its workers again (RendezvousConnectionError, exit 1, no summary)
STORE_GAVE_UP = EVIDENCE / "slurm2_restart_store_node_gave_up"
#: the same Slurm launch, rank 1 raising in attempt 1 (node 0's only worker: c10d made that task node
#: rank 1); attempt 2's workers both hang in init_process_group, before any heartbeat, and the
#: harness's stall watch takes their stacks (pids 13657, 13656) and ends the run
HUNG_IN_INIT = EVIDENCE / "slurm2_restart_hung_in_init"
_SHARD4 = "RuntimeError: shard 4 of rank 1 is truncated (attempt 0)"


def test_each_nodes_failed_attempts_name_the_global_rank_and_its_own_exception():
    """Node 1's agent names its worker by local rank 0; its exception's prefix names global rank 1.
    The local rank was taken for the global one: node 1's attempt 1 read 'local rank 0 (pid 7282)
    exited with code 1', its exception lost (rank 0's lines are in node 0's log), and only the
    blamed node's log was read."""
    rec = judged_run(NODES_TWICE, "node0.stderr.log", 1)
    assert rec.evidence.stderr_log == "node1.stderr.log", rec.evidence.stderr_log
    [attempt1, attempt2] = [a for a in rec.evidence.attempts if a.node == 1]
    assert (attempt1.rank, attempt1.local_rank, attempt1.pid, attempt1.restarted) == (1, 0, 7282, True), attempt1
    assert attempt1.exception == _SHARD4, attempt1
    assert (attempt2.rank, attempt2.restarted, attempt2.exception) == (
        1, False, "RuntimeError: shard 3 of rank 1 is truncated (attempt 1)"), attempt2
    assert [(a.rank, a.local_rank, a.own) for a in rec.evidence.attempts if a.node == 0] == [(0, 0, False)] * 2
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.startswith("crash in ddp [default]: exit code 1: rank 1: RuntimeError: shard 3 of rank 1 "
                                  "is truncated (attempt 1)"), crash.title
    assert crash.detail[-1].startswith(
        "earlier attempts, each followed by torchrun starting the workers again (node0.stderr.log, node1.stderr.log): "
        f"attempt 1 of node 1 ended as rank 1 (local rank 0, pid 7282) failed: {_SHARD4}; attempt 1 of node 0 ended "
        "as rank 0 (local rank 0, pid 7281) failed: RuntimeError: Connection closed by peer"), crash.detail


def test_a_nodes_global_rank_is_its_summarys_where_the_launch_did_not_see_its_node_rank(tmp_path):
    """Without nodes.json's node rank (no worker of the node was seen), the agent's summary as it gave
    up says it: 'rank : 1 (local_rank: 0)'; the same agents keep their node ranks in every round of
    c10d's rendezvous, so the restarted attempt's worker was rank 1 too. Where no summary says it
    either, the worker is its local rank alone, and no rank's exception is taken for its."""
    log = NODES_TWICE / "node1.stderr.log"
    assert [(a.rank, a.exception) for a in attempt_ends(log)] == [
        (1, _SHARD4), (1, "RuntimeError: shard 3 of rank 1 is truncated (attempt 1)")]
    cut = tmp_path / "node1.stderr.log"
    text = log.read_text()
    cut.write_text(text[:text.index("Traceback (most recent call last):\n  File \"<frozen runpy>\"")])
    ends = attempt_ends(cut)  # the agent stopped before its summary
    assert [(a.rank, a.exception, a.who) for a in ends] == [(None, None, "local rank 0 (pid 7282)"),
                                                           (None, None, "local rank 0 (pid 7310)")], ends
    assert [a.rank for a in attempt_ends(cut, AgentSeen(first_rank=1, node=1))] == [1, 1]


def test_a_restart_that_succeeded_after_one_failure_line_is_no_ranks_end():
    """Both agents exit 0 after one failure line each (no summary): torchrun had started the workers
    again and they finished. Node 1's rank 1 read as ended by attempt 1's exception ('rank 1 ...
    RuntimeError: shard 4 ...'), each node's agent as last saying its attempt 1 failure line beside its
    exit 0, and the resumed-in-place warning said attempt 1 ended as node 0's 'local rank 0 ...
    failed: RuntimeError: Connection closed by peer', the root cause (node 1's rank 1) unsaid."""
    rec = judged_run(NODES_THEN_OK, "node0.stderr.log", 0)
    assert rec.status == Status.PASS and rec.evidence.rank_failures == {}, (rec.reason, rec.evidence.rank_failures)
    assert [(n.exit_code, n.said) for n in rec.evidence.nodes.nodes] == [(0, None), (0, None)], rec.evidence.nodes
    assert all(a.restarted for a in rec.evidence.attempts), rec.evidence.attempts
    [warning] = [f for f in find([rec]) if f.kind == "resumed_in_place"]
    assert warning.detail[-1] == (
        "every number and finding of this run reads the occurrence written later; by torchrun's logs "
        f"(node0.stderr.log, node1.stderr.log), attempt 1 of node 1 ended as rank 1 (local rank 0, pid 7221) failed: "
        f"{_SHARD4}; attempt 1 of node 0 ended as rank 0 (local rank 0, pid 7220) failed: RuntimeError: Connection "
        "closed by peer [127.0.0.1]:17039"), warning.detail


def test_a_stall_in_a_later_attempt_is_that_attempts_and_the_earlier_failure_is_said_as_earlier():
    """One failure line (attempt 1: rank 1's RuntimeError), then attempt 2 stalled: rank 1 stopped
    (SIGSTOP, no stack to take), rank 0 waiting in its all_reduce. With one failure line and no
    summary the log was read as one attempt whose agent was stopped before its summary, and the
    stall's cause was attempt 1's exception: 'rank 1 crashed ...: RuntimeError: shard 4 of rank 1 is
    truncated (attempt 0) ... — stalled', 'rank 1 failed first (RuntimeError: shard 4 ...)'. The
    workers the harness found running (pids 7906, 7907) are none the log names up to that line: a
    later attempt's."""
    rec = judged_stopped_run(FROZEN_LATER, FROZEN_LATER / "trainer.stderr.log", stalled_s=25.0, stacks_tried=2)
    ev = rec.evidence
    assert ev.rank_failures == {} and ev.exception is None and ev.traceback is False, ev
    assert [(a.attempt, a.rank, a.restarted, a.exception) for a in ev.attempts] == [(1, 1, True, _SHARD4)], ev.attempts
    assert "shard 4" not in rec.reason and "crashed" not in rec.reason, rec.reason
    [stall] = [f for f in find([rec]) if f.title.startswith("stall in")]
    *now, earlier = stall.detail
    assert "shard 4" not in stall.title + " ".join(now), stall
    assert "rank 1" in stall.title and "stopped" in stall.title, stall.title
    assert earlier == ("earlier attempts, each followed by torchrun starting the workers again (trainer.stderr.log): "
                       f"attempt 1 ended as rank 1 (pid 7898) failed: {_SHARD4}"), stall.detail
    assert not [f for f in find([rec]) if f.title.startswith("crash in")]


def test_one_failure_line_and_no_summary_is_a_restart_only_where_something_shows_workers_after_it(tmp_path):
    """Nothing the harness saw (no worker found running, no exit 0) and nothing in the log after the
    failure line: the agent was stopped between its failure line and its summary, and its failure is
    the run's end, as before. The agent signalling a process after that line (as it is stopped itself,
    under Slurm's SIGTERM) ends a later attempt's workers: the first attempt's were ended before it."""
    text = (FROZEN_LATER / "trainer.stderr.log").read_text()
    log = tmp_path / "trainer.stderr.log"
    log.write_text(text)
    assert rank_failures(log)[1].exception == _SHARD4
    assert attempt_ends(log, AgentSeen(first_rank=0))[0].restarted is False
    assert rank_failures(log, seen=AgentSeen(running=frozenset({7897, 7898}))), "attempt 1's own workers"
    assert rank_failures(log, seen=AgentSeen(exit_code=0)) == {}
    log.write_text(text + "W1206 10:04:40.100000 7883 torch/distributed/elastic/agent/server/api.py:753] Received 15 "
                   "death signal, shutting down workers\nW1206 10:04:40.101000 7883 torch/distributed/elastic/"
                   "multiprocessing/api.py:1028] Sending process 7906 closing signal SIGTERM\n")
    assert rank_failures(log) == {} and attempt_ends(log)[0].restarted


def test_a_node_whose_workers_another_nodes_restart_stopped_counts_that_attempt_as_every_node_does():
    """Node 0's agent stopped its healthy worker for node 1's restart with no failure line, so its
    first failure line (attempt 2, the rendezvous's second round) was numbered attempt 1 and said
    beside node 1's attempt 1, as if rank 0 had failed on rank 1's crash in the same attempt:
    'attempt 1 of node 1 ended as rank 1 ... failed: RuntimeError: shard 3 ...; attempt 1 of node 0
    ended as rank 0 (local rank 0, pid 12272) failed: RuntimeError: Read error ...'."""
    rec = judged_stopped_run(PEER_STOPPED, PEER_STOPPED / "node0.stderr.log", stalled_s=45.0, stacks_tried=2)
    ends = [(a.node, a.attempt, a.rank, a.pid, a.for_peer, a.own) for a in rec.evidence.attempts]
    assert sorted(ends) == [(0, 1, 0, 12230, True, False), (0, 2, 0, 12272, False, False),
                            (1, 1, 1, 12231, False, True), (1, 2, 1, 12268, False, True)], ends
    [stall] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert stall.detail[-1] == (
        "earlier attempts, each followed by torchrun starting the workers again (node0.stderr.log, node1.stderr.log): "
        "attempt 1 of node 1 ended as rank 1 (local rank 0, pid 12231) failed: RuntimeError: shard 3 of rank 1 is "
        "truncated (attempt 0); attempt 1 of node 0 ended as its agent stopped rank 0 (local rank 0, pid 12230), "
        "which had not failed, for another node's restart (no restart counted against node 0's --max-restarts); "
        "attempt 2 of node 1 ended as rank 1 (local rank 0, pid 12268) exited with code 1; attempt 2 of node 0 ended "
        "as rank 0 (local rank 0, pid 12272) failed: RuntimeError: Read error [127.0.0.1]:32177: Connection reset by "
        "peer"), stall.detail[-1]


def test_a_failed_attempts_own_workers_signalled_before_its_failure_line_are_no_stop_for_another_node(tmp_path):
    """On a failure the agent signals the workers still running, fewer than it starts, then writes its
    failure line: that attempt failed, whatever a node of several would otherwise read as a stop for a
    peer's restart; signalled as it is told to stop itself, its workers end with it."""
    log = tmp_path / "node0.stderr.log"
    log.write_text(_ended(1, 701, 702, 1) + _SIGNAL.format(i=5) + "Sending process 703 closing signal SIGTERM\n"
                   + _SIGNAL.format(i=5) + "Sending process 704 closing signal SIGTERM\n")
    seen = AgentSeen(first_rank=0, node=0, nproc=2)
    assert [(a.attempt, a.pid, a.for_peer) for a in attempt_ends(log, seen)] == [(1, 702, False), (2, 703, True)]
    told = ("W1206 01:04:19.000000 16491 torch/distributed/elastic/agent/server/api.py:753] Received 15 death "
            "signal, shutting down workers\n")
    log.write_text(_ended(1, 701, 702, 1) + told + _SIGNAL.format(i=9) + "Sending process 703 closing signal SIGTERM\n")
    assert [(a.attempt, a.pid, a.for_peer) for a in attempt_ends(log, seen)] == [(1, 702, False)]


def test_a_nodes_failure_line_before_its_agent_lost_the_rendezvous_is_its_ranks_end():
    """Node 1's agent wrote attempt 3's failure line (rank 1, pid 14261, exit code 1), then went to
    restart and could not reach the store: no worker ran after that line. Read as restarted (three
    failure lines), its last attempt was the rendezvous error alone, rank 1 had no end torchrun
    reported, and the verdict said 'node 1's rank 1 exited 0 early (last heartbeat step 3, stage
    forward) — the other ranks failed without it'."""
    rec = judged_run(STORE_GAVE_UP, "node0.stderr.log", 1)
    f = rec.evidence.rank_failures
    assert (f[1].exit_code, f[1].pid) == (1, 14261) and f[1].unranked.startswith("RuntimeError: Gloo connectFullMesh"), f
    assert (f[0].exit_code, f[0].pid) == (1, 14260), f
    assert "exited 0" not in verdict_line(rec) and rec.reason == "trainer crashed (exit code 1)", verdict_line(rec)
    ends = sorted((a.node, a.attempt, a.pid, a.for_peer, a.restarted) for a in rec.evidence.attempts)
    assert ends == [(0, 1, 14236, False, True), (0, 2, 14255, False, True), (0, 3, 14260, False, False),
                    (1, 1, 14237, False, True), (1, 2, 14254, True, True), (1, 3, 14261, False, False)], ends
    assert not [x for x in find([rec]) if "exited 0" in x.title], [x.title for x in find([rec])]


def test_a_process_of_a_later_attempt_that_wrote_no_heartbeat_is_not_given_its_predecessors():
    """Attempt 2's processes hung before their first heartbeat; the verdict gave each the last
    heartbeat of attempt 1's process of its rank: "node 1's rank 0 stalled in _new_process_group_helper
    (last heartbeat step 3, stage forward)", a step the hung process never reached."""
    rec = judged_stopped_run(HUNG_IN_INIT, HUNG_IN_INIT / "node0.stderr.log", stalled_s=45.0, stacks_tried=2)
    line = verdict_line(rec)
    assert line.startswith(
        "node 1's rank 0 stalled in _new_process_group_helper (no heartbeat of pid 13657; its last heartbeat step 3, "
        "stage forward was pid 13631's, of an earlier attempt); node 0's rank 1 stalled in _new_process_group_helper "
        "(no heartbeat of pid 13656; its last heartbeat step 3, stage forward was pid 13632's, of an earlier "
        "attempt)"), line


def test_the_stall_findings_rank_lines_do_not_give_a_later_attempts_process_its_predecessors_heartbeat():
    """The verdict said whose heartbeat it was, while the stall finding's per-rank lines and the
    nodes finding still read "rank 0: last heartbeat step 3, stage forward" of a process that never
    wrote one."""
    rec = judged_stopped_run(HUNG_IN_INIT, HUNG_IN_INIT / "node0.stderr.log", stalled_s=45.0, stacks_tried=2)
    lines = [line for x in find([rec]) for line in x.detail if "heartbeat" in line]
    assert len(lines) == 4, lines
    assert all("of an earlier attempt" in line for line in lines), lines
    assert any(line.startswith("rank 0: no heartbeat of pid 13657; its last heartbeat step 3, stage forward was "
                               "pid 13631's") for line in lines), lines


def test_restarted_workers_hung_in_init_process_group_get_the_shared_store_advice():
    """torch's rendezvous store shared with the workers left both restarted workers in
    init_process_group under srun; the advice was the generic one for ranks whose steps diverged.
    Without a restart the same stacks get no word of the store."""
    rec = judged_stopped_run(HUNG_IN_INIT, HUNG_IN_INIT / "node0.stderr.log", stalled_s=45.0, stacks_tried=2)
    [advice] = [a for a in recommendations(find([rec])) if "init_process_group" in a]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE: 1" in advice and "restarted workers never met" in advice, advice
    unrestarted = replace(rec, evidence=replace(rec.evidence, attempts=[]))
    assert not [a for a in recommendations(find([unrestarted])) if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in a]


def test_a_heartbeat_of_another_pid_is_the_same_attempts_where_torchrun_restarted_nothing():
    """A trainer may write its heartbeats from a process of its own: without a restart, another pid in
    them says nothing of an earlier attempt."""
    rec = judged_stopped_run(HUNG_IN_INIT, HUNG_IN_INIT / "node0.stderr.log", stalled_s=45.0, stacks_tried=2)
    rec = replace(rec, evidence=replace(rec.evidence, attempts=[]))
    assert verdict_line(rec).startswith(
        "node 1's rank 0 stalled in _new_process_group_helper (last heartbeat step 3, stage forward)"), verdict_line(rec)
