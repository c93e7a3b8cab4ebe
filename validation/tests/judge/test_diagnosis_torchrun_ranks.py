"""Who the verdict line blames, judged from torchrun logs as a real two-rank gloo run of a trainer
of one's own left them (trimmed; nothing runs here): a rank that fails before init_process_group
writes no ``[rankN]:`` line and no heartbeat, and torchrun's own summary is all that names it; the
rank that merely waited for it is never the one blamed."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from validation.contract.files import HaltInfo
from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.contract.torchrun_log import RankFailure, rank_failures
from validation.contract.torchrun_log.exceptions import last_exception, raised_in
from validation.contract.torchrun_log.whose import worker_exceptions
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.failed import root_rank
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.judge.verdict import Outcome, process_verdict
from validation.tests.torchrun_summary import Failed, child_failed

_SCRIPT = "/tmp/mine/train.py"
_AGENT_TRACEBACK = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
"""
#: rank 1 raised before init_process_group: its traceback has no [rank1]: prefix
_WORKER_TRACEBACK = """Traceback (most recent call last):
  File "/tmp/mine/train.py", line 35, in <module>
    raise RuntimeError("could not open my dataset shard /data/shard1")
RuntimeError: could not open my dataset shard /data/shard1
"""
#: one node of two ranks: torchrun saw rank 1 fail, then ended rank 0 (waiting in init_process_group)
ONE_NODE = ("*****************************************\nSetting OMP_NUM_THREADS environment variable for each "
            "process to be 1 in default\n*****************************************\n" + _WORKER_TRACEBACK
            + "W1127 19:57:03.266000 1687 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 1692 "
              "closing signal SIGTERM\n"
            + "E1127 19:57:03.274000 1687 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
              "local_rank: 1 (pid: 1693) of binary: /venv/bin/python\n"
            + _AGENT_TRACEBACK
            + child_failed(_SCRIPT, Failed(1, 1693, 1), Failed(0, 1692, -15), time="2026-11-27_19:57:03"))
#: node 1 of a launch of two nodes (one rank each): its rank failed; node 0's rank went on waiting
NODE_1 = (_WORKER_TRACEBACK + "E1127 19:58:54.752000 2483 torch/distributed/elastic/multiprocessing/api.py:1002] "
          "failed (exitcode: 1) local_rank: 0 (pid: 2497) of binary: /venv/bin/python\n"
          + _AGENT_TRACEBACK + child_failed(_SCRIPT, Failed(1, 2497, 1, local_rank=0), time="2026-11-27_19:58:54"))


def _record(ev: Evidence, **fields) -> PhaseRecord:
    base = dict(key=PointKey("mine", "cpu", "preinit"), test_id="mine/cpu/preinit/default", kind="train",
                status=Status.FAIL, reason="trainer ended before its first step (exit code 1)", exit_code=1,
                world_size=2, steps=6, evidence=ev)
    return PhaseRecord(**{**base, **fields})


def test_a_rank_that_failed_before_its_process_group_is_named_from_torchruns_summary(tmp_path: Path):
    log = tmp_path / "trainer.stderr.log"
    log.write_text(ONE_NODE)
    failures = rank_failures(log)
    assert failures[0].signal == "SIGTERM" and failures[1].exit_code == 1 and not failures[1].exception
    rec = _record(Evidence(rank_failures=failures, stderr_log=log.name))
    assert verdict_line(rec) == (
        "rank 1 crashed (no heartbeat written): exit code 1; the log's traceback that names no rank: "
        "RuntimeError: could not open my dataset shard /data/shard1 — trainer ended before its first step "
        "(exit code 1)")
    [crash] = [f for f in find([rec]) if f.kind == "crash"]
    assert crash.title.startswith("crash in preinit [default]: exit code 1: rank 1: exit code 1"), crash.title
    assert any(line.startswith("rank 0: no heartbeat written") and "SIGTERM from torchrun's agent, which ended the "
               "ranks still running once rank 1 had failed" in line for line in crash.detail), crash.detail


