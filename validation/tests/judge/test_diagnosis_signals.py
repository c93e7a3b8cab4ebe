"""Whose signal ended a rank: torchrun's agent's (it ends the ranks still running once one has failed,
and logs each: 'Sending process 24693 closing signal SIGTERM'), or another's. Every SIGTERM was taken
for the agent's, so a rank killed by a SIGTERM from elsewhere (a person's kill of one process, a
scheduler preempting one) was no failure of its own: the verdict named no rank, and the finding led with
a survivor's 'Connection reset by peer' as the crash's exception. And a rank the agent had to SIGKILL,
once it outlived the agent's SIGTERM (a preemption handler saving a checkpoint), was taken for a rank
killed by SIGKILL in its own right, the out-of-memory killer's, ahead of the rank that raised first.
Judged from the files real three- and two-rank gloo runs of a trainer of one's own left
(validation/tests/evidence/sigterm3_*, agent_sigkill2_*, agent_stall2_*); nothing runs here. A rank the
harness's stall watch found still in its end on the agent's SIGTERM (such a handler) was named as
the rank that stalled."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from validation.contract.files import read_heartbeats
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.failed import root_of_evidence
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.tests.stopped_run import judged_stopped_run

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: torchrun x3, gloo: rank 1 sends itself SIGTERM as step 3 starts (stage data); ranks 0
#: and 2 raise 'Connection reset by peer' in their all_reduce, and torchrun's agent, seeing rank 1 fail,
#: sends SIGTERM to ranks 0 and 2 (pids 24693, 24695), still exiting: torchrun reports all three -15
OUTSIDE = EVIDENCE / "sigterm3_rank1_outside"


def _record(run: Path, log: str | None = None, tmp_path: Path | None = None, world: int = 3) -> PhaseRecord:
    path = run / "trainer.stderr.log"
    if log is not None:
        path = tmp_path / "trainer.stderr.log"
        path.write_text(log)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(run).items()})
    return PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=world, exit_code=1, evidence=ev,
                       trainer="myt")


def test_a_rank_killed_by_a_sigterm_that_was_not_the_agents_is_named():
    """The recorded run: the agent signalled ranks 0 and 2, not rank 1, whose SIGTERM came from
    elsewhere before: rank 1 is named, killed by SIGTERM, and the advice asks who sent it. Once the
    verdict was 'trainer crashed (exit code 1)' and the finding's title rank 0's 'Connection reset by peer'."""
    rec = _record(OUTSIDE)
    f = rec.evidence.rank_failures
    assert [f[k].ended_by_agent for k in (0, 1, 2)] == [True, False, True], f
    assert f[1].own and not f[0].own and not f[2].own and root_of_evidence(rec.evidence) == 1, f
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.KILLED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert c.cause.startswith("killed by SIGTERM, not torchrun's") and (c.step, c.stage) == (3, "data"), c
    assert verdict_line(rec).startswith("rank 1 crashed (last heartbeat step 3, stage data): killed by SIGTERM, not "
                                        "torchrun's"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert "Connection reset by peer" not in crash.title, crash.title
    assert any(d.startswith("rank 0: last heartbeat step 3, stage backward; RuntimeError") for d in crash.detail), crash
    [advice] = recommendations([crash])
    assert "Rank 1 was killed by SIGTERM" in advice and "who sent it" in advice, advice


def test_where_the_log_shows_no_signal_of_the_agents_a_sigterm_is_taken_for_its(tmp_path):
    """Without the agent's lines (its logging filtered out) nothing says whose a SIGTERM was, and it is
    taken for the agent's as before: no rank is named as killed by it."""
    log = re.sub(r"^.*Sending process \d+ closing signal SIGTERM\n", "", (OUTSIDE / "trainer.stderr.log").read_text(),
                 flags=re.M)
    rec = _record(OUTSIDE, log, tmp_path)
    assert all(f.ended_by_agent is None and not f.own for f in rec.evidence.rank_failures.values()), \
        rec.evidence.rank_failures
    assert diagnose(rec) is None, verdict_line(rec)


