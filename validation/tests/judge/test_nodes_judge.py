"""How the judge reads the nodes of a launch of several nodes, without running anything: ranks
placed on nodes (the launch's own view, else the heartbeats' host or node rank), how late each
node comes, what each agent said, srun's word on each task, and the record's round trip through
the store."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from nsa.contract import CSV_COLUMNS
from validation.contract.files import HaltInfo
from validation.contract.nodes import NodeLaunch, NodesLaunch, read_nodes, write_nodes
from validation.contract.stacks import Frame, StackDump
from validation.contract.torchrun_log import RankFailure, agent_said
from validation.judge.evidence import collect, read_ended, read_train, with_log
from validation.judge.findings import Severity, find, recommendations
from validation.judge.diagnosis.failed import died_first
from validation.judge.findings.headline import culprit_log, verdict_line
from validation.judge.metrics import RunData
from validation.judge.nodes import NodeEvidence, NodesEvidence, node_evidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status, Summary
from validation.judge.verdict import Outcome, verdict
from validation.launch.slurm import task_ends


def _beats(rank: int, node: int, host: str, late: float, steps: int = 6, step_s: float = 0.1) -> list[dict]:
    """A rank's heartbeats of lock-step training: every rank ends each step together; this one
    enters 'forward' ``late`` seconds after the step began."""
    out = []
    for step in range(1, steps + 1):
        t0 = 1000.0 + step * step_s
        out += [{"time": t0, "step": step, "stage": "data", "node": node, "host": host},
                {"time": t0 + late, "step": step, "stage": "forward", "node": node, "host": host},
                {"time": t0 + step_s * 0.95, "step": step, "stage": "step", "node": node, "host": host}]
    return out


def _launch(tmp_path: Path, nodes: list[NodeLaunch], launcher: str = "torchrun") -> None:
    write_nodes(tmp_path, NodesLaunch(launcher, 1, "localhost:29400", "abc", 20.0, nodes))
    for n in nodes:
        (tmp_path / n.stderr).write_text("")


def test_nodes_json_round_trip(tmp_path):
    launch = NodesLaunch("slurm", 4, "n0:20071", "run", 30.0,
                         [NodeLaunch(0, "n0", None, 0, None, 0, {0: 11, 1: 12}), NodeLaunch(1, "n1")], "71", "71.1")
    write_nodes(tmp_path, launch)
    assert read_nodes(tmp_path) == launch and read_nodes(tmp_path / "nowhere") is None


def test_ranks_are_placed_by_host_where_every_node_has_its_own(tmp_path):
    _launch(tmp_path, [NodeLaunch(0, "a"), NodeLaunch(1, "b")], "slurm")
    beats = {0: _beats(0, 1, "b", 0.0), 1: _beats(1, 0, "a", 0.0)}  # rank 0 joined second: node rank 1
    nodes = node_evidence(tmp_path, beats, {})
    assert [n.ranks for n in nodes.nodes] == [[1], [0]]


def test_ranks_are_placed_by_node_rank_on_one_host_and_the_straggler_is_late(tmp_path):
    _launch(tmp_path, [NodeLaunch(0, "vm", group_rank=1), NodeLaunch(1, "vm", group_rank=0)])
    beats = {0: _beats(0, 0, "vm", 0.001), 1: _beats(1, 1, "vm", 0.06)}
    nodes = node_evidence(tmp_path, beats, {0: 0.1, 1: 0.1})
    late = {n.index: (n.ranks, n.lateness_s) for n in nodes.nodes}
    assert late[1][0] == [0] and late[0][0] == [1]
    assert abs(late[0][1] - 0.059) < 1e-6 and late[1][1] == 0.0



def test_a_heartbeat_file_of_a_rank_that_does_not_exist_places_no_rank_on_a_node(tmp_path):
    """Rank 1 of 2 wrote heartbeat_rank5.jsonl (malformed: the point's ERROR names it): the nodes
    finding listed 'rank 5 last heartbeat step ?, stage ?' under node 1, a rank that does not exist."""
    _launch(tmp_path, [NodeLaunch(0, "vm", group_rank=0, ranks={0: 11}), NodeLaunch(1, "vm", group_rank=1, ranks={1: 12})])
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 2}))
    (tmp_path / "training.csv").write_text(",".join(CSV_COLUMNS) + "\n1,2.0,1e-4,100,0.1,1,0.5,1\n")
    for rank, node in ((0, 0), (5, 1)):
        (tmp_path / f"heartbeat_rank{rank}.jsonl").write_text(
            "".join(json.dumps({**b, "rank": min(rank, 1)}) + "\n" for b in _beats(rank, node, "vm", 0.0)))
    run = RunData(tmp_path, world_size=2, exit_code=0)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    assert [e for e in errors if "heartbeat_rank5.jsonl: malformed" in e], errors
    ev = collect(run, tmp_path / "node0.stderr.log", errors)
    assert [n.ranks for n in ev.nodes.nodes] == [[0], [1]]
    assert 5 not in ev.rank_step_time_s and 5 not in ev.last_heartbeat
    rec = _record(ev.nodes, status=Status.ERROR, reason=errors[0], evidence=ev)
    [info] = [f for f in find([rec]) if f.kind == "nodes"]
    assert not any("rank 5" in line for line in info.detail), info.detail

def test_what_an_agent_said_is_its_own_error_not_a_workers(tmp_path):
    log = tmp_path / "node0.stderr.log"
    log.write_text("[rank0]: RuntimeError: boom\nTraceback (most recent call last):\n  File \"x\", line 1\n"
                   "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n"
                   "\n[nsa-validate] no progress for 20s: process tree killed\n")
    assert agent_said(log) == "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    log.write_text("node 1: cannot start\n")
    assert agent_said(log) == "node 1: cannot start"
    log.write_text("")
    assert agent_said(log) is None


def test_srun_says_how_each_task_ended(tmp_path):
    err = tmp_path / "srun.stderr.log"
    err.write_text("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
                   "srun: error: n1: tasks 1-2,4: Exited with exit code 3\nsrun: error: n0: task 0: Killed\n"
                   "srun: error: n9: task 9: something new\n")
    assert task_ends(err) == {0: -9, 1: 3, 2: 3, 4: 3}


def _record(nodes: NodesEvidence, **fields) -> PhaseRecord:
    base = dict(key=PointKey("rb", "cpu", "two"), test_id="rb/cpu/two/default", kind="train", status=Status.PASS,
                reason="", exit_code=0, world_size=2,
                evidence=Evidence(nodes=nodes, rank_step_time_s={0: 0.1, 1: 0.1}))
    return PhaseRecord(**{**base, **fields})


def _nodes(**late) -> NodesEvidence:
    return NodesEvidence("torchrun", "localhost:1", 20.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 0, 3.0, 0, [0], lateness_s=late.get("n0", 0.0)),
        NodeEvidence(1, "node1.stderr.log", "vm", 0, 3.1, 1, [1], lateness_s=late.get("n1", 0.0))], "9", "9.1")


def test_a_late_node_is_a_straggler_and_a_punctual_one_is_not():
    [f] = [f for f in find([_record(_nodes(n1=0.06))]) if f.kind == "straggler"]
    assert f.title == ("straggler node 1 in two [default]: its rank(s) 1 enter each step's stages 60 ms after the "
                       "earliest rank (60% of the 100 ms step); the other nodes wait for it")
    assert not [f for f in find([_record(_nodes(n1=0.02))]) if f.kind == "straggler"]  # below 50 ms: noise
    [info] = [f for f in find([_record(_nodes(n1=0.02))]) if f.kind == "nodes"]
    assert info.title == ("2 nodes in two [default]: torchrun, c10d rendezvous at localhost:1, join timeout 20 s, "
                          "Slurm job 9")


def test_a_single_node_launch_records_no_lateness(tmp_path):
    """A Slurm launch of one node (nodes: 1): its record carried 'lateness_s' (a spread between the
    node's own ranks), a figure a one-node torchrun launch never has; its step time stays."""
    _launch(tmp_path, [NodeLaunch(0, "vm", group_rank=0, ranks={0: 11, 1: 12})], "slurm")
    nodes = node_evidence(tmp_path, {0: _beats(0, 0, "vm", 0.0), 1: _beats(1, 0, "vm", 0.03)}, {0: 0.1, 1: 0.1})
    [node] = nodes.nodes
    assert node.ranks == [0, 1] and node.step_time_s == 0.1 and node.lateness_s is None, node


def test_a_single_node_launch_says_nothing_of_lateness():
    """A Slurm launch of one node (a user pass, 2026-11-27): its line read '5.6 ms behind the
    earliest rank', a spread within the node that says nothing of nodes."""
    one = NodesEvidence("slurm", "vm:1", 20.0, [NodeEvidence(0, "node0.stderr.log", "vm", 0, 3.0, 0, [0, 1],
                                                             step_time_s=0.03, lateness_s=0.0056)], "9", "9.0")
    [info] = [f for f in find([_record(one)]) if f.kind == "nodes"]
    assert "median step 30 ms" in info.detail[0] and "behind the earliest rank" not in info.detail[0], info.detail
    [two] = [f for f in find([_record(_nodes(n1=0.02))]) if f.kind == "nodes"]
    assert "20 ms behind the earliest rank" in two.detail[1], two.detail


def test_a_record_with_nodes_survives_the_store():
    rec = _record(_nodes(n1=0.06), slurm_job_id="9")
    back = PhaseRecord.from_json(json.loads(json.dumps(rec.to_json())), "test")
    assert back.evidence.nodes == rec.evidence.nodes and back.slurm_job_id == "9"
    assert PhaseRecord.from_json(json.loads(json.dumps(_record(None).to_json())), "test").evidence.nodes is None


def test_the_log_a_crash_points_at_is_the_killed_ranks_node_not_the_first_agent_to_exit(tmp_path):
    """After a kill on one node, which agent exits first is a race; the record's stderr is the
    log of the node whose rank failed in its own right (seen flaky before: the first to exit): the
    node its verdict names (headline.culprit_log, which session/runs.py's record reads)."""
    _launch(tmp_path, [NodeLaunch(0, "vm", group_rank=0, ranks={0: 11}), NodeLaunch(1, "vm", group_rank=1, ranks={1: 12})])
    (tmp_path / "node0.stderr.log").write_text(
        "[rank0]: torch.distributed.DistBackendError: Connection closed by peer\n"
        "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 11)\n")
    (tmp_path / "node1.stderr.log").write_text(
        "  rank      : 1 (local_rank: 0)\n  exitcode  : -9 (pid: 12)\nagent of node 1 exits\n")
    run = RunData(tmp_path, world_size=2, exit_code=1)
    run = read_ended(run, tmp_path / "node0.stderr.log").onto(run)  # node 0's agent happened to exit first
    ev = collect(run, tmp_path / "node0.stderr.log", [])
    assert ev.rank_failures[1].signal == "SIGKILL" and not ev.rank_failures[0].own
    rec = _record(ev.nodes, status=Status.FAIL, exit_code=1, evidence=ev)
    assert culprit_log(rec) == "node1.stderr.log"
    shown = with_log(ev, tmp_path / "node1.stderr.log")
    assert shown.stderr_log == "node1.stderr.log" and "agent of node 1 exits" in shown.stderr_tail
    (tmp_path / "node1.stderr.log").write_text("")  # nobody failed in its own right: the first to exit
    run = RunData(tmp_path, world_size=2, exit_code=1)
    run = read_ended(run, tmp_path / "node0.stderr.log").onto(run)
    ev = collect(run, tmp_path / "node0.stderr.log", [])
    assert culprit_log(_record(ev.nodes, status=Status.FAIL, exit_code=1, evidence=ev)) is None
    assert ev.stderr_log == "node0.stderr.log"


def test_the_log_a_departed_ranks_finding_cites_is_its_own_nodes():
    """Rank 1 on node 1 exited 0 early (quit_rank:1@3, native_train.py, two agents x1, 2026-11-28);
    rank 0 on node 0 failed in its collective after it, so no rank failed in its own right and the
    record's stderr is node 0's. The crash finding blamed rank 1 and cited node0.stderr.log; so did
    the finding of a rank that stopped short while the others ran on."""
    nodes = NodesEvidence("torchrun", "localhost:1", 20.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 5.1, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1], state="sleeping")])
    peer = RankFailure(exception="RuntimeError: Read error [127.0.0.1]:14568: Connection reset by peer", exit_code=1)
    ev = Evidence(nodes=nodes, rank_failures={0: peer}, stderr_log="node0.stderr.log",
                  last_heartbeat={0: Beat(3, "forward"), 1: Beat(2, "step")})
    rec = _record(nodes, status=Status.FAIL, exit_code=1, steps=8, evidence=ev)
    [crash] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert crash.kind == "departed" and "rank 1 exited 0 early" in crash.title, crash.title
    assert [d for d in crash.detail if d.startswith("stderr: ")] == [f"stderr: {rec.out_dir}/node1.stderr.log"], \
        crash.detail
    # ranks that shared no collective after it: every agent exited 0, rank 1's heartbeats stop at step 2
    ok = dataclasses.replace(nodes, nodes=[dataclasses.replace(n, exit_code=0, state=None) for n in nodes.nodes])
    ev = Evidence(nodes=ok, stderr_log="node0.stderr.log", last_heartbeat={0: Beat(8, "step"), 1: Beat(2, "step")})
    rec = _record(ok, status=Status.FAIL, steps=8, metrics=Summary(steps_completed=8), evidence=ev)
    [short] = [f for f in find([rec]) if f.kind == "short_rank"]
    assert [d for d in short.detail if d.startswith("stderr: ")] == [f"stderr: {rec.out_dir}/node1.stderr.log"], \
        short.detail