#: both ranks' import failed and they printed their tracebacks at the same moment, line by line between
#: each other's (as a two-core machine's run left them)
_INTERLEAVED = """Traceback (most recent call last):
  File "/tmp/mine/train.py", line 3, in <module>
    import a_module_that_is_not_there  # noqa
Traceback (most recent call last):
  File "/tmp/mine/train.py", line 3, in <module>
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'a_module_that_is_not_there'
    import a_module_that_is_not_there  # noqa
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'a_module_that_is_not_there'
"""


def test_tracebacks_two_ranks_printed_at_once_still_name_their_exception(tmp_path: Path):
    """Two ranks' tracebacks, printed at once, interleaved line by line; torchrun saw rank 0 exit 1
    and ended rank 1. The second traceback's header was read as the first one's exception, and the
    lines after it as no worker's: the crash read 'exit code 1: rank 0: exit code 1', its
    ModuleNotFoundError unnamed."""
    log = tmp_path / "trainer.stderr.log"
    log.write_text(_INTERLEAVED
                   + "W1207 14:58:45.630000 5170 torch/distributed/elastic/multiprocessing/api.py:1028] Sending "
                     "process 1693 closing signal SIGTERM\n"
                   + "E1207 14:58:45.634000 5170 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                     "(exitcode: 1) local_rank: 0 (pid: 1692) of binary: /venv/bin/python\n"
                   + _AGENT_TRACEBACK + child_failed(_SCRIPT, Failed(0, 1692, 1), Failed(1, 1693, -15)))
    said = "ModuleNotFoundError: No module named 'a_module_that_is_not_there'"
    assert raised_in(_INTERLEAVED.splitlines()) == [said, said]
    failures = rank_failures(log)
    assert failures[0].unranked == said and failures[1].signal == "SIGTERM", failures
    [crash] = [f for f in find([_record(Evidence(rank_failures=failures, stderr_log=log.name))]) if f.kind == "crash"]
    # both ranks raised it: the log's two tracebacks are said, not one rank's alone
    assert crash.title == ("crash in preinit [default]: exit code 1: rank 0: exit code 1; the log's 2 tracebacks "
                           f"that name no rank, both ending in {said}"), crash.title
    # a traceback cut short (its rank killed as it printed) ends at torchrun's next line, which stays the agent's
    log.write_text(_INTERLEAVED.rsplit("\n", 2)[0] + "\n"
                   + "W1207 14:58:45.630000 5170 torch/distributed/elastic/multiprocessing/api.py:1028] Sending "
                     "process 1693 closing signal SIGTERM\n"
                   + _AGENT_TRACEBACK + child_failed(_SCRIPT, Failed(0, 1692, 1), Failed(1, 1693, -15)))
    failures = rank_failures(log)
    assert failures[0].unranked == said and failures[1].ended_by_agent, failures


#: the same two tracebacks written at one instant, byte by byte into each other's lines (a two-core
#: machine's run left them so): a line of the markers under the source line starts at column 0
_BYTE_INTERLEAVED = """Traceback (most recent call last):
  File "/tmp/mine/train.py", line 3, in <module>
Traceback (most recent call last):
  File "/tmp/mine/train.py", line 3, in <module>
    import a_module_that_is_not_there  # noqa
    ^^^^^^^^^^^^^^    ^import a_module_that_is_not_there  # noqa^
^^^^^^^^^^^^^^^^^
 ModuleNotFoundError  :  No module named 'a_module_that_is_not_there'^
^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'a_module_that_is_not_there'
"""


def test_tracebacks_written_into_each_other_still_name_the_exception_not_their_markers():
    """Both ranks' tracebacks written byte by byte into each other's lines, both ranks exit 1: the crash
    read 'exit code 1: ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^', a line of the markers under the source line
    taken for the exception. Only the line that is whole names it."""
    said = "ModuleNotFoundError: No module named 'a_module_that_is_not_there'"
    assert raised_in(_BYTE_INTERLEAVED.splitlines()) == [said]
    assert last_exception(_BYTE_INTERLEAVED) == said
    assert worker_exceptions(_BYTE_INTERLEAVED) == [said]