def test_an_agent_told_to_stop_says_nothing_of_whose_signal_a_rank_had(tmp_path):
    """An agent that was itself sent SIGTERM (by Slurm, a person) signals its workers as it stops, and
    the same signal may have reached a worker straight: no SIGTERM is read as another's."""
    text = (OUTSIDE / "trainer.stderr.log").read_text()
    told = ("W1128 05:06:30.014000 24656 torch/distributed/elastic/agent/server/api.py:753] Received Signals.SIGTERM "
            "death signal, shutting down workers\n")
    i = text.index("W1128 05:06:30.015000")
    rec = _record(OUTSIDE, text[:i] + told + text[i:], tmp_path)
    assert all(f.ended_by_agent is None for f in rec.evidence.rank_failures.values()), rec.evidence.rank_failures
    assert diagnose(rec) is None, verdict_line(rec)


#: torchrun x2, gloo: rank 1 raises as step 3 starts; rank 0, busy in its own work then,
#: gets the agent's SIGTERM, and its handler saves a checkpoint for 45 s (a preemption handler); the
#: agent waits its 30 s and kills it: 'Unable to shutdown process 29603 via 15, forcefully exiting via 9'
SLOW_HANDLER = EVIDENCE / "agent_sigkill2_rank0_slow_handler"


def test_a_rank_the_agent_killed_after_its_sigterm_is_no_failure_of_its_own():
    """The recorded run: rank 0's SIGKILL was the agent's, after the failure of rank 1, which raised:
    rank 1 is named. Once 'rank 0 crashed (...): killed by SIGKILL' (the lowest rank killed by a signal),
    with advice to look for the out-of-memory killer."""
    rec = _record(SLOW_HANDLER, world=2)
    f0 = rec.evidence.rank_failures[0]
    assert f0.signal == "SIGKILL" and f0.ended_by_agent is True and f0.by_agent and not f0.own, f0
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 crashed (last heartbeat step 3, stage data): RuntimeError: boom on "
                                        "rank 1"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert ("rank 0: last heartbeat step 3, stage data; killed by SIGKILL from torchrun's agent, once its SIGTERM had "
            "not ended it") in crash.detail, crash.detail
    [advice] = recommendations([crash])
    assert "SIGKILL" not in advice, advice


#: the run of SLOW_HANDLER under a stall_s (12 s) shorter than the agent's wait: the harness's stall watch
#: found rank 0 still in its SIGTERM handler, the agent having signalled it (pid 29215), took its stack and
#: killed the run before torchrun wrote its summary
STALLED = EVIDENCE / "agent_stall2_rank0_slow_handler"


def test_a_rank_still_ending_on_the_agents_sigterm_when_the_harness_came_is_not_the_one_named(tmp_path):
    """Judged as the harness judges a run it stopped: rank 1 raised first, and rank 0, found outside the
    collectives (in its handler), had been signalled by the agent: rank 1 is named, rank 0 said to be
    ending. Once 'rank 0 stalled in <lambda>' with rank 1's exception in the detail only."""
    rec = judged_stopped_run(STALLED, STALLED / "trainer.stderr.log", stalled_s=12.0, stacks_tried=1)
    assert rec.evidence.signalled_pids == [29215], rec.evidence.signalled_pids
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 crashed (last heartbeat step 3, stage data): RuntimeError: boom on "
                                        "rank 1, at /tmp/b18/mt/train.py:43 in <module> (raise RuntimeError(f\"boom "
                                        "on rank {rank}\")) — stalled"), verdict_line(rec)
    [stall] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert stall.title.endswith("rank 1 failed first (RuntimeError: boom on rank 1, at /tmp/b18/mt/train.py:43 in "
                                "<module> (raise RuntimeError(f\"boom on rank {rank}\")); last heartbeat step 3, "
                                "stage data), and the other ranks waited for it: rank 0 in <lambda> (ending: "
                                "torchrun's agent had signalled it once rank 1 had failed)"), stall.title


