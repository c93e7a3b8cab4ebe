"""A rank that left its loop early and was still ending when torchrun's agent ended it: rank 0 stopped after step 5
of 8 (a stop condition of its own), destroyed its process group and returned from main, and an atexit hook kept its
interpreter's exit going (a logger flushing, an uploader); rank 1's all-reduce of step 6 broke on its closed
connection ('Connection closed by peer'), rank 1 exited 1, and torchrun ended rank 0 with SIGTERM. torchrun lists
rank 0 among the failures, so it is no rank that exited 0 (``departed``), and rank 1 raised, so no silent exit
(``maybe_departed``): the verdict read only 'trainer crashed (exit code 1)', with no diagnosis.

Judged from the files a real two-rank torchrun run of validation/tests/record_trainer.py left
(validation/tests/evidence/gloo2_left_ending_rank0_sigtermed: NSA_RECORD_LINGER=0@5, 8 steps), and from
hand-built variants of it: the peer's words of a lost connection, on one host and on two, a third rank, a rank not
behind; nothing runs here."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from validation.contract.stacks import Frame
from validation.contract.torchrun_log import RankFailure, rank_failures
from validation.contract.torchrun_log.failure import PeerGone
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.tests.stopped_run import judged_run
from validation.tests.torchrun_summary import Failed, child_failed

EVIDENCE = Path(__file__).parents[1] / "evidence" / "gloo2_left_ending_rank0_sigtermed"
#: the step's all-reduce of the loss, which rank 1's error broke in
REGULAR = Frame("/tmp/s18_left/validation/tests/record_trainer.py", 163, "main")
CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
          "peer [127.0.0.1]:14737.")


@pytest.mark.parametrize("failure, gone", [
    (RankFailure(exception=CLOSED, exit_code=1), PeerGone.CLOSED),
    (RankFailure(exception="RuntimeError: [..pair.cc:598] Read error [10.0.0.2]:4020: Connection reset by peer",
                 exit_code=1), PeerGone.LOST),
    (RankFailure(exception="RuntimeError: [..pair.cc:589] Write error [10.0.0.2]:4020: Broken pipe", exit_code=1),
     PeerGone.LOST),
    (RankFailure(signal="SIGABRT", nccl_watchdog="Process group watchdog thread terminated with exception: NCCL "
                 "error: remote process exited or there was a network error, NCCL version 2.21.5"), PeerGone.LOST),
    (RankFailure(exception="RuntimeError: [..unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to "
                 "complete", exit_code=1), None),
    (RankFailure(exception="RuntimeError: boom", exit_code=1), None),
    (RankFailure(signal="SIGTERM", exit_code=-15), None)])
def test_what_a_ranks_error_says_of_a_peer_gone_is_typed(failure, gone):
    """Only gloo's orderly close says the peer's own process closed the connection; a reset, a broken pipe and NCCL's
    remote error fit a failed network as well; a timeout says the peer was there and never came."""
    assert failure.peer_gone == gone


def _run(tmp_path: Path, said: str | None = None) -> PhaseRecord:
    """The recorded run, with rank 1's error (each of its two lines in the log) in ``said``'s words where given."""
    run = tmp_path / "run"
    shutil.copytree(EVIDENCE, run)
    if said is not None:
        log = run / "trainer.stderr.log"
        log.write_text(log.read_text().replace(CLOSED, said))
    return judged_run(run, "trainer.stderr.log", 1)


def test_a_rank_torchrun_ended_while_it_was_still_ending_after_it_left_early_is_named_as_having_left(tmp_path):
    rec = _run(tmp_path)
    f0, f1 = rec.evidence.rank_failures[0], rec.evidence.rank_failures[1]
    assert (f0.signal, f0.by_agent, f0.exception) == ("SIGTERM", True, None), f0
    assert f1.peer_gone == PeerGone.CLOSED and not f1.own, f1
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and not d.suspected, d
    assert [(at.rank, at.step, at.stage) for at in d.ranks] == [(0, 5, "step")], d
    assert d.broken is not None and d.broken.peer == PeerGone.CLOSED, d
    assert [(at.rank, at.step, at.frame, at.site) for at in d.broken.ranks] == [(1, 6, "all_reduce", REGULAR)], d
    assert d.cause.startswith("RuntimeError: Connection closed by peer [127.0.0.1]:14737"), d.cause
    assert d.files == (f"{rec.out_dir}/heartbeat_rank0.jsonl", f"{rec.out_dir}/heartbeat_rank1.jsonl"), d.files
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 0 left early after step 5 \(last heartbeat step 5, stage step\) and was still ending "
                        r"when torchrun's agent ended it \(SIGTERM\): its connections closed under rank 1's all_reduce "
                        r"at tests/record_trainer.py:163 \(main\) during step 6 \(RuntimeError: Connection closed by "
                        r"peer \[127.0.0.1\]:14737[^)]*\) — the other ranks failed without it \(exit code 1\)",
                        line), line
    [crash] = [f for f in find([rec]) if f.kind == "departed"]
    assert crash.title.startswith("early exit in ddp [default]: exit code 1: rank 0 left early after step 5"), crash
    assert any(ln.startswith("rank 0: last heartbeat step 5, stage step; killed by SIGTERM from torchrun's agent once "
                             "rank 1 had failed on a peer gone") for ln in crash.detail), crash.detail
    assert crash.diagnosis == d, crash
    [advice] = recommendations([crash])
    assert "still ending" in advice and "exited 0" not in advice and "suspected" not in advice, advice


#: rank 1's error in other words of a lost peer: gloo's read error of a connection reset (a peer that ends with a
#: message unread resets it), NCCL's remote error
LOST = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error "
        "[127.0.0.1]:14737: Connection reset by peer.",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there "
        "was a network error, NCCL version 2.21.5")


@pytest.mark.parametrize("said", LOST)
def test_a_peer_lost_on_one_host_is_a_peer_that_ended(tmp_path, said):
    """On one host no network between the ranks can fail: a connection lost is the peer's process ending."""
    rec = _run(tmp_path, said)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and not d.suspected, d
    assert d.broken.peer == PeerGone.LOST and d.broken.one_host and not d.broken.network_fits, d
    assert verdict_line(rec).startswith("rank 0 left early after step 5 (last heartbeat step 5, stage step) and was "
                                        "still ending when torchrun's agent ended it (SIGTERM): its connections closed "
                                        "under rank 1's all_reduce"), verdict_line(rec)