def test_the_rank_that_waited_for_a_node_whose_rank_never_started_is_not_the_one_blamed(tmp_path: Path):
    """Two nodes: node 1's rank failed before its process group and its agent exited; node 0's rank
    waited in init_process_group until the harness's start-up allowance ran out. The verdict line
    said "node 0's rank 0 stalled in _new_process_group_helper"."""
    log = tmp_path / "node1.stderr.log"
    log.write_text(NODE_1)
    nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0], state="sleeping"),
        NodeEvidence(1, "node1.stderr.log", "vm", 1, 3.6, 1, [1], said="ChildFailedError")])
    waiting = StackDump("harness_stacks/rank0.txt", [
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2169,
              "_new_process_group_helper"),
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 1899, "init_process_group")],
        None, "py-spy")
    rec = _record(Evidence(rank_failures=rank_failures(log), stackdumps={0: waiting}, nodes=nodes,
                           taken_stacks=[TakenStack(2498, 0, "RANK", "py-spy", "harness_stacks/rank0.txt")],
                           stderr_log=log.name),
                  exit_code=None, stalled_s=40.0,
                  reason="stalled: no progress for 40s before its first step (start-up); stacks taken and the run "
                         "killed by the harness")
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("node 1's rank 1 crashed (no heartbeat written): exit code 1"), verdict_line(rec)
    findings = find([rec])
    [stall] = [f for f in findings if f.title.startswith("stall in")]
    assert ": rank 1 failed first (exit code 1" in stall.title and "waited for it: rank 0 in " in stall.title, stall.title
    assert stall.kind == "crash"  # its advice: read the failed rank's log, not where the ranks' steps diverged
    [node] = [f for f in findings if f.kind == "node_failed"]
    assert node.title.startswith("node 1's rank 1 failed: exit code 1"), node.title


def test_an_exit_code_is_the_failure_only_of_the_one_rank_that_exited_so_and_not_a_contract_stop():
    term = RankFailure(signal="SIGTERM", exit_code=-15)
    assert root_rank({0: term, 1: RankFailure(exit_code=2)}) == 1
    assert root_rank({0: RankFailure(exit_code=1), 1: RankFailure(exit_code=1)}) is None  # nothing tells which
    # a rank that ended as the contract asks with its .HALT: its watchdog's 3, a non-finite loss's 4
    assert root_rank({0: RankFailure(exit_code=3), 1: term}, "watchdog") is None
    assert root_rank({0: RankFailure(exit_code=4), 1: term}, "nonfinite") is None
    assert root_rank({0: RankFailure(exit_code=3), 1: term}) == 0  # no .HALT: a crash like any other code
    # a rank's own exception still comes first
    assert root_rank({0: RankFailure(exit_code=1), 1: RankFailure(exception="ValueError: bad", exit_code=1)}) == 1


def test_a_nan_rank_that_torchrun_then_ended_stopped_on_its_loss_not_by_sigterm():
    """Rank 1's loss went NaN; the trainer wrote the .HALT and rank 0 exited first, so torchrun
    SIGTERMed rank 1: its detail line read 'killed by SIGTERM', as if that had stopped it."""
    ev = Evidence(halt=HaltInfo("nonfinite", 3, [3.85, float("nan")], 1.0),
                  rank_failures={0: RankFailure(exit_code=4), 1: RankFailure(signal="SIGTERM", exit_code=-15)},
                  last_heartbeat={0: Beat(3, "halt"), 1: Beat(3, "halt")})
    rec = _record(ev, exit_code=4, reason="non-finite loss at step 3 (trainer .HALT)")
    assert verdict_line(rec).startswith("rank 1 had a non-finite loss")
    [nan] = [f for f in find([rec]) if f.kind == "nonfinite"]
    [line] = [d for d in nan.detail if d.startswith("rank 1:")]
    assert line == ("rank 1: last heartbeat step 3, stage halt; stopped on its non-finite loss at step 3 (loss nan: "
                    "the trainer's .HALT), then killed by SIGTERM from torchrun's agent, which ends every rank still "
                    "running once one has ended with a failure"), line
    assert [d for d in nan.detail if d.startswith("rank 0:")] == [
        "rank 0: last heartbeat step 3, stage halt; exit code 4 (the contract's code for a non-finite loss)"]