@pytest.mark.parametrize("old", [
    lambda msg: f"WARNING:torch.distributed.elastic.multiprocessing.api:{msg}",  # torch before 2.2
    lambda msg: f"[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] {msg}",  # 2.2, 2.3
])
def test_the_agents_signals_are_read_in_the_log_formats_of_older_torch(tmp_path, old):
    """The recorded log with the agent's lines in the logging formats of torch before 2.4: the same
    ranks were signalled by it, and rank 1 is named as before."""
    log = re.sub(r"^W\d{4} [\d:.]+ \d+ torch/distributed/elastic/multiprocessing/api\.py:\d+\] (Sending process .*)$",
                 lambda m: old(m.group(1)), (OUTSIDE / "trainer.stderr.log").read_text(), flags=re.M)
    assert "W1128 05:06:30.015000" not in log
    rec = _record(OUTSIDE, log, tmp_path)
    assert [rec.evidence.rank_failures[k].ended_by_agent for k in (0, 1, 2)] == [True, False, True], \
        rec.evidence.rank_failures
    c = diagnose(rec)
    assert c is not None and [r.rank for r in c.ranks] == [1], verdict_line(rec)


@pytest.mark.parametrize("code, name", [(-15, "SIGTERM"), (-9, "SIGKILL")])
def test_a_trainer_run_as_one_process_that_a_signal_ended_is_said_killed_by_it(code, name):
    """A trainer run as one process (the python launcher) that a signal ended has exit code -N, as
    Python's subprocess says it, and no torchrun log to name the signal: the verdict read 'rank 0
    crashed (...): exit code -15' and the advice sent the reader to its log for why it exited, where a
    signal leaves nothing. It reads as a rank under torchrun does: killed by the signal, and who sent it."""
    ev = Evidence(stderr_log="trainer.stderr.log", last_heartbeat={0: Beat(step=3, stage="backward")})
    rec = PhaseRecord(PointKey("mine", "cpu", "one"), "mine/cpu/one/default", "train", Status.FAIL,
                      f"trainer crashed (exit code {code})", steps=8, world_size=1, exit_code=code, evidence=ev,
                      trainer="myt")
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.KILLED and [r.rank for r in c.ranks] == [0], c
    assert verdict_line(rec).startswith(f"rank 0 crashed (last heartbeat step 3, stage backward): killed by {name}"), \
        verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.endswith(f"exit code {code}: killed by {name}"), crash.title
    [advice] = recommendations([crash])
    assert f"The trainer's process was killed by {name}, which leaves no traceback" in advice, advice
    assert "read what it printed there" not in advice, advice
    # the kernel's out-of-memory killer sends SIGKILL only: a SIGTERM is a scheduler's or a person's
    assert ("out-of-memory killer" in advice) == (name == "SIGKILL"), advice
    assert "a scheduler's limit or preemption" in advice, advice


def test_a_torchrun_agent_that_a_signal_ended_is_named_as_killed():
    """The torchrun agent the harness launched for one node, killed by SIGKILL (a person's kill -9, the
    out-of-memory killer) before any rank failed: its exit code is -9 and its log names no rank. The
    finding read 'crash in ...: exit code -9' and the advice sent the reader to a log with no error in
    it; a node's agent of a launch of several is named so already (judge/nodes.py ``agent_killed``)."""
    ev = Evidence(stderr_log="trainer.stderr.log",
                  last_heartbeat={0: Beat(step=3, stage="optimizer"), 1: Beat(step=3, stage="optimizer")})
    rec = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                      "trainer crashed (exit code -9)", steps=8, world_size=2, exit_code=-9, evidence=ev,
                      trainer="myt", command=["python3", "-m", "torch.distributed.run", "--standalone", "--",
                                              "train.py"])
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.endswith("exit code -9: the torchrun agent was killed by SIGKILL"), crash.title
    [advice] = recommendations([crash])
    assert "The torchrun agent was killed by SIGKILL, which leaves no traceback" in advice, advice
    # not a launch through torchrun (srun's exit, say): nothing is said of an agent
    other = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                        "trainer crashed (exit code -9)", steps=8, world_size=2, exit_code=-9, evidence=ev,
                        trainer="myt", command=["srun", "--nodes=2", "python3", "-m", "torch.distributed.run"])
    [crash] = [x for x in find([other]) if x.title.startswith("crash in")]
    assert "agent" not in crash.title, crash.title


