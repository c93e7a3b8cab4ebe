"""A rank that exited 0 early is named only where the evidence says so (judge/findings/departed.py):
torchrun listed the others' failures and not it, or the harness found no process of it when it
stopped the run while another rank ran or had failed; never a rank that finished its steps, never
beside a process of unknown rank, never when a rank failed in its own right."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd

from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.contract.torchrun_log import RankFailure
from validation.judge.evidence import collect, read_train
from validation.judge.findings import Severity, find, recommendations
from validation.judge.diagnosis.left import departed
from validation.judge.findings.departed import departure
from validation.judge.findings.headline import culprit_log, verdict_line
from validation.judge.metrics import RunData
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.judge.verdict import Outcome, verdict
from validation.tests.torchrun_summary import Failed, child_failed

PEER = RankFailure(exception="RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1", exit_code=1)


def _record(failures: dict[int, RankFailure], beats: dict[int, int | Beat], *, stalled: bool = False,
            taken: tuple[TakenStack, ...] = ()) -> PhaseRecord:
    """A record of 8 steps asked for; a rank's last heartbeat is ``Beat(step, "forward")`` where
    ``beats`` gives a step alone (a stage record: that step in progress)."""
    ev = Evidence(rank_failures=failures, taken_stacks=list(taken),
                  last_heartbeat={k: b if isinstance(b, Beat) else Beat(b, "forward") for k, b in beats.items()})
    return PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL, "x", steps=8,
                       world_size=2, exit_code=None if stalled else 1, stalled_s=10.0 if stalled else None,
                       evidence=ev)


def _taken(rank: int | None, pid: int = 7) -> TakenStack:
    return TakenStack(pid, rank, "RANK" if rank is not None else "", "py-spy")


def test_a_rank_torchrun_lists_no_failure_of_beside_a_peers_broken_collective_left_early():
    rec = _record({0: PEER}, {0: 3, 1: 2})
    assert departed(rec) == [1]
    assert departure(rec, [1]) == "rank 1 exited 0 early (last heartbeat step 2 of 8, stage forward)"


def test_a_rank_that_left_early_is_no_crash_in_the_verdict_line_or_the_finding():
    """Rank 1 exited 0 after step 2 and rank 0's collective broke without it: the verdict line read
    'rank 1 exited 0 early (...) — trainer crashed (exit code 1)' and the finding 'crash in ddp
    [default]', though no process crashed. Both say what happened, the finding still critical."""
    rec = dataclasses.replace(_record({0: PEER}, {0: 3, 1: Beat(2, "step")}), reason="trainer crashed (exit code 1)")
    assert verdict_line(rec) == ("rank 1 exited 0 early (last heartbeat step 2, stage step) — the other ranks failed "
                                 "without it (exit code 1)")
    [left] = [f for f in find([rec]) if f.kind == "departed"]
    assert left.severity == Severity.CRITICAL
    assert left.title == ("early exit in ddp [default]: exit code 1: rank 1 exited 0 early (last heartbeat step 2 of 8, "
                          "stage step); the other ranks failed without it"), left.title
    assert not [f for f in find([rec]) if "crash" in f.title]


def test_no_rank_left_early_where_a_rank_failed_in_its_own_right_or_torchrun_stopped_each():
    assert departed(_record({1: RankFailure(exception="ValueError: bad batch")}, {0: 3, 1: 3})) == []
    assert departed(_record({0: PEER, 1: RankFailure(signal="SIGTERM", exit_code=-15)}, {0: 3, 1: 3})) == []


def test_a_stopped_run_names_the_rank_it_found_no_process_of():
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0),))) == [1]
    assert departed(_record({0: PEER}, {0: 3, 1: 2}, stalled=True)) == [1]  # its peer failed, then nothing ran


def test_a_rank_that_finished_its_steps_or_may_be_a_process_of_unknown_rank_did_not_leave_early():
    # rank 1 logged its last step (a 'step' record of step 8: completed) and exited; rank 0 hung after
    assert departed(_record({}, {0: 8, 1: Beat(8, "step")}, stalled=True, taken=(_taken(0),))) == []
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0), _taken(None, 9)))) == []
    assert departed(_record({}, {0: 3, 1: 2}, stalled=True)) == []  # nothing ran and nothing failed: no contrast