def _judged(rec: PhaseRecord) -> PhaseRecord:
    """The record with the verdict its run's end gives it (as the session's, verdict.process_verdict)."""
    status, reason = process_verdict(Outcome.of_record(rec))
    return replace(rec, status=status, reason=reason)


def test_a_trainer_that_exits_4_with_no_halt_stopped_on_a_nonfinite_loss_and_did_not_crash():
    """Exit code 4 is the contract's code for a trainer that stopped on a non-finite loss. Ranks that
    exited 4 and wrote no .HALT read 'trainer crashed (exit code 1)' with 'exit code 4' on each rank's
    line, and the one process 'rank 0 crashed (...): exit code 4 — trainer crashed (exit code 4)':
    nothing said what 4 means, and the advice sent the reader to a log with no error in it."""
    beats = {0: Beat(3, "halt"), 1: Beat(3, "halt")}
    both = _judged(_record(Evidence(rank_failures={0: RankFailure(exit_code=4), 1: RankFailure(exit_code=4)},
                                    last_heartbeat=beats, stderr_log="trainer.stderr.log")))
    assert both.reason == ("trainer stopped on a non-finite loss, with no .HALT: ranks 0, 1 exited with code 4, the "
                           "contract's code for it (exit code 1)"), both.reason
    assert diagnose(both) is None and verdict_line(both) == both.reason  # every rank did: nothing singles one out
    [nan] = [f for f in find([both]) if f.kind == "nonfinite"]
    assert nan.title.endswith("exit code 1: the trainer stopped on a non-finite loss (exit code 4, the contract's "
                              "code for it, with no .HALT)"), nan.title
    assert "rank 1: last heartbeat step 3, stage halt; exit code 4 (the contract's code for a non-finite loss)" \
        in nan.detail, nan.detail
    [advice] = recommendations([nan])
    assert "stopped on a non-finite loss (the contract's exit code 4) and wrote no .HALT" in advice, advice
    # one rank stopped on it, torchrun then ended the other: that one is named
    one = _judged(_record(Evidence(rank_failures={0: RankFailure(signal="SIGTERM", exit_code=-15),
                                                  1: RankFailure(exit_code=4)}, last_heartbeat=beats)))
    c = diagnose(one)
    assert c is not None and c.kind == Kind.NONFINITE_EXIT and [r.rank for r in c.ranks] == [1], c
    assert verdict_line(one) == ("rank 1 stopped on a non-finite loss (last heartbeat step 3, stage halt): exit code 4, "
                                 "the contract's code for it, with no .HALT — trainer stopped on a non-finite loss, "
                                 "with no .HALT: rank 1 exited with code 4, the contract's code for it (exit code 1)"), \
        verdict_line(one)
    # the one process: the harness saw its 4 itself
    alone = _judged(_record(Evidence(last_heartbeat={0: Beat(3, "halt")}), world_size=1, exit_code=4))
    assert verdict_line(alone).endswith("trainer stopped on a non-finite loss, with no .HALT (exit code 4, the "
                                        "contract's code for it)"), verdict_line(alone)
    assert "crashed" not in verdict_line(alone), verdict_line(alone)
    # a rank that failed in its own right first is the crash, whatever the other's guard saw after it
    raised = _judged(_record(Evidence(rank_failures={0: RankFailure(exception="RuntimeError: boom", exit_code=1),
                                                     1: RankFailure(exit_code=4)}, last_heartbeat=beats)))
    assert raised.reason == "trainer crashed (exit code 1)", raised.reason
    assert verdict_line(raised).startswith("rank 0 crashed"), verdict_line(raised)