def test_a_hung_node_is_told_from_one_waiting_in_ddps_backward():
    """Under DDP the waiting rank's gradient all-reduce runs inside autograd (no torch/distributed
    frame on its stack): the rank further behind in its step, at forward against backward, is the
    hung one, and only its node is named (seen with nsa.train: both nodes were said to hang)."""
    def stack(func: str, file: str) -> StackDump:
        return StackDump("harness_stacks/x.txt", [Frame(file, 1, func), Frame("nsa/train/loop.py", 298, "forward_backward")])

    for hung, waiting in ((1, 0), (0, 1)):
        ev = Evidence(nodes=_nodes(), stackdumps={hung: stack("FaultInjector.at", "nsa/train/faults.py"),
                                                  waiting: stack("_engine_run_backward", "torch/autograd/graph.py")},
                      last_heartbeat={hung: Beat(3, "forward"), waiting: Beat(3, "backward")})
        rec = _record(ev.nodes, status=Status.FAIL, exit_code=None, stalled_s=16.0, evidence=ev)
        [f] = [f for f in find([rec]) if f.kind == "node_hung"]
        assert f.title == (f"node {hung} hung in two [default] (no progress for 16 s): node {hung}'s rank {hung} in "
                           f"FaultInjector.at (last heartbeat step 3, forward); waiting for it: node {waiting}'s rank "
                           f"{waiting} in _engine_run_backward (last heartbeat step 3, backward)"), f.title