def test_a_stall_says_the_last_step_a_rank_completed_where_the_csv_lags(tmp_path):
    """A trainer that logs its CSV every 5 steps, rank 0 hung in step 8 (a user pass, 2026-11-27):
    the verdict said 'after step 5', the CSV's last row, while the finding said 'last heartbeat
    step 8, stage forward'. Step 7 was done."""
    def beats(last_stage: str) -> list[dict]:
        recs = [{"time": s, "step": s, "stage": st} for s in range(1, 8) for st in ("forward", "step")]
        return recs + [{"time": 8, "step": 8, "stage": last_stage}]

    run = RunData(tmp_path, world_size=2, stalled_s=8.0, steps_requested=12,
                  heartbeats={0: beats("forward"), 1: beats("backward")},
                  csv=pd.DataFrame({"step": [5], "loss": [2.0]}))
    said = "stalled: no progress for 8s after step 7; stacks taken and the run killed by the harness"
    assert verdict(Outcome.of_run("train", run, []), []) == (Status.FAIL, said)
    rec = _record({}, {0: Beat(8, "forward"), 1: Beat(8, "backward")}, stalled=True, taken=(_taken(0),))
    assert Outcome.of_record(rec).last_step_done == 7
    # a record written once a step is done counts that step; the CSV decides where it is further
    assert Outcome.of_record(_record({}, {0: Beat(8, "step")}, stalled=True)).last_step_done == 8
    run.csv = pd.DataFrame({"step": [5, 9], "loss": [2.0, 1.9]})
    assert "after step 9;" in verdict(Outcome.of_run("train", run, []), [])[1]


def test_a_stall_with_no_rank_left_running_does_not_say_stacks_were_taken():
    """Node 1's rank exited 0 and node 0's failed after it; node 1's agent waited at torchrun's
    exit barrier until the stall watch stopped the run: no rank's stack to take, and the verdict
    had said 'stacks taken'."""
    gone = Outcome("train", stalled_s=16.0, steps_requested=8, steps_completed=3, stacks_tried=0)
    assert verdict(gone, []) == (Status.FAIL, "stalled: no progress for 16s after step 3; no rank was left running "
                                              "to take a stack of and the run killed by the harness")
    hung = Outcome("train", stalled_s=16.0, steps_requested=8, steps_completed=3, stacks_tried=2)
    assert "; stacks taken and the run killed by the harness" in verdict(hung, [])[1]
    rec = _record({0: PEER}, {0: 3, 1: 2}, stalled=True)
    assert Outcome.of_record(rec).stacks_tried == 0
    assert Outcome.of_record(_record({}, {0: 3, 1: 2}, stalled=True, taken=(_taken(0),))).stacks_tried == 1


def test_a_rank_that_left_inside_the_last_step_left_early():
    """A stage record's step is the step in progress (nsa/contract.py HEARTBEAT_STAGES_IN_STEP): a
    rank whose last heartbeat is 'data' of step 8 of 8 started the last step and never completed
    it. It had been passed over (its step 8 is not below the 8 asked for), and the crash that
    followed was headed by torchrun's ChildFailedError and rank 0's 'Connection closed by peer'."""
    crashed = _record({0: PEER}, {0: Beat(8, "backward"), 1: Beat(8, "data")})
    assert departed(crashed) == [1]
    assert departure(crashed, [1]) == ("rank 1 exited 0 early (last heartbeat step 8 of 8, stage data: "
                                       "step 8 not completed)")
    for stage in ("data", "forward", "backward", "optimizer", "graph"):
        stalled = _record({}, {0: 8, 1: Beat(8, stage)}, stalled=True, taken=(_taken(0),))
        assert departed(stalled) == [1], stage


def test_a_rank_whose_last_heartbeat_may_say_it_completed_the_last_step_is_never_named():
    """A record written once a step is done (step, checkpoint, profile), a stage the contract does
    not name, or none: step 8 of 8 may be complete, so the rank is not named whatever the others
    did (a false 'exited 0 early' blames a rank that did its work)."""
    for beat in (Beat(8, "step"), Beat(8, "checkpoint"), Beat(8, "profile"), Beat(8, "train_step"), Beat(8, None),
                 Beat(9, "data")):
        assert departed(_record({}, {0: 8, 1: beat}, stalled=True, taken=(_taken(0),))) == [], beat
        assert departed(_record({0: PEER}, {0: 8, 1: beat})) == [], beat