def test_a_workers_rankless_lines_are_not_what_its_agent_said(tmp_path: Path):
    """Node 1's worker printed a caught ConnectionError's traceback before its process group, then
    retried forever; the harness stopped the run with node 1's agent still running. The node line
    read "agent still running ... (ConnectionError: shard server ...)": the worker's words as its
    agent's."""
    from validation.contract.nodes import NodeLaunch, NodesLaunch, write_nodes
    from validation.contract.torchrun_log import agent_said
    from validation.judge.nodes import node_evidence

    write_nodes(tmp_path, NodesLaunch("torchrun", 1, "localhost:1", "x", 8.0, [
        NodeLaunch(0, "vm", 11, group_rank=0, ranks={0: 21}, state="sleeping"),
        NodeLaunch(1, "vm", 12, group_rank=1, ranks={1: 22}, state="sleeping")]))
    (tmp_path / "node0.stderr.log").write_text("")
    (tmp_path / "node1.stderr.log").write_text(
        'Traceback (most recent call last):\n  File "/tmp/mine/train.py", line 38, in <module>\n'
        '    raise ConnectionError("shard server /data/shard1 refused the connection")\n'
        "ConnectionError: shard server /data/shard1 refused the connection\nretrying shard download...\n\n"
        "[nsa-validate] no progress for 20s before its first step (startup_s 20): process tree killed\n")
    node1 = node_evidence(tmp_path, {}, {}).nodes[1]
    assert node1.said is None, node1.said
    assert node1.worker_said == "ConnectionError: shard server /data/shard1 refused the connection"
    rec = _record(Evidence(nodes=node_evidence(tmp_path, {}, {})), exit_code=None, stalled_s=20.0)
    line = next(d for f in find([rec]) for d in f.detail if d.startswith("node 1 ("))
    assert "still running (process state sleeping) when the harness stopped the run; a worker's traceback in its " \
           "log, naming no rank: ConnectionError: shard server" in line, line
    # the agent's own words: its traceback through torchrun's code after a worker's, its logging, not [rankN]:
    log = tmp_path / "node1.stderr.log"
    log.write_text(_WORKER_TRACEBACK + "[rank0]: ValueError: a worker's own\n" + _AGENT_TRACEBACK + "torch.distributed."
                   "elastic.rendezvous.api.RendezvousTimeoutError: waited 8 s\n")
    assert agent_said(log, workers_ran=True) == "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: waited 8 s"
    log.write_text(_WORKER_TRACEBACK + "W1127 19:57:03.266000 1687 torch/distributed/elastic/multiprocessing/api.py:"
                   "1028] Sending process 1692 closing signal SIGTERM\n")
    assert agent_said(log, workers_ran=True) == "Sending process 1692 closing signal SIGTERM"
    # an agent whose workers never started (nothing of a worker in its log) said its last line itself
    log.write_text("/venv/bin/python: No module named torch.distributed.run\n")
    assert agent_said(log) == "/venv/bin/python: No module named torch.distributed.run"


def _frozen(nodes: NodesEvidence | None = None) -> PhaseRecord:
    """Rank 1 SIGSTOPped itself at step 3 (no stack: py-spy cannot read a stopped process, its own
    handler cannot run); rank 0 waits for it in all_gather, as a two-rank gloo run left it."""
    ev = Evidence(stackdumps={0: StackDump("harness_stacks/rank0.txt", [
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4287, "all_gather")],
        None, "py-spy")},
        taken_stacks=[TakenStack(11, 0, "RANK", "py-spy", "harness_stacks/rank0.txt", state="sleeping"),
                      TakenStack(12, 1, "RANK", "none", state="stopped", note="py-spy could not take its stack")],
        last_heartbeat={0: Beat(3, "forward"), 1: Beat(3, "forward")}, nodes=nodes)
    return _record(ev, exit_code=None, stalled_s=15.0, reason="stalled: no progress for 15s after step 2")