def test_a_stall_of_a_one_node_launch_blames_no_node():
    """A rank hung in a Slurm launch of one node (a user pass under Slurm, 2026-11-27): beside the
    stall finding the report said 'node 0 hung ... waiting for it: node 0's rank 0' and advised that
    'the other nodes waited in them: look at that host', of a run with no other node. A one-node
    torchrun launch says only the stall; a one-node Slurm launch says that, and where its ranks ran."""
    one = NodesEvidence("slurm", "vm:1", 20.0, [NodeEvidence(0, "node0.stderr.log", "vm", 1, None, 0, [0, 1])], "9",
                        "9.1")
    ev = Evidence(nodes=one, stackdumps={1: StackDump("harness_stacks/rank1.txt", [Frame("faults.py", 1, "hang_forever")]),
                                         0: StackDump("harness_stacks/rank0.txt",
                                                      [Frame("torch/distributed/distributed_c10d.py", 1, "all_reduce")])},
                  last_heartbeat={1: Beat(3, "step"), 0: Beat(4, "forward")})
    found = find([_record(one, status=Status.FAIL, exit_code=None, stalled_s=20.0, evidence=ev)])
    assert [f.kind for f in found] == ["stall", "nodes"], [f.title for f in found]
    assert "hung: rank 1 in hang_forever; waiting for it: rank 0 in all_reduce" in found[0].title, found[0].title
    assert not [a for a in recommendations(found) if "other nodes" in a], recommendations(found)