@pytest.mark.parametrize("said", LOST)
def test_a_peer_lost_across_hosts_leaves_the_early_exit_suspected(tmp_path, said):
    """Rank 0 on one host, rank 1 on another: a lost connection fits a network that failed between them while rank 0
    ran code of its own between steps as well."""
    rec = _run(tmp_path, said)
    rec.evidence.nodes = NodesEvidence("torchrun", "a:29500", 6.0, [
        NodeEvidence(0, "trainer.stderr.log", "a", 1, 3.0, 0, [0]),
        NodeEvidence(1, "trainer.stderr.log", "b", 1, 3.0, 1, [1])])
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and d.suspected, d
    assert d.broken.peer == PeerGone.LOST and not d.broken.one_host and d.broken.network_fits, d
    assert [(at.rank, at.node) for at in d.ranks] == [(0, "node 0")], d
    line = verdict_line(rec)
    assert line.startswith("node 0's rank 0 may have left early after step 5 (last heartbeat step 5, stage step) and "
                           "been still ending when torchrun's agent ended it (SIGTERM): node 1's rank 1's all_reduce at "
                           "tests/record_trainer.py:163 (main) broke during step 6 ("), line
    assert ("those words fit as well a network that failed between the hosts while node 0's rank 0 still ran; "
            "torchrun's SIGTERM ends a rank still running and one still ending alike — the other ranks failed without "
            "it (exit code 1)") in line, line
    [crash] = [f for f in find([rec]) if f.kind == "departed"]
    [advice] = recommendations([crash])
    assert "suspected, not shown" in advice and "network" in advice, advice


@pytest.mark.parametrize("hosts, one", [(("vm", "vm"), True), (("a", "b"), False), (("vm", None), False)])
def test_nodes_on_one_host_are_those_whose_agents_the_launch_names_on_one(hosts, one):
    nodes = [NodeEvidence(k, f"node{k}.stderr.log", host, ranks=[k]) for k, host in enumerate(hosts)]
    assert NodesEvidence("torchrun", "a:29500", 6.0, nodes).one_host == one


def test_a_peer_that_gave_up_waiting_is_no_early_exit(tmp_path):
    """gloo's timeout says the peer was there and never came: a hang (Kind.HUNG), not a rank that left."""
    rec = _run(tmp_path, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                         "waiting 10000ms for recv operation to complete")
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and d.broken is None, d