def test_a_rank_whose_records_say_no_steps_end_is_named_only_where_a_peer_had_not_completed_the_last_step():
    """The seed's format: every rank beats as a step starts ('data' through the seed adapter), and
    only rank 0 writes a record once a logged step is done, so rank 1's last record, the start of
    step 8 of 8, cannot say whether it completed it. It had been passed over whatever the others
    did (the stall was headed 'rank 0 in wait_for_peers', naming no rank that left). It is named
    where rank 0's own records say rank 0 had not completed step 8 (rank 1 left while still
    needed), and never where rank 0 had (rank 1 may have done all its work; rank 0 hung after)."""
    started = Beat(8, "data", ends_steps=False)
    stalled = _record({}, {0: Beat(8, "data"), 1: started}, stalled=True, taken=(_taken(0),))
    assert departed(stalled) == [1]
    assert departure(stalled, [1]) == ("rank 1 exited 0 early (last heartbeat step 8 of 8, stage data: step 8 "
                                       "started; its heartbeats record no step's end, and rank 0 had not completed "
                                       "step 8)")
    assert departed(_record({0: PEER}, {0: Beat(8, "backward"), 1: started})) == [1]
    # rank 0 completed step 8 (its step record), or its records cannot say either: nothing tells
    for done in (Beat(8, "step"), Beat(8, None), Beat(8, "train_step"), Beat(8, "data", ends_steps=False)):
        assert departed(_record({}, {0: done, 1: started}, stalled=True, taken=(_taken(0),))) == [], done
        assert departed(_record({0: PEER}, {0: done, 1: started})) == [], done
    # a step before the last is left early whatever the rank's records say of steps' ends
    assert departed(_record({}, {0: Beat(8, "step"), 1: Beat(3, "data", ends_steps=False)}, stalled=True,
                            taken=(_taken(0),))) == [1]


def test_the_seed_adapter_gives_a_steps_own_records_the_contracts_stages(tmp_path):
    """The seed's 'beat' (phase step_start) is written as a step starts: stage data, the step in
    progress; its 'progress' and 'step_end' once a logged step is done: stage step. Its own words
    stay in msg and phase; records of no step keep theirs. The evidence says which ranks' records
    mark a step's end at all (rank 0's; rank 1 only beats)."""
    src = tmp_path / "seed"
    src.mkdir()
    (src / "training.csv").write_text("1,5.0,1e-4,100\n")
    (src / "env.json").write_text(json.dumps({"env": {"WORLD_SIZE": "2"}}))

    def beat(rank: int, step: int, msg: str, **extra) -> str:
        return json.dumps({"ts": 1000.0 + step, "pid": 10 + rank, "rank": rank, "step": step, "msg": msg, **extra}) + "\n"

    (src / "heartbeat_rank0.jsonl").write_text(
        beat(0, 0, "boot", phase="start") + beat(0, 1, "beat", phase="step_start") + beat(0, 1, "progress")
        + beat(0, 1, "step_end", phase="end") + beat(0, 2, "beat", phase="step_start"))
    (src / "heartbeat_rank1.jsonl").write_text(
        beat(1, 0, "boot", phase="start") + beat(1, 1, "beat", phase="step_start") + beat(1, 2, "beat", phase="step_start"))
    out = tmp_path / "out"
    ADAPTERS["seed"].convert(src, out, RunFacts(2, "seed"))
    recs = [json.loads(ln) for ln in (out / "heartbeat_rank0.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["msg"]) for r in recs] == [("start", "boot"), ("data", "beat"), ("step", "progress"),
                                                      ("step", "step_end"), ("data", "beat")]
    assert recs[1]["phase"] == "step_start"
    run = RunData(out, world_size=2, exit_code=None, stalled_s=5.0)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    assert not errors, errors
    beats = collect(run, tmp_path / "none.log", errors).last_heartbeat
    assert beats == {0: Beat(2, "data", ends_steps=True, every=1, pid=10),
                     1: Beat(2, "data", ends_steps=False, every=1, pid=11)}


def test_a_crash_after_a_rank_exited_0_having_done_its_steps_says_so_not_torchruns_child_failed_error():
    """Rank 1 logged its last step (a 'step' record of step 8 of 8) and exited 0 without the final
    barrier; rank 0 failed in that barrier ('Connection reset by peer', a peer's failure). Rank 1
    did not leave early and is not called so, but the crash was headed by torchrun's own line,
    'torch.distributed.elastic.multiprocessing.errors.ChildFailedError:', naming neither rank."""
    tail = "raise ChildFailedError(\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\n"
    rec = _record({0: PEER}, {0: Beat(8, "step"), 1: Beat(8, "step")})
    rec = dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, stderr_tail=tail))
    assert departed(rec) == []
    [crash] = [f for f in find([rec]) if f.kind == "left_after"]
    assert crash.title == ("exit before the others in ddp [default]: exit code 1: rank 1 exited 0 (last heartbeat step 8 "
                           "of 8, stage step), "
                           "and the other ranks failed without it: rank 0: RuntimeError: Connection closed by peer "
                           "[127.0.0.1]:1"), crash.title
    assert "rank 1: last heartbeat step 8, stage step; exited 0 (torchrun reports no failure of it)" in crash.detail
    [advice] = recommendations([crash])
    assert "same collectives after the training loop" in advice and "traceback" not in advice, advice