def test_a_step_slurm_ended_is_said_to_be_stopped_by_slurm_not_a_crash():
    """slurmstepd's banner in nodes.json (a scancel from outside, a time limit): the verdict and the
    one critical finding say Slurm stopped the ranks; no crash finding, no advice to fix a traceback."""
    banner = "node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:11:52 DUE TO TIME LIMIT ***"
    one = NodesEvidence("slurm", "vm:1", 20.0, [NodeEvidence(0, "node0.stderr.log", "vm", 1, None, 0, [0, 1])], "14",
                        "14.1", banner)
    ev = Evidence(nodes=one, last_heartbeat={0: Beat(1, "forward"), 1: Beat(1, "forward")})
    rec = _record(one, status=Status.FAIL, exit_code=1, steps=50, evidence=ev)
    assert verdict(Outcome.of_record(rec), []) == (
        Status.FAIL, f"stopped by Slurm, not by the trainer or the harness: {banner} (exit code 1)")
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["slurm_stopped"], [f.title for f in found]
    assert found[0].title == (f"Slurm ended the step in two [default], not the trainer and not the harness: {banner}; the "
                              "ranks were stopped before their first step"), found[0].title
    assert not [a for a in recommendations(found) if "traceback" in a], recommendations(found)
    run = RunData(Path("x"), world_size=2, exit_code=1, slurm_stopped=banner)
    assert verdict(Outcome.of_run("train", run, []), [])[1].startswith("stopped by Slurm, not by the trainer")