def test_a_rank_not_behind_the_broken_collective_is_not_named_as_having_left(tmp_path):
    """Rank 0's last heartbeat within step 6, as rank 1's: it had started the step the collective broke in, so its
    heartbeats say nothing of an early exit."""
    rec = _run(tmp_path)
    beats = Path(rec.out_dir) / "heartbeat_rank0.jsonl"
    beats.write_text(beats.read_text() + '{"time": 1796613431.4, "rank": 0, "pid": 9247, "step": 6, "stage": '
                                          '"forward"}\n')
    rec = judged_run(Path(rec.out_dir), "trainer.stderr.log", 1)
    assert rec.evidence.last_heartbeat[0].step == 6
    d = diagnose(rec)
    assert d is None or d.kind != Kind.LEFT, d


def _three(tmp_path: Path, beats: dict[int, list[dict]], *, torch_frames: bool = True) -> PhaseRecord:
    """torchrun x3: rank 1's all-reduce broke on a peer's closed connection, and its agent then ended ranks 0 and 2
    (SIGTERM); each rank's last heartbeats ``beats``. ``torch_frames``: rank 1's traceback ends in torch.distributed's
    all_reduce, else in the trainer's own frame (a trainer that re-raises the error in its own words)."""
    agent = "torch/distributed/elastic/multiprocessing/api.py:1028] Sending process"
    torch = ("[rank1]:   File \"/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line 3252, in "
             "all_reduce\n[rank1]:     work.wait()\n") if torch_frames else ""
    log = (f"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/x/train.py\", line 40, in main\n"
           f"[rank1]:     dist.all_reduce(loss)\n{torch}[rank1]: {CLOSED} This is typically caused by a remote worker "
           f"crashing.\nW1207 03:07:11.416000 9230 {agent} 9247 closing signal SIGTERM\n"
           f"W1207 03:07:11.416000 9230 {agent} 9249 closing signal SIGTERM\n"
           + child_failed("/x/train.py", Failed(1, 9248, 1), Failed(0, 9247, -15), Failed(2, 9249, -15)))
    path = tmp_path / "trainer.stderr.log"
    path.write_text(log)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log=path.name,
                  last_heartbeat={k: Beat.of(recs) for k, recs in beats.items()})
    return PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=3, exit_code=1, evidence=ev, trainer="myt")


_DONE_5 = [{"step": 5, "stage": "backward"}, {"step": 5, "stage": "step"}]
_IN_6 = [{"step": 6, "stage": "forward"}, {"step": 6, "stage": "backward"}]


def test_of_three_ranks_the_one_behind_the_broken_collective_is_named_and_not_the_one_torchrun_ended_in_step(tmp_path):
    """Rank 2 was within step 6 with rank 1 when torchrun ended it: still running; rank 0 alone stopped after step 5."""
    rec = _three(tmp_path, {0: _DONE_5, 1: _IN_6, 2: _IN_6})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and not d.suspected, d
    assert [at.rank for at in d.ranks] == [0] and [at.rank for at in d.broken.ranks] == [1], d
    assert "its connections closed under rank 1's all_reduce at x/train.py:40 (main) during step 6" in verdict_line(rec)


def test_a_broken_collective_whose_traceback_names_none_is_said_as_a_collective(tmp_path):
    rec = _three(tmp_path, {0: _DONE_5, 1: _IN_6, 2: _IN_6}, torch_frames=False)
    d = diagnose(rec)
    assert d is not None and d.broken is not None and d.broken.ranks[0].frame is None, d
    assert "its connections closed under rank 1's collective at x/train.py:40 (main) during step 6" in verdict_line(rec)


def test_of_three_ranks_two_behind_the_broken_collective_are_each_suspected(tmp_path):
    """Ranks 0 and 2 both stopped after step 5: one closed its connections, and the other may have been running code
    of its own between steps (a checkpoint's save) when torchrun came; which, the files do not tell."""
    rec = _three(tmp_path, {0: _DONE_5, 1: _IN_6, 2: _DONE_5})
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and d.suspected and d.broken.peer == PeerGone.CLOSED, d
    assert [at.rank for at in d.ranks] == [0, 2], d
    line = verdict_line(rec)
    assert line.startswith("rank 0 may have left early after step 5 (last heartbeat step 5, stage step); rank 2 may "
                           "have left early after step 5 (last heartbeat step 5, stage step) and been still ending "
                           "when torchrun's agent ended them (SIGTERM): rank 1's all_reduce"), line
    assert "only one of ranks 0, 2 need have left, the other running code of its own between steps" in line, line