@pytest.mark.parametrize("world, command, said", [
    (1, ["python3", "train.py"], "the trainer's process was killed by SIGKILL"),
    (2, ["python3", "-m", "torch.distributed.run", "--standalone", "--", "train.py"],
     "the torchrun agent was killed by SIGKILL")])
def test_the_verdict_line_of_a_process_a_signal_ended_says_the_signal(world, command, said):
    """The process the harness launched (the trainer's one process, the torchrun agent of one node) that a
    signal ended: its cause and finding said 'killed by SIGKILL', while its verdict line still ended in
    'trainer crashed (exit code -9)', a crash of the trainer's own that nothing of the run says."""
    ev = Evidence(stderr_log="trainer.stderr.log", last_heartbeat={k: Beat(step=3, stage="optimizer") for k in range(world)})
    rec = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                      "trainer crashed (exit code -9)", steps=8, world_size=world, exit_code=-9, evidence=ev,
                      trainer="myt", command=command)
    assert verdict_line(rec).endswith(f"{said} (exit code -9)"), verdict_line(rec)
    assert "trainer crashed" not in verdict_line(rec), verdict_line(rec)


def test_a_torchrun_agent_that_a_sigterm_told_to_stop_is_named_as_stopped_by_it(tmp_path):
    """SIGTERM to the torchrun agent of one node (a person's kill, a scheduler's stop of the launcher): the
    agent ends its workers, raises SignalException and exits 1, and no rank's end is reported. The finding
    read 'crash in ...: exit code 1: torch.distributed.elastic.multiprocessing.api.SignalException: Process
    5253 got signal: 15' and the advice sent the reader to that traceback; a SIGKILL of it is named already."""
    log = ("W1206 16:17:35.886000 5253 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
           "shutting down workers\n"
           "W1206 16:17:35.887000 5253 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 5262 "
           "closing signal SIGTERM\n"
           "Traceback (most recent call last):\n"
           '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in '
           "_terminate_process_handler\n"
           '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)\n'
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 5253 got signal: 15\n")
    (tmp_path / "trainer.stderr.log").write_text(log)
    ev = Evidence(stderr_log="trainer.stderr.log", stderr_tail=log, rank_failures=rank_failures(tmp_path / "trainer.stderr.log"),
                  last_heartbeat={0: Beat(step=2, stage="step"), 1: Beat(step=2, stage="step")})
    assert not ev.rank_failures, ev.rank_failures
    agent = ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--", "train.py"]
    rec = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                      "trainer crashed (exit code 1)", steps=8, world_size=2, exit_code=1, evidence=ev,
                      trainer="myt", command=agent)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.endswith("exit code 1: the torchrun agent was stopped by SIGTERM"), crash.title
    assert verdict_line(rec) == "the torchrun agent was stopped by SIGTERM (exit code 1)", verdict_line(rec)
    [advice] = recommendations([crash])
    assert advice.split(": ", 1)[1].startswith("The torchrun agent was stopped by SIGTERM, which leaves no traceback "
                                               "of the trainer's: look for who sent it"), advice
    # the harness's own stop of a stalled run sends the agent its SIGTERM: nothing of another sender
    stopped = PhaseRecord(PointKey("mine", "cpu", "ddp"), "mine/cpu/ddp/default", "train", Status.FAIL,
                          "stalled: no progress for 60s after step 2", steps=8, world_size=2, exit_code=None,
                          stalled_s=60.0, evidence=ev, trainer="myt", command=agent)
    assert all("stopped by SIGTERM" not in x.title for x in find([stopped])), [x.title for x in find([stopped])]