def test_a_node_whose_agent_was_killed_is_named():
    """kill -9 of one node's torchrun agent: its worker lives on in its own session and breaks
    later, or finishes while the other agent waits on the store that died with it; no rank failed
    in its own right, and the node whose agent died is the one to name, whichever way it ended."""
    nodes = NodesEvidence("torchrun", "localhost:1", 6.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", -9, 4.1, 1, [1])])
    peer = RankFailure(exception="RuntimeError: Read error [127.0.0.1]:46788: Connection reset by peer")
    for stopped in ({"exit_code": -9, "rank_failures": {1: peer}},
                    {"exit_code": None, "stalled_s": 20.0, "rank_failures": {}}):
        failures = stopped.pop("rank_failures")
        ev = Evidence(nodes=nodes, rank_failures=failures, last_heartbeat={0: Beat(8, "backward"), 1: Beat(8, "backward")})
        rec = _record(nodes, status=Status.FAIL, evidence=ev, **stopped)
        found = find([rec])
        [f] = [f for f in found if f.kind == "agent_killed"]
        assert f.title.startswith("node 1's torchrun agent was killed by SIGKILL in two [default] after 4.1 s "
                                  "(log node1.stderr.log); the other nodes: node 0: rank 0 last heartbeat step 8"), f.title
        # the advice is of a killed agent, not of a rank that 'died first' (a user pass, 2026-11-27: kill -9 of
        # the agent under Slurm was advised as 'A rank on one node died first and the others failed ...')
        assert not [a for a in recommendations(found) if "rank on one node died first" in a], recommendations(found)
        assert [a for a in recommendations(found) if "torchrun agent itself was killed" in a], recommendations(found)


def test_a_node_that_went_down_is_its_killed_agent_not_a_rank_that_exited_0():
    """Node 1's rank SIGKILLed its torchrun agent and then itself at step 4 of 12 (a node going down;
    a user pass): node 0's rank failed in its broken all_reduce, and node 1's dead agent
    reported nothing of its worker. The crash and node findings said 'rank 1 exited 0 early (...)'
    and 'exited 0 (torchrun reports no failure of it)', with the advice of a rank that left early
    (sys.exit): no report of a rank's end under an agent that died is no exit 0."""
    nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 10.0, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", -9, 9.4, 1, [1])])
    peer = RankFailure(exception="RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                                 "[127.0.0.1]:43395", exit_code=1)
    ev = Evidence(nodes=nodes, rank_failures={0: peer},
                  last_heartbeat={0: Beat(4, "backward"), 1: Beat(4, "forward")})
    rec = _record(nodes, status=Status.FAIL, exit_code=-9, steps=12, evidence=ev,
                  reason="node 1's torchrun agent was killed by SIGKILL (exit code -9)")
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["agent_killed"], [f.title for f in found]
    assert not [f for f in found if "exited 0" in f.title + " ".join(f.detail)], [f.title for f in found]
    [f] = [f for f in found if f.kind == "agent_killed"]
    assert ("rank 1 last heartbeat step 4, stage forward, its end not reported (its torchrun agent was killed)"
            in f.detail[1]), f.detail
    assert verdict_line(rec) == "node 1's torchrun agent was killed by SIGKILL (exit code -9)", verdict_line(rec)
    advice = recommendations(found)
    assert [a for a in advice if "the node going down" in a] and not [a for a in advice if "sys.exit" in a], advice


def test_a_killed_agent_whose_ranks_finished_is_the_verdict_not_a_crash_of_the_trainer(tmp_path):
    """kill -9 of node 1's agent while both ranks went on to their last step (its worker in a session of
    its own); node 0's agent then waited on the store gone with it until the harness ended it. The
    verdict said 'trainer crashed (exit code -9)' beside a crash finding advising to read a traceback
    that no rank wrote: it names the killed agent, and the one critical finding is the agent's."""
    _launch(tmp_path, [NodeLaunch(0, "vm", 101, None, None, 0, {0: 111}, state="sleeping"),
                       NodeLaunch(1, "vm", 102, -9, 12.8, 1, {1: 112})])
    (tmp_path / "training.csv").write_text(",".join(CSV_COLUMNS) + "\n"
                                           + "".join(f"{k},2.0,1e-4,100,0.1,1,0.5,1\n" for k in range(1, 13)))
    (tmp_path / "env.json").write_text(json.dumps({"world_size": 2}))
    for rank in (0, 1):
        (tmp_path / f"heartbeat_rank{rank}.jsonl").write_text(
            "".join(json.dumps({**b, "rank": rank}) + "\n" for b in _beats(rank, rank, "vm", 0.0, steps=12)))
    run = RunData(tmp_path, world_size=2, exit_code=-9, steps_requested=12)
    run = read_train(run).onto(run)
    run = read_ended(run, tmp_path / "node0.stderr.log").onto(run)
    assert run.agent_killed == "node 1's torchrun agent was killed by SIGKILL", run.agent_killed
    said = (Status.FAIL, "node 1's torchrun agent was killed by SIGKILL (exit code -9)")
    assert verdict(Outcome.of_run("train", run, []), []) == said
    ev = collect(run, tmp_path / "node0.stderr.log", [])
    rec = _record(ev.nodes, status=Status.FAIL, exit_code=-9, steps=12, evidence=ev)
    assert verdict(Outcome.of_record(rec), []) == said
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["agent_killed"], [f.title for f in found]
    assert not [a for a in recommendations(found) if "no traceback" in a], recommendations(found)
    # stopped by the harness under Slurm, an agent's signal may be the harness's own cancel: not named
    slurm = dataclasses.replace(rec, stalled_s=20.0, evidence=dataclasses.replace(
        ev, nodes=dataclasses.replace(ev.nodes, launcher="slurm")))
    assert Outcome.of_record(slurm).agent_killed is None


def test_a_hung_node_is_named_when_the_trainers_own_watchdog_stopped_the_run():
    """nsa.train's watchdog (watchdog.timeout_s below the phase's stall_s) halts every rank with
    its own stack dumps: the report listed both ranks' stacks and named no node."""
    def stack(func: str, file: str) -> StackDump:
        return StackDump("stackdump_rank1.txt", [Frame(file, 1, func)])

    ev = Evidence(nodes=_nodes(), halt=HaltInfo(source="watchdog"),
                  stackdumps={1: stack("at", "nsa/train/faults.py"), 0: stack("_engine_run_backward",
                                                                                 "torch/autograd/graph.py")},
                  last_heartbeat={1: Beat(3, "forward"), 0: Beat(3, "backward")})
    rec = _record(ev.nodes, status=Status.FAIL, exit_code=1, evidence=ev)
    [f] = [f for f in find([rec]) if f.kind == "node_hung"]
    assert f.title == ("node 1 hung in two [default] (the trainer's watchdog .HALT): node 1's rank 1 in at (last "
                       "heartbeat step 3, forward); waiting for it: node 0's rank 0 in _engine_run_backward (last "
                       "heartbeat step 3, backward)"), f.title


def test_a_rank_killed_before_the_others_watchdog_fired_is_the_one_named():
    """Two nodes over NCCL on two H200s (2026-11-27): rank 1 was SIGKILLed (node 1's agent said so
    at once); rank 0, waiting for it in a CUDA sync (a dead peer breaks no NCCL collective), had its
    watchdog write .HALT 10 s later. The report said 'node 0 hung ... waiting for it: node 1's rank
    1 (no stack)' and 'stall ...: rank 0 in train_step': the rank that waited, blamed."""
    nodes = NodesEvidence("torchrun", "localhost:1", 30.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 20.7, 0, [0]), NodeEvidence(1, "node1.stderr.log", "vm", 1, 0.9, 1, [1])])
    stacks = {0: StackDump("stackdump_rank0.txt", [Frame("nsa/train/loop.py", 349, "train_step")])}
    failures = {1: RankFailure(signal="SIGKILL", exit_code=-9), 0: RankFailure(exit_code=3)}
    beats = {0: Beat(3, "optimizer"), 1: Beat(3, "forward")}
    ev = Evidence(nodes=nodes, halt=HaltInfo(source="watchdog"), stackdumps=stacks, rank_failures=failures,
                  last_heartbeat=beats)
    rec = _record(nodes, status=Status.FAIL, exit_code=1, evidence=ev)
    assert died_first(rec).rank == 1
    titles = [f.title for f in find([rec]) if f.severity == Severity.CRITICAL]
    assert not [t for t in titles if t.startswith(("stall in", "node 0 hung"))], titles
    assert [t for t in titles if t.startswith("node 1's rank 1 was killed by SIGKILL in two [default]")], titles
    assert [t for t in titles if t.startswith("crash in two [default]: exit code 1: rank 1: killed by SIGKILL")], titles
    # the verdict line says the same, from the record (the report) and from the run (the session)
    said = ("trainer crashed: rank 1: killed by SIGKILL; the other ranks' watchdog then wrote .HALT waiting for it "
            "(exit code 1)")
    assert verdict(Outcome.of_record(rec), []) == (Status.FAIL, said)
    run = RunData(Path("x"), world_size=2, exit_code=1, halt=HaltInfo(source="watchdog"), rank_failures=failures)
    assert verdict(Outcome.of_run("train", run, []), []) == (Status.FAIL, said)
    # the harness's own stall kill: its SIGKILLs are no rank's own failure, and the stall stays the finding
    stopped = _record(nodes, status=Status.FAIL, exit_code=None, stalled_s=20.0, evidence=ev)
    assert died_first(stopped) is None
    assert verdict(Outcome.of_record(stopped), [])[1].startswith("stalled: ")
    assert [f for f in find([stopped]) if f.title.startswith("stall in")]