#: rank 1 all-reduced its loss an extra time at step 3 (NSA_RECORD_TWICE=1@3), so each of its later all-reduces met
#: rank 0's next one; rank 0 left after step 5 as above (NSA_RECORD_LINGER=0@5), and rank 1's all-reduce of step 5,
#: a step rank 0 had completed, broke on its closed connection
OUT_OF_STEP = Path(__file__).parents[1] / "evidence" / "gloo2_left_ending_out_of_step"


def test_a_rank_that_left_after_a_step_the_other_still_failed_within_is_named_beside_the_collectives_out_of_step(
        tmp_path):
    """The two faults at once read 'trainer crashed (exit code 1)' with no diagnosis: rank 0 was no rank stopped
    behind the one whose collective broke (it had completed step 5, the step rank 1 broke in), so not the early exit
    still ending, and it did not exit 0, so not the collectives out of step beside an early exit either."""
    run = tmp_path / "run"
    shutil.copytree(OUT_OF_STEP, run)
    rec = judged_run(run, "trainer.stderr.log", 1)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and not d.suspected, d
    assert [(at.rank, at.step, at.stage) for at in d.ranks] == [(0, 5, "step")], d
    assert [(at.rank, at.step, at.frame) for at in d.broken.ranks] == [(1, 5, "all_reduce")], d
    off = d.beside
    assert off is not None and off.kind == Kind.OUT_OF_STEP and not off.ended_exit_0, off
    assert [(at.rank, at.step) for at in off.ranks] == [(1, 5)] and [at.rank for at in off.ended] == [0], off
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 0 left early after step 5 \(last heartbeat step 5, stage step\) and was still ending "
                        r"when torchrun's agent ended it \(SIGTERM\): its connections closed under rank 1's all_reduce "
                        r"at tests/record_trainer.py:163 \(main\) during step 5 \([^)]*\); besides, rank 1 failed in "
                        r"all_reduce at tests/record_trainer.py:163 \(main\) during step 5 \([^)]*\), a step rank 0 had "
                        r"completed before it left \(last heartbeat step 5, stage step\): the ranks' collectives were out "
                        r"of step: rank 1 had called more collectives than rank 0 by then, .* — the other ranks failed "
                        r"without it \(exit code 1\)", line), line
    found = {f.kind: f for f in find([rec]) if f.kind in ("departed", "out_of_step")}
    assert set(found) == {"departed", "out_of_step"}, find([rec])
    assert "a step rank 0 had completed before it left" in found["out_of_step"].title
    advice = recommendations(list(found.values()))
    assert any("still ending" in a for a in advice), advice
    assert any("another rank had completed before it left (it was still ending when torchrun's agent ended it)" in a
               for a in advice), advice


def test_across_hosts_a_lost_connection_within_the_step_its_peer_completed_names_no_early_exit(tmp_path):
    """On two hosts, 'Connection reset by peer' within step 5, a step rank 0 had completed, fits a network that failed
    while rank 1 still finished the step's all-reduce (rank 0 having returned from it and gone on) as well: neither
    the early exit nor the collectives out of step is claimed."""
    run = tmp_path / "run"
    shutil.copytree(OUT_OF_STEP, run)
    log = run / "trainer.stderr.log"
    log.write_text(re.sub(r"Connection closed by peer (\[127\.0\.0\.1\]:\d+)", r"Read error \1: Connection reset by peer",
                          log.read_text()))
    rec = judged_run(run, "trainer.stderr.log", 1)
    assert rec.evidence.rank_failures[1].peer_gone == PeerGone.LOST
    rec.evidence.nodes = NodesEvidence("torchrun", "a:29500", 6.0, [
        NodeEvidence(0, "trainer.stderr.log", "a", 1, 3.0, 0, [0]),
        NodeEvidence(1, "trainer.stderr.log", "b", 1, 3.0, 1, [1])])
    d = diagnose(rec)
    assert d is None or (d.kind != Kind.LEFT and d.kind != Kind.OUT_OF_STEP), d
    # on one host the same words are the peer's process ending: both are named
    rec.evidence.nodes = None
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and d.beside is not None, d