def test_a_frozen_ranks_advice_speaks_of_a_stopped_process_not_of_diverged_steps():
    """The stall advice of a rank frozen by SIGSTOP said 'a rank inside a collective while another is
    elsewhere means the ranks' steps diverged', and of its node 'its stack (harness_stacks/) shows
    where', of a rank that has no stack."""
    rec = _frozen()
    assert verdict_line(rec).startswith("rank 1 hung (stopped, no stack; last heartbeat step 3, stage forward)")
    [advice] = recommendations([f for f in find([rec]) if f.kind == "stall"])
    assert "process was stopped" in advice and "SIGSTOP" in advice and "debugger" in advice and "cgroup" in advice
    assert "diverged" not in advice.replace("not on steps that diverged", ""), advice
    nodes = NodesEvidence("torchrun", "localhost:1", 8.0, [NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
                                                           NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])
    [node] = [f for f in find([_frozen(nodes)]) if f.kind.startswith("node_")]
    assert node.kind == "node_frozen" and "node 1's rank 1 (stopped, no stack" in node.title, (node.kind, node.title)
    [advice] = recommendations([node])
    assert "stopped process" in advice and "harness_stacks" not in advice, advice


def test_a_rank_that_exits_non_zero_in_its_final_checkpoint_is_named_not_its_peers_broken_collective():
    """All 6 steps done; rank 1 then exited 1 (printing no traceback) while saving its checkpoint, and
    rank 0's final barrier broke ('Connection closed by peer'). The crash finding's title was rank 0's
    exception, and the verdict line named no rank."""
    peer = RankFailure(exception="RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                                 "[127.0.0.1]:1956", exit_code=1)
    ev = Evidence(rank_failures={0: peer, 1: RankFailure(exit_code=1)},
                  last_heartbeat={0: Beat(6, "step"), 1: Beat(6, "checkpoint")})
    rec = _record(ev, reason="trainer crashed (exit code 1)")
    assert verdict_line(rec) == ("rank 1 crashed (last heartbeat step 6, stage checkpoint): exit code 1 — trainer "
                                 "crashed (exit code 1)")
    [advice] = recommendations([f for f in find([rec]) if f.kind == "crash"])
    assert advice.startswith("preinit: Rank 1 exited with code 1 and no traceback of its own in torchrun's log after its last "
                             "heartbeat (step 6, stage checkpoint)"), advice


def _lockstep(rank: int, late: float, steps: int = 6, step_s: float = 0.35) -> list[dict]:
    """A rank's heartbeats of lock-step training on one node: every rank starts and ends each step
    together (the others wait for the slowest in the collective); this one enters 'backward' ``late``
    seconds after the step began."""
    out = []
    for step in range(1, steps + 1):
        t0 = 1000.0 + step * step_s
        out += [{"time": t0, "step": step, "stage": "forward", "rank": rank},
                {"time": t0 + 0.01 + late, "step": step, "stage": "backward", "rank": rank},
                {"time": t0 + step_s * 0.99, "step": step, "stage": "step", "rank": rank}]
    return out


def _offset(rank: int, late: float, stages: tuple[str, ...] = ("forward", "step"), steps: int = 6,
            step_s: float = 0.35) -> list[dict]:
    """A rank's heartbeats of ranks that share no collective: each runs its own steps at the same
    pace, this one ``late`` seconds behind at every stage (it started later)."""
    return [{"time": 1000.0 + step * step_s + late + 0.2 * i, "step": step, "stage": stage, "rank": rank}
            for step in range(1, steps + 1) for i, stage in enumerate(stages)]


def test_a_rank_that_runs_behind_at_every_stage_is_not_said_to_be_waited_for(tmp_path: Path):
    """A user's trainer ran no collective; its rank 0 came 67 ms late to every stage (forward and
    step) and the warning said 'the other ranks wait for it in their collectives'. Late at every stage
    alike, it only runs behind (information); with one stage a step the heartbeats cannot tell."""
    from validation.judge.evidence import collect
    from validation.judge.metrics import RunData

    run = RunData(tmp_path, world_size=2, exit_code=0)
    run.heartbeats = {0: _offset(0, 0.0), 1: _offset(1, 0.3)}
    rec = _record(collect(run, tmp_path / "trainer.stderr.log", []), status=Status.PASS, exit_code=0)
    [f] = [f for f in find([rec]) if f.kind == "straggler_rank"]
    assert f.severity == "info" and f.title.endswith(
        "(86% of the 350 ms step); it is as late at every stage it reports (at least 300 ms): it runs that far behind "
        "the other ranks at their pace, and nothing in the heartbeats shows them waiting for it (ranks that meet in a "
        "collective each step leave it together)"), f.title
    assert "wait for it in their collectives" not in f.title and recommendations([f]) == []
    run.heartbeats = {0: _offset(0, 0.0, ("step",)), 1: _offset(1, 0.3, ("step",))}
    rec = _record(collect(run, tmp_path / "trainer.stderr.log", []), status=Status.PASS, exit_code=0)
    [f] = [f for f in find([rec]) if f.kind == "straggler_rank"]
    assert f.severity == "warning" and f.title.endswith(
        "; where the ranks meet in a collective each step (DDP's gradient all-reduce), the others wait for it there "
        "and the run goes at its pace; its heartbeats as recorded do not show whether they do (that takes two stages "
        "of each step that every rank reports)"), f.title


def test_a_straggler_rank_of_one_node_is_named(tmp_path: Path):
    """Rank 1 spent 0.3 s more on each step's compute; rank 0 waited for it in the collective. Every
    rank's step time was the same, so no imbalance was found and the run PASSed with no word of the
    rank that set its pace."""
    from validation.judge.evidence import collect
    from validation.judge.metrics import RunData

    run = RunData(tmp_path, world_size=2, exit_code=0)
    run.heartbeats = {0: _lockstep(0, 0.0), 1: _lockstep(1, 0.3)}
    ev = collect(run, tmp_path / "trainer.stderr.log", [])
    assert ev.rank_lateness_s[0] == 0.0 and abs(ev.rank_lateness_s[1] - 0.3) < 1e-6, ev.rank_lateness_s
    rec = _record(ev, status=Status.PASS, exit_code=0, reason="completed (no gates)")
    [f] = [f for f in find([rec]) if f.kind == "straggler_rank"]
    assert f.severity == "warning" and f.title == (
        "straggler rank 1 in preinit [default]: it enters each step's stages 300 ms after the earliest rank (86% of "
        "the 350 ms step); it comes with them to another stage of each step (0 ms after the earliest), so they wait "
        "for it there, in a collective, and every rank's step time is the same: the run goes at its pace"), f.title
    [advice] = recommendations([f])
    assert "One rank comes late to every step; where the others wait for it" in advice, advice
    # ranks that come together (jitter under the bar) make no straggler
    run.heartbeats = {0: _lockstep(0, 0.0), 1: _lockstep(1, 0.02)}
    rec = _record(collect(run, tmp_path / "trainer.stderr.log", []), status=Status.PASS, exit_code=0)
    assert not [f for f in find([rec]) if f.kind == "straggler_rank"]


def test_a_rank_that_exited_0_before_its_process_group_is_named_not_the_rank_that_waited_for_it():
    """Rank 1 returned (exit 0) before init_process_group; rank 0 waited there until the start-up
    allowance ran out. The verdict line said 'rank 0 stalled in _new_process_group_helper', and the
    report did not mention rank 1 at all (no heartbeat, no failure in torchrun's log)."""
    def rec(frame: Frame, nodes: NodesEvidence | None = None) -> PhaseRecord:
        ev = Evidence(stackdumps={0: StackDump("harness_stacks/rank0.txt", [frame], None, "py-spy")}, nodes=nodes,
                      taken_stacks=[TakenStack(21, 0, "RANK", "py-spy", "harness_stacks/rank0.txt")])
        return _record(ev, exit_code=None, stalled_s=20.0, reason="stalled: no progress for 20s before its first step")

    init = Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2169,
                 "_new_process_group_helper")
    assert verdict_line(rec(init)).startswith("rank 1 exited 0 early (no heartbeat written) — stalled"), \
        verdict_line(rec(init))
    [stall] = [f for f in find([rec(init)]) if f.title.startswith("stall in")]
    assert "rank 1: no heartbeat written (no heartbeat_rank1.jsonl); no process left to take a stack of: it had ended " \
           "(exited 0)" in stall.detail, stall.detail
    # rank 0 busy in code of its own: nothing says it waited for rank 1
    assert diagnose(rec(Frame("/tmp/mine/train.py", 40, "load_shard"))).ranks[0].rank == 0
    # srun's nodes on other hosts: the harness sees no process there, which says nothing of how rank 1 ended
    slurm = NodesEvidence("slurm", "n0:1", 8.0, [NodeEvidence(0, "node0.stderr.log", "n0", None, None, 0, [0]),
                                                 NodeEvidence(1, "node1.stderr.log", "n1", None, None, 1, [1])])
    assert diagnose(rec(init, slurm)).kind != Kind.LEFT