def test_an_agent_the_harness_stopped_after_another_failed_is_said_to_have_been_stopped():
    """A crash (node 0's agent exit 1) whose other agent, left with no rank under it, the harness
    stopped (validation/launch/process.py, a launch over): on this host an agent without an exit
    code is one the harness stopped, not one whose end is not known."""
    nodes = NodesEvidence("torchrun", "localhost:1", 6.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 9.0, 0, [0]), NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])
    rec = _record(nodes, status=Status.FAIL, exit_code=1,
                  evidence=Evidence(nodes=nodes, last_heartbeat={0: Beat(4, "backward"), 1: Beat(4, "data")}))
    lines = "\n".join(f.title + "\n" + "\n".join(f.detail) for f in find([rec]))
    assert "node 1 (host vm, torchrun node rank 1, log node1.stderr.log): rank 1 last heartbeat step 4, stage data; " \
           "agent still running when the harness stopped the run" in lines, lines
    assert "end not known" not in lines, lines


def _unstarted(*nodes: NodeEvidence, **fields) -> PhaseRecord:
    """A two-node record in which no rank ever started (no worker seen, no heartbeat)."""
    ev = NodesEvidence("torchrun", "localhost:1", 6.0, list(nodes))
    return _record(ev, status=Status.FAIL, evidence=Evidence(nodes=ev), **fields)


