"""The verdict line of a point (the CLI's line, the test's failure, the report's Reason) and of the
report (its status line) name the rank, and on a launch of several nodes the node, that crashed
or hung: it once said only 'trainer crashed (exit code 1)' and '1 of 2 phase point(s) failed:
two [default]', the rank only in the findings further down. The rank comes from the finding's own
diagnosis, so the two cannot disagree."""
from __future__ import annotations

from validation.contract.files import HaltInfo
from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.contract.torchrun_log import RankFailure
from validation.judge.findings import find
from validation.judge.diagnosis import Kind, NoStack
from validation.judge.diagnosis import diagnose
from validation.judge.findings.headline import verdict_line
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status, SubRun
from validation.report.build import status_of
from validation.runbook.plan import expand
from validation.session.session import Outcome
from validation.tests.conftest import train_phase

STALLED = "stalled: no progress for 30s after step 5; stacks taken and the run killed by the harness"


def _record(status: Status = Status.FAIL, reason: str = "trainer crashed (exit code 1)", **fields) -> PhaseRecord:
    base = dict(key=PointKey("rb", "cpu", "two"), test_id="rb/cpu/two/default", kind="train", status=status,
                reason=reason, exit_code=1, world_size=2, steps=8)
    return PhaseRecord(**{**base, **fields})