def test_a_trainers_one_line_error_is_the_exception_where_no_traceback_says_one():
    """A trainer that reports a failure of the machine in one line (nsa.train on a full disk:
    '[rank 0] error at the checkpoint of step 2: cannot write checkpoint ...: No space left on
    device') gave the crash finding no cause ('crash in train1: exit code 1'): only a traceback or
    a line beginning with an exception's name was read. A traceback still wins over such a line;
    torchrun's own 'error_file:' lines are no error."""
    from validation.contract.torchrun_log import last_exception

    said = ("error at the checkpoint of step 2: cannot write checkpoint /r/checkpoints/step_0000002.pt: No space "
            "left on device; no checkpoint was saved before it")
    assert last_exception(f"step 1/6 | loss 5.6\n[rank 0] {said}\n") == said
    assert last_exception("Error: CUDA driver too old\n") == "Error: CUDA driver too old"
    assert last_exception("  error_file: <N/A>\n[rank 0] errors logged: 0\n") is None
    # argparse's refusal, after its usage line (a user's pass: the finding said only 'exit code 2')
    assert last_exception("usage: train.py [-h] [--steps STEPS]\ntrain.py: error: unrecognized arguments: --bogus 1\n") \
        == "train.py: error: unrecognized arguments: --bogus 1"
    assert last_exception(f"[rank 0] {said}\nTraceback (most recent call last):\n  File \"t.py\", line 1\n"
                          "OSError: [Errno 28] No space left on device\n") == "OSError: [Errno 28] No space left on device"