def test_a_frozen_agent_the_harness_stopped_after_the_other_gave_up_is_named_with_its_state():
    """Node 1's agent was stopped (SIGSTOP) before the rendezvous; node 0 gave up at the join
    timeout, and the harness stopped node 1's agent then (validation/launch/process.py). It is the
    node that never joined, and its advice is not 'read its log' (it wrote none) or 'host down'."""
    gave_up = "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    rec = _unstarted(NodeEvidence(0, "node0.stderr.log", "vm", 1, 7.6, said=gave_up),
                     NodeEvidence(1, "node1.stderr.log", "vm", None, None, state="stopped"), exit_code=1)
    [f] = [f for f in find([rec]) if f.severity == Severity.CRITICAL]
    assert f.kind == "node_stuck", f
    assert f.title == ("node 1 never joined the rendezvous in two [default]: no rank started; the others gave up "
                       "waiting (join timeout 6 s): node 0 after 7.6 s, RendezvousTimeoutError; node 1's agent was "
                       "still running (process state stopped) and had written nothing in its log when the harness "
                       "stopped it"), f.title
    assert ("node 1 never joined: its agent still running (process state stopped) when the harness stopped the run; "
            "log node1.stderr.log (empty)") in f.detail, f.detail
    [advice] = recommendations([f])
    assert "'stopped' is a SIGSTOP" in advice and "host down" not in advice, advice
    # an agent that exited without reaching the rendezvous is the other kind: read its log
    dead = _unstarted(NodeEvidence(0, "node0.stderr.log", "vm", 1, 7.6, said=gave_up),
                      NodeEvidence(1, "node1.stderr.log", "vm", 1, 0.2, said="node 1: cannot start"), exit_code=1)
    [f] = [f for f in find([dead]) if f.severity == Severity.CRITICAL]
    assert f.kind == "node_missing" and "still running" not in f.title, f