def _two_nodes() -> NodesEvidence:
    return NodesEvidence("torchrun", "localhost:1", 20.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 3.0, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", 1, 3.1, 1, [1])], "9", "9.1")


def test_the_verdict_line_names_the_node_and_rank_that_crashed():
    ev = Evidence(rank_failures={1: RankFailure(exception="RuntimeError: injected crash on rank 1", exit_code=1),
                                 0: RankFailure(exit_code=1, signal="SIGTERM")},
                  last_heartbeat={0: Beat(2, "backward"), 1: Beat(2, "forward")}, nodes=_two_nodes())
    rec = _record(evidence=ev)
    [crash] = [f for f in find([rec]) if f.kind == "crash"]
    assert crash.title.endswith("rank 1: RuntimeError: injected crash on rank 1"), crash.title
    assert crash.diagnosis == diagnose(rec) and crash.diagnosis.kind == Kind.CRASHED
    line = ("node 1's rank 1 crashed (last heartbeat step 2, stage forward): RuntimeError: injected crash on rank 1 "
            "— trainer crashed (exit code 1)")
    assert verdict_line(rec) == line
    verdict, reason = status_of([rec], [], find([rec]))
    assert verdict == "NO-GO" and reason == (
        "1 of 1 phase point(s) failed: two [default] (node 1's rank 1 crashed (last heartbeat step 2, stage forward): "
        "RuntimeError: injected crash on rank 1)"), reason


def test_the_verdict_line_names_the_rank_that_hung_not_the_one_waiting_for_it():
    stacks = {0: StackDump("harness_stacks/rank0.txt", [Frame("torch/distributed/c10d.py", 1, "all_reduce")]),
              1: StackDump("harness_stacks/rank1.txt", [Frame("/x/train.py", 7, "wait_forever")])}
    ev = Evidence(stackdumps=stacks, last_heartbeat={0: Beat(5, "backward"), 1: Beat(5, "forward")})
    rec = _record(reason=STALLED, exit_code=None, stalled_s=30.0, evidence=ev)
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert ": hung: rank 1 in wait_forever; waiting for it: rank 0 in all_reduce" in stall.title, stall.title
    assert verdict_line(rec) == f"rank 1 hung in wait_forever (last heartbeat step 5, stage forward) — {STALLED}"
    assert "two [default] (rank 1 hung in wait_forever" in status_of([rec], [], find([rec]))[1]


def test_a_stall_that_nothing_tells_apart_names_every_rank_as_stalled_not_hung():
    """Each rank outside any collective, at the same step: the finding lists them alike, and so
    does the verdict line, claiming no rank hung first."""
    stacks = {k: StackDump(f"stackdump_rank{k}.txt", [Frame("/x/train.py", 7, f"spin_{k}")]) for k in (0, 1)}
    ev = Evidence(stackdumps=stacks, last_heartbeat={0: Beat(5, "forward"), 1: Beat(5, "forward")},
                  halt=HaltInfo(source="watchdog"))
    rec = _record(reason="watchdog wrote .HALT: no rank made progress", exit_code=3, evidence=ev)
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert stall.title.endswith(": rank 0 in spin_0; rank 1 in spin_1"), stall.title
    assert verdict_line(rec).startswith("rank 0 stalled in spin_0 (last heartbeat step 5, stage forward); rank 1 "
                                        "stalled in spin_1 (last heartbeat step 5, stage forward) — watchdog wrote")


def test_a_point_that_passed_or_blames_no_rank_keeps_its_reason():
    assert verdict_line(_record(Status.PASS, "2 gate(s) passed", exit_code=0)) == "2 gate(s) passed"
    # several ranks, and nothing says which failed: the verdict names none, as the finding does
    rec = _record(evidence=Evidence(exception="RuntimeError: x"))
    assert diagnose(rec) is None and verdict_line(rec) == "trainer crashed (exit code 1)"


def test_a_crashed_run_names_its_rank_in_the_session_line_and_the_report(fake_run):
    run = fake_run([train_phase(fault="crash:step=3")])
    rec = run.record
    assert rec.reason == "trainer crashed (exit code 1)"  # the stored verdict: how the process ended
    who = "rank 0 crashed (last heartbeat step 2, stage optimizer): RuntimeError: Expected to mark a variable ready"
    [point] = expand(run.runbook, run.profile)
    assert Outcome(point, rec).line().startswith(f"fake/cpu/baseline_ddp/default: FAIL ({rec.wall_s:.1f}s) {who}")
    assert f"1 of 1 phase point(s) failed: baseline_ddp [default] ({who}" in run.context["status_reason"]
    assert f"- **Reason**: {who}" in run.report, run.report


def _frozen(state: str) -> PhaseRecord:
    """Rank 1 of no stack, furthest behind, while rank 0 waits in DDP's backward; ``state``: its
    process's state as the harness came for its stack ('stopped': SIGSTOP or a debugger)."""
    ev = Evidence(stackdumps={0: StackDump("stackdump_rank0.txt", [Frame("/v/torch/autograd/graph.py", 979,
                                                                         "_engine_run_backward")]),
                              1: StackDump("stackdump_rank1.txt", [])},
                  taken_stacks=[TakenStack(11, 0, "RANK", "py-spy", "harness_stacks/rank0.txt", state="sleeping"),
                                TakenStack(12, 1, "RANK", "none", state=state, note="py-spy could not take its stack")],
                  last_heartbeat={0: Beat(3, "backward"), 1: Beat(3, "forward")})
    return _record(reason=STALLED, exit_code=None, stalled_s=30.0, evidence=ev)


def test_the_verdict_line_says_a_hung_rank_was_stopped_and_has_no_stack():
    """Rank 1 frozen by SIGSTOP: the finding said 'no stack; its process stopped, by SIGSTOP or a
    debugger', the verdict line only 'rank 1 hung (last heartbeat step 3, stage forward)'."""
    rec = _frozen("stopped")
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert "hung: rank 1 (no stack; its process stopped, by SIGSTOP or a debugger;" in stall.title, stall.title
    [rank] = stall.diagnosis.ranks
    assert rank.no_stack == NoStack.STOPPED and diagnose(rec) == stall.diagnosis
    assert verdict_line(rec) == f"rank 1 hung (stopped, no stack; last heartbeat step 3, stage forward) — {STALLED}"
    assert "two [default] (rank 1 hung (stopped, no stack; last heartbeat" in status_of([rec], [], find([rec]))[1]
    # a rank of no stack that was not stopped (py-spy failed on it) says only that it has none
    assert verdict_line(_frozen("sleeping")).startswith("rank 1 hung (no stack; last heartbeat step 3, stage forward) — ")


def test_the_status_line_counts_critical_findings_in_words_that_fit_their_number():
    """user13: one throughput cliff of one sweep point read '1 critical finding(s) across phase
    points: ...'; the count is now said in the singular or the plural, and the title names where."""
    from validation.judge.findings.finding import Finding, Severity

    passed = _record(Status.PASS, "2 gate(s) passed", exit_code=0)
    cliff = Finding(Severity.CRITICAL, "sweep", "throughput cliff in sweep at [batch_size=2]: 6.0 toks/s after 165.0")
    spike = Finding(Severity.CRITICAL, "two", "loss diverging in two [default]")
    verdict, reason = status_of([passed], [], [cliff])
    assert str(verdict) == "NO-GO" and reason == f"1 critical finding: {cliff.title}", reason
    _, reason = status_of([passed], [], [cliff, spike])
    assert reason == f"2 critical findings, the first: {cliff.title}", reason


def test_a_repeated_point_names_every_failed_repeat_and_the_rank_each_blames():
    """Repeat 1 of 3 crashed on rank 0 and repeat 2 on rank 1 (a trainer of mine under torchrun,
    run through the CLI): the status line read 'ddp [default] (rank 0 crashed ...: boom in repeat1
    on rank 0)' and the verdict line 'rank 0 crashed ... — repeat 1 of 3: trainer crashed', so a
    reader of either blamed rank 0 alone, the repeat 2 crash of rank 1 only in the findings. Both
    lines now name each failed repeat with the rank it blames, the deciding repeat first."""
    def evidence(rank: int) -> Evidence:
        other = 1 - rank
        return Evidence(rank_failures={rank: RankFailure(exception=f"RuntimeError: boom on rank {rank}", exit_code=1),
                                       other: RankFailure(exit_code=1, signal="SIGTERM")},
                        last_heartbeat={0: Beat(3, "forward"), 1: Beat(3, "forward")})

    crashed = "trainer crashed (exit code 1)"
    runs = [SubRun(f"repeat{k}", f"repeat {k} of 3", f"runs/two/repeat{k}", st, reason, exit_code=code,
                   evidence=ev)
            for k, st, reason, code, ev in ((1, Status.FAIL, crashed, 1, evidence(0)),
                                           (2, Status.FAIL, crashed, 1, evidence(1)),
                                           (3, Status.PASS, "1 gate(s) passed", 0, Evidence()))]
    rec = _record(reason=f"repeat 1 of 3: {crashed}", out_dir="runs/two/repeat1", runs=runs, evidence=evidence(0))
    one = "rank 0 crashed (last heartbeat step 3, stage forward): RuntimeError: boom on rank 0"
    two = "rank 1 crashed (last heartbeat step 3, stage forward): RuntimeError: boom on rank 1"
    assert verdict_line(rec) == f"repeat 1 of 3: {one} — {crashed}; repeat 2 of 3: {two} — {crashed}"
    verdict, reason = status_of([rec], [], find([rec]))
    assert verdict == "NO-GO" and reason == (
        f"1 of 1 phase point(s) failed: two [default] (repeat 1 of 3: {one}; repeat 2 of 3: {two})"), reason


def test_a_repeat_of_an_older_record_without_evidence_is_named_by_its_reason_alone():
    """A record of an older harness kept no evidence per repeat: its other failed repeat is named with
    its reason, never blamed on the ranks of the deciding repeat's evidence."""
    ev = Evidence(rank_failures={0: RankFailure(exception="RuntimeError: boom", exit_code=1)},
                  last_heartbeat={0: Beat(3, "forward")})
    runs = [SubRun("repeat1", "repeat 1 of 2", "runs/two/repeat1", Status.FAIL, "trainer crashed (exit code 1)"),
            SubRun("repeat2", "repeat 2 of 2", "runs/two/repeat2", Status.FAIL, "trainer crashed (exit code 1)")]
    rec = _record(reason="repeat 1 of 2: trainer crashed (exit code 1)", out_dir="runs/two/repeat1", runs=runs,
                  evidence=ev)
    assert verdict_line(rec) == ("repeat 1 of 2: rank 0 crashed (last heartbeat step 3, stage forward): "
                                 "RuntimeError: boom — trainer crashed (exit code 1); "
                                 "repeat 2 of 2: trainer crashed (exit code 1)")


def test_every_failed_point_in_the_summary_says_why(tmp_path):
    """A user pass: the Executive Summary said '1 of 1 phase point(s) failed: fagent_kill
    [default].' (likewise of a NaN, a CSV that stopped, steps that jumped) while it named the rank for a
    crash: a point no rank is blamed for gives its verdict's reason."""
    rec = PhaseRecord(PointKey("rb", "cpu", "two"), "rb/cpu/two/default", "train", Status.FAIL,
                      "node 1's torchrun agent was killed by SIGKILL (exit code -9)", exit_code=-9, world_size=2)
    _, reason = status_of([rec], [], [])
    assert reason == ("1 of 1 phase point(s) failed: two [default] (node 1's torchrun agent was killed by SIGKILL "
                      "(exit code -9))"), reason


def test_a_report_written_by_a_stopped_run_says_no_go_or_incomplete_never_go():
    """A run stopped by Ctrl-C wrote 'Status: GO' when every stored record had passed: the point it
    was re-running showed its earlier record (of the trainer's code before the edit being tested,
    it may be), so the report of a run that judged nothing new claimed GO. A failure stored stays
    NO-GO; the report `nsa-validate report` renders from the store alone is unchanged."""
    from validation.report.build import Interruption, Verdict

    passed = _record(Status.PASS, "", exit_code=0)
    cut = Interruption("SIGINT", ("rb/cpu/two/default",))
    assert status_of([passed], [], [])[0] == Verdict.GO
    verdict, reason = status_of([passed], [], [], interrupted=cut)
    assert verdict == Verdict.INCOMPLETE
    assert reason == ("the run that wrote this report was stopped by SIGINT before it judged every point it was asked "
                      "to run: no GO from its stored records (`nsa-validate report` renders the store alone)")
    assert status_of([_record()], [], [], interrupted=cut)[0] == Verdict.NO_GO


def test_the_status_line_counts_error_points_as_the_tables_do():
    """A user pass: a point of status ERROR read '1 of 1 phase point(s) failed' above a table whose
    FAIL column said 0 and ERROR 1."""
    error = _record(status=Status.ERROR, reason="tokens/s reads as one rank's rate")
    fail = _record(key=PointKey("rb", "cpu", "one"), test_id="rb/cpu/one/default")
    assert status_of([error], [], [])[1].startswith("1 of 1 phase point(s) failed (ERROR): two [default]")
    assert status_of([error, fail], [], [])[1].startswith("2 of 2 phase point(s) failed (1 of them ERROR): ")
    assert status_of([fail], [], [])[1].startswith("1 of 1 phase point(s) failed: one [default]")