def _hung_after_the_last_step(rank1_ended: RankFailure | None = None, rank1_dump: StackDump | None = None,
                              nodes: NodesEvidence | None = None) -> PhaseRecord:
    """Two ranks stepped to 8 of 8; rank 0 then hung (the harness took its stack) while rank 1 ended:
    with exit 0 (``rank1_ended`` None) or a failure of its own."""
    rec = _record({1: rank1_ended} if rank1_ended else {}, {0: Beat(8, "step"), 1: Beat(8, "step")}, stalled=True,
                  taken=(_taken(0),))
    dumps = {0: StackDump("harness_stacks/rank0.txt", [Frame("trainer.py", 44, "save")], None, "py-spy")}
    if rank1_dump is not None:
        dumps[1] = rank1_dump
    return dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, stackdumps=dumps, nodes=nodes))


def _two_nodes() -> NodesEvidence:
    return NodesEvidence("torchrun", "localhost:1", 6.0, [NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
                                                          NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])


def test_a_rank_that_did_its_steps_and_exited_0_is_said_to_have_ended_not_to_lack_a_stack():
    """Rank 1 completed all 8 steps and exited 0; rank 0 hung after them. The stall finding said
    'rank 1: ...; no stack dump' and the nodes finding had rank 1 'waiting for it' (no stack)."""
    [stall] = [f for f in find([_hung_after_the_last_step(nodes=_two_nodes())]) if f.kind == "stall"]
    assert ("rank 1: last heartbeat step 8, stage step; no process left to take a stack of: it had ended (exited 0)"
            in stall.detail), stall.detail
    # nothing waited for it: the other node's rank had ended
    [hung] = [f for f in find([_hung_after_the_last_step(nodes=_two_nodes())]) if f.kind == "node_hung_alone"]
    assert hung.title == ("node 0 hung in ddp [default] (no progress for 10 s): node 0's rank 0 in save (last heartbeat "
                          "step 8, step); already ended: node 1's rank 1 (exited 0)"), hung.title
    assert "node 1 (host vm, torchrun node rank 1, log node1.stderr.log): rank 1 last heartbeat step 8, stage step, " \
           "exited 0;" in hung.detail[1], hung.detail


#: rank 1's own failure, while rank 0 hung in a place that broke no collective
CRASHED = RankFailure(exception="RuntimeError: injected crash on rank 1", exit_code=1)


def test_an_empty_stack_dump_file_is_no_stack_of_the_rank():
    """A trainer that opens stackdump_rank{R}.txt for faulthandler at start leaves it empty where the
    rank never dumped: rank 1, which had failed, was listed as 'no stack dump' as if its stack had
    been there to take, not as having ended with its exception."""
    empty = StackDump("stackdump_rank1.txt", [], None, "trainer")
    for rank1_dump in (None, empty):
        [stall] = [f for f in find([_hung_after_the_last_step(CRASHED, rank1_dump)]) if f.kind == "stall"]
        assert ("rank 1: last heartbeat step 8, stage step; no process left to take a stack of: it had ended "
                "(RuntimeError: injected crash on rank 1)" in stall.detail), stall.detail