#: a Hugging Face Trainer's rank 0 aborted at the interpreter's exit after its last step (gloo)
ABORTED_AT_EXIT = child_failed(_SCRIPT, Failed(0, 6992, -6), time="2026-11-27_19:57:03")


def test_a_rank_of_a_trainer_whose_format_has_no_heartbeats_is_not_said_to_have_written_none(tmp_path: Path):
    """A format without heartbeats (an adapter's: a Hugging Face Trainer writes none) leaves
    nothing to say of where a rank was: its crash line gives no '(no heartbeat written)', which
    reads as a rank that never started, and the finding says what the adapter said."""
    log = tmp_path / "trainer.stderr.log"
    log.write_text("terminate called without an active exception\n" + ABORTED_AT_EXIT)
    failures = rank_failures(log)
    assert failures[0].signal == "SIGABRT"
    fields = dict(reason="trainer crashed (exit code 1)", steps=12)
    native = _record(Evidence(rank_failures=failures, stderr_log=log.name), **fields)
    assert verdict_line(native).startswith("rank 0 crashed (no heartbeat written): aborted itself (SIGABRT after "
                                           "'terminate called without an active exception')"), \
        verdict_line(native)
    said = "a Trainer writes no per-rank records"
    adapted = _record(Evidence(rank_failures=failures, stderr_log=log.name, no_heartbeats=said), **fields)
    assert verdict_line(adapted).startswith("rank 0 crashed: aborted itself (SIGABRT"), verdict_line(adapted)
    text = " ".join(" ".join([f.title, *f.detail]) for f in find([adapted]))
    assert "no heartbeat written" not in text and f"no heartbeats ({said})" in text, text
    stored = PhaseRecord.from_json(adapted.to_json(), "test")
    assert stored.evidence.no_heartbeats == said