def test_a_start_up_stall_of_agents_that_never_met_names_the_stopped_one_or_none():
    """Node 0's agent held the rendezvous's store and was stopped before node 1 came: node 1's
    agent waited on the store, neither gave up, and the start-up allowance ended the run. The
    stall finding said 'no rank was left running to take a stack of' with advice about torchrun's
    exit barrier and 'the rank that ended first', and no finding named a node."""
    stall = dict(exit_code=None, stalled_s=40.0, steps=8)
    rec = _unstarted(NodeEvidence(0, "node0.stderr.log", "vm", None, None, state="stopped"),
                     NodeEvidence(1, "node1.stderr.log", "vm", None, None, state="sleeping"), **stall)
    assert verdict(Outcome.of_record(rec), []) == (
        Status.FAIL, "stalled: no progress for 40s before its first step (start-up); no rank was running to take a "
                     "stack of and the run killed by the harness")
    found = find([rec])
    [node] = [f for f in found if f.kind == "node_stuck"]
    assert node.title == ("node 0 held up the rendezvous in two [default]: its torchrun agent was stopped (process "
                          "state stopped); no rank started in the 40 s before the harness stopped the run (join "
                          "timeout 6 s); node 0: agent still running (process state stopped) when the harness stopped "
                          "the run; node 1: agent still running (process state sleeping) when the harness stopped "
                          "the run"), node.title
    [stalled] = [f for f in found if f.kind == "stall"]
    assert stalled.title.endswith(": no rank started (no worker ran under any node's agent)"), stalled.title
    advice = "\n".join(recommendations(found))
    assert "No rank started before the harness stopped the run" in advice and "exit barrier" not in advice, advice
    assert "'stopped' is a SIGSTOP" in advice, advice
    # both agents waiting alike (none stopped): no node is named, and the finding says so
    alike = _unstarted(NodeEvidence(0, "node0.stderr.log", "vm", None, None, state="sleeping"),
                       NodeEvidence(1, "node1.stderr.log", "vm", None, None, state="sleeping"), **stall)
    [node] = [f for f in find([alike]) if f.kind == "rendezvous_unanswered"]
    assert node.title.startswith("the nodes never completed the rendezvous at localhost:1 in two [default]: no rank "
                                 "started in the 40 s before the harness stopped the run, and no agent gave up on it"), \
        node.title