def test_a_hung_node_finding_says_a_rank_that_had_failed_had_ended_not_that_it_waited():
    """Node 0's rank hung outside any collective; node 1's rank had failed before: it was listed as
    'waiting for it: node 1's rank 1 (no stack)'."""
    [hung] = [f for f in find([_hung_after_the_last_step(CRASHED, nodes=_two_nodes())])
              if f.kind == "node_hung_alone"]
    assert hung.title.endswith("already ended: node 1's rank 1 (RuntimeError: injected crash on rank 1)"), \
        hung.title


def test_the_log_a_record_shows_is_that_of_the_node_its_verdict_names():
    """Two nodes, rank 1 (node 1) exited 0 early and rank 0 (node 0) failed after it: node 0's agent
    ends first, and the record showed its log's tail and exception (rank 0's 'Connection closed by
    peer') under a verdict naming node 1's rank 1. The log to show is node 1's; of a rank that failed
    in its own right, its own node's."""
    rec = _record({0: PEER}, {0: 3, 1: 2})
    rec.evidence.nodes = _two_nodes()
    assert culprit_log(rec) == "node1.stderr.log", verdict_line(rec)
    rec = _record({0: PEER, 1: RankFailure(signal="SIGKILL", exit_code=-9)}, {0: 3, 1: 3})
    rec.evidence.nodes = _two_nodes()
    assert culprit_log(rec) == "node1.stderr.log", verdict_line(rec)
    rec = _record({0: RankFailure(exception="ValueError: bad batch", exit_code=1)}, {0: 3, 1: 3})
    rec.evidence.nodes = _two_nodes()
    assert culprit_log(rec) == "node0.stderr.log", verdict_line(rec)
    assert culprit_log(_record({0: PEER}, {0: 3, 1: 2})) is None  # one node: its one log


#: torchrun's log of a two-rank Hugging Face Trainer run whose rank 1 called os._exit(0) at step 5 (a
#: user's pass, trimmed): rank 0's buffer broadcast broke under it, and the summary lists rank 0 alone
HF_RANK1_EXIT0 = """[rank0]:   File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 2363, in _distributed_broadcast_coalesced
[rank0]:     dist._broadcast_coalesced(
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:31134: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.
E1206 01:12:11.341000 22669 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 22708) of binary: /v/bin/python3
""" + child_failed("/u/train.py", Failed(0, 22708, 1), time="2026-12-06_01:12:11")


def test_a_rank_of_a_trainer_without_heartbeats_that_exited_0_before_the_last_step_left_early(tmp_path):
    """A Hugging Face Trainer writes no heartbeats: the rank torchrun lists no failure of, in a run
    whose training.csv stopped short of the steps asked for, left early, and the rank whose
    collective broke under it failed after it (the finding blamed rank 0's 'Connection reset by
    peer' and never named rank 1). Where it stopped is not known; a run that logged every step
    says nothing of an early exit."""
    from validation.contract.torchrun_log import rank_failures
    from validation.judge.diagnosis import Kind, diagnose
    from validation.judge.record import Summary

    log = tmp_path / "trainer.stderr.log"
    log.write_text(HF_RANK1_EXIT0)
    said = "a Trainer writes no per-rank records"
    ev = Evidence(rank_failures=rank_failures(log), stderr_log=log.name, no_heartbeats=said)
    rec = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL,
                      "trainer crashed (exit code 1)", steps=12, world_size=2, exit_code=1, evidence=ev,
                      metrics=Summary(steps_completed=4.0))
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and d.rank == 1
    assert verdict_line(rec).startswith("rank 1 exited 0 early"), verdict_line(rec)
    title = next(f.title for f in find([rec]) if f.kind == "departed")
    assert title.endswith(": rank 1 exited 0 early (where it stopped is not known: a Trainer writes no per-rank "
                          "records; training.csv's last step 4 of 12; torchrun reports no failure of it); the "
                          "other ranks failed without it"), title
    done = dataclasses.replace(rec, metrics=Summary(steps_completed=12.0))
    assert departed(done) == []
