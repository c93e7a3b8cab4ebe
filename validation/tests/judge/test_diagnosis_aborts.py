"""Who is blamed where a rank exited 0 early and another, whose collective then broke, caught the
error, printed it and called sys.exit(1), as many trainers do: its interpreter's exit then aborted
on the broken gloo group's threads ('terminate called without an active exception', SIGABRT), and
the verdict named it alone as having crashed: 'rank 0 crashed (...): killed by SIGABRT', with advice
to look for who sent the signal. Judged from the files a real two-rank gloo run of a trainer of one's
own left (validation/tests/evidence/abort2_*: torchrun's log trimmed of its own traceback's frames,
the heartbeats); nothing runs here. A SIGABRT that no broken collective's error comes before is a
rank's own failure still, and is blamed on it."""
from __future__ import annotations

from pathlib import Path

import pytest

from validation.contract.files import read_heartbeats
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: torchrun x2, gloo, a trainer of one's own (not in this repository): rank 1 destroys its
#: process group as step 3 starts and exits 0 two seconds later (sys.exit); rank 0 catches its broken
#: all_reduce, prints 'error: <the RuntimeError>' and calls sys.exit(1), and its exit aborts (about one
#: run in five: the others exit 1). torchrun saw rank 0 fail first and ended rank 1, still exiting,
#: with SIGTERM.
SIGTERMED = EVIDENCE / "abort2_leaver_sigtermed"
#: torchrun's report of rank 1's SIGTERM in that log
_RANK1_FAILURE = """[1]:
  time      : 2026-11-28_02:53:09
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 4149)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4149
"""
_ERROR = SIGTERMED.joinpath("trainer.stderr.log").read_text().splitlines()[0]
_TERMINATE = "terminate called without an active exception"


def _record(tmp_path: Path | None, log: str | None = None) -> PhaseRecord:
    """A record of the run in SIGTERMED, with ``log`` for its torchrun log where given."""
    path = SIGTERMED / "trainer.stderr.log"
    if log is not None:
        path = tmp_path / "trainer.stderr.log"
        path.write_text(log)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(SIGTERMED).items()})
    return PhaseRecord(PointKey("abort2", "cpu", "quit_rank"), "abort2/cpu/quit_rank/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=2, exit_code=1, evidence=ev, trainer="myt")


def _log() -> str:
    return (SIGTERMED / "trainer.stderr.log").read_text()


def test_a_rank_whose_exit_aborted_after_its_collective_broke_is_named_beside_the_rank_that_left():
    """The recorded run: rank 0's SIGABRT follows its printed 'Connection closed by peer' and the C++
    runtime's abort line, so it failed after its peer; rank 1, SIGTERMed by torchrun once rank 0 had
    failed and behind it in its heartbeats, may have left first: both are named, and that which came
    first cannot be told. Once 'rank 0 crashed (last heartbeat step 3, stage forward): killed by SIGABRT'."""
    rec = _record(None)
    f0 = rec.evidence.rank_failures[0]
    assert f0.signal == "SIGABRT" and rec.evidence.rank_failures[1].signal == "SIGTERM", rec.evidence.rank_failures
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [0], verdict_line(rec)
    assert c.or_else is not None and c.or_else.kind == Kind.LEFT and [r.rank for r in c.or_else.ranks] == [1], c
    assert verdict_line(rec).startswith(
        "rank 0 crashed (last heartbeat step 3, stage forward): killed by SIGABRT after a collective broke (error: "
        "Connection closed by peer [127.0.0.1]:5860), or rank 1 exited 0 early (last heartbeat step 2, stage step) "
        "and the others failed after it: which came first cannot be told"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    [advice] = recommendations([crash])
    assert "rank 1 may have exited 0 early" in advice and "who sent it" not in advice, advice
    assert "Connection closed by peer" in (f0.broken_collective or ""), f0


def test_a_rank_whose_exit_aborted_after_its_collective_broke_yields_to_one_torchrun_saw_exit_0(tmp_path):
    """The same log where torchrun saw rank 1's exit 0 before rank 0 failed (it lists no failure of
    rank 1): rank 1 left, and it alone is named."""
    rec = _record(tmp_path, _log().replace(_RANK1_FAILURE, "  <NO_OTHER_FAILURES>\n"))
    assert 1 not in rec.evidence.rank_failures, rec.evidence.rank_failures  # the evidence is as said
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.LEFT and [r.rank for r in c.ranks] == [1] and c.or_else is None, c
    assert verdict_line(rec).startswith("rank 1 exited 0 early (last heartbeat step 2, stage step)"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert crash.kind == "departed" and "rank 0: killed by SIGABRT" not in crash.title, crash.title
    assert ("rank 0: last heartbeat step 3, stage forward; killed by SIGABRT after a collective broke "
            "(error: Connection closed by peer [127.0.0.1]:5860)") in crash.detail, crash.detail


_ABORTED = f"aborted itself (SIGABRT after {_TERMINATE!r})"


@pytest.mark.parametrize("case, log, kind, cause", [
    ("no error, no abort line", lambda t: t.replace(_ERROR + "\n", "").replace(_TERMINATE + "\n", ""), Kind.KILLED,
     "killed by SIGABRT"),
    ("an abort line, no error", lambda t: t.replace(_ERROR + "\n", ""), Kind.ABORTED, _ABORTED),
    ("the abort line before the error", lambda t: t.replace(f"{_ERROR}\n{_TERMINATE}\n", f"{_TERMINATE}\n{_ERROR}\n"),
     Kind.ABORTED, _ABORTED),
    ("an error, no abort line", lambda t: t.replace(_TERMINATE + "\n", ""), Kind.KILLED, "killed by SIGABRT"),
])
def test_a_sigabrt_that_no_broken_collective_explains_is_blamed_on_its_rank(tmp_path, case, log, kind, cause):
    """A rank's own abort (os.abort, a failed C++ check, a joinable thread of its own) breaks the
    others' collectives after it, and their error may be printed after its abort line; a broken
    collective's error with no abort line may be another rank's print: none of these is taken for an
    exit after a broken collective, and the SIGABRT is rank 0's own, named alone: with the C++
    runtime's abort line in the log, it aborted itself; without, a signal of unknown sender."""
    rec = _record(tmp_path, log(_log()))
    assert rec.evidence.rank_failures[0].broken_collective is None, (case, rec.evidence.rank_failures)
    c = diagnose(rec)
    assert c is not None and c.kind == kind and [r.rank for r in c.ranks] == [0] and c.or_else is None, case
    assert (c.cause, c.step, c.stage) == (cause, 3, "forward"), c
    assert verdict_line(rec).startswith(f"rank 0 crashed (last heartbeat step 3, stage forward): {cause} — "), \
        (case, verdict_line(rec))


def test_more_aborted_ranks_than_abort_lines_after_the_error_discount_none(tmp_path):
    """Ranks 0 and 1 both killed by SIGABRT before torchrun's agent signalled either (its line of a
    SIGTERM of rank 1 left out), one abort line after the error: which of them aborted on its own the
    log cannot say, so neither is taken for an exit after a broken collective."""
    log = _log().replace(_RANK1_FAILURE, _RANK1_FAILURE.replace("-15 (pid: 4149)  (SIGTERM)",
                                                             "-6 (pid: 4149)  (SIGABRT)"))
    log = "".join(ln for ln in log.splitlines(keepends=True) if "Sending process 4149" not in ln)
    failures = rank_failures(_write(tmp_path, log))
    assert [f.signal for _, f in sorted(failures.items())] == ["SIGABRT", "SIGABRT"], failures
    assert all(f.broken_collective is None and f.own for f in failures.values()), failures
    both = rank_failures(_write(tmp_path, log.replace(_TERMINATE + "\n", f"{_TERMINATE}\n{_TERMINATE}\n")))
    assert all(f.broken_collective is not None and not f.own for f in both.values()), both


def _write(tmp_path: Path, log: str) -> Path:
    path = tmp_path / "trainer.stderr.log"
    path.write_text(log)
    return path


def test_the_node_finding_of_an_abort_after_a_broken_collective_says_so_beside_the_rank_that_may_have_left():
    """The recorded run over two nodes (rank 0 on node 0, rank 1 on node 1): the node finding said
    "node 0's rank 0 was killed by SIGABRT", a signal of its own."""
    rec = _record(None)
    rec.evidence.nodes = NodesEvidence("torchrun", "localhost:1", 6.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", None, None, 0, [0]),
        NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])
    [node] = [f for f in find([rec]) if f.kind == "node_failed"]
    assert node.title.startswith(
        "node 0's rank 0 failed: killed by SIGABRT after a collective broke (error: Connection closed "
        "by peer [127.0.0.1]:5860) in quit_rank [default] (log node0.stderr.log), or node 1's rank 1 exited 0 early "
        "(last heartbeat step 2 of 8, stage step) and it failed after it: which came first cannot be told"), node.title


def test_three_ranks_one_aborting_after_its_broken_collective_name_the_leaver_beside_the_others(tmp_path):
    """Three ranks (validation/tests/evidence/swallow3_two_silent: rank 2 left slowly and torchrun
    SIGTERMed it, ranks 0 and 1 caught their broken all_reduce and exited 1), edited so that rank 1
    printed gloo's error and its exit aborted, as in the two-rank run (no three-rank run of ours
    aborted: torchrun ended the others once the first exited 1). Without the abort read as an exit
    after a broken collective, 'rank 1 crashed (...): killed by SIGABRT' alone; now ranks 0 and 1 are
    named as in the recorded run without the abort, beside rank 2, and which came first cannot be told."""
    run = EVIDENCE / "swallow3_two_silent"
    log = (run / "trainer.stderr.log").read_text()
    log = log.replace("rank 1: lost a peer, giving up\n", f"{_ERROR}\n{_TERMINATE}\n")
    log = log.replace("exitcode  : 1 (pid: 23115) ", "exitcode  : -6 (pid: 23115)  (SIGABRT)")
    ev = Evidence(rank_failures=rank_failures(_write(tmp_path, log)), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(run).items()})
    rec = PhaseRecord(PointKey("swallow3", "cpu", "quit_rank"), "swallow3/cpu/quit_rank/default", "train",
                      Status.FAIL, "trainer crashed (exit code 1)", steps=8, world_size=3, exit_code=1, evidence=ev,
                      trainer="myt")
    assert ev.rank_failures[1].signal == "SIGABRT" and ev.rank_failures[2].signal == "SIGTERM", ev.rank_failures
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.CRASHED and [r.rank for r in c.ranks] == [0, 1], verdict_line(rec)
    assert c.or_else is not None and [r.rank for r in c.or_else.ranks] == [2], verdict_line(rec)
    aborted = "rank 1 crashed (last heartbeat step 3, stage forward): killed by SIGABRT after a collective broke"
    assert aborted in verdict_line(rec), verdict_line(rec)
    assert "which came first cannot be told" in verdict_line(rec), verdict_line(rec)


def _run(name: str, steps: int = 12) -> PhaseRecord:
    """A record of a recorded two-rank gloo run of a trainer of one's own (validation/tests/evidence/NAME:
    torchrun's log with its paths cut, the heartbeats; recorded with torch 2.13, 12 steps)."""
    run = EVIDENCE / name
    ev = Evidence(rank_failures=rank_failures(run / "trainer.stderr.log"), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in read_heartbeats(run).items()})
    return PhaseRecord(PointKey("myt", "cpu", name), f"myt/cpu/{name}/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=steps, world_size=2, exit_code=1, evidence=ev,
                       trainer="myt")


def test_a_rank_whose_exit_aborted_after_its_last_step_aborted_itself_and_no_one_killed_it():
    """abort2_at_exit_after_steps: both ranks did all 12 steps; rank 0's interpreter's exit then aborted
    ('terminate called without an active exception', Python's report of it listing no Python frame).
    It read 'rank 0 crashed (...): killed by SIGABRT', with advice to find who sent the signal (the
    OOM killer, someone's kill): the OOM killer sends SIGKILL, and a SIGABRT after the C++ runtime's
    line is the process aborting itself."""
    rec = _run("abort2_at_exit_after_steps")
    f0 = rec.evidence.rank_failures[0]
    assert (f0.signal, f0.aborted, f0.at_exit) == ("SIGABRT", _TERMINATE, True), f0
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.ABORTED and [r.rank for r in c.ranks] == [0], c
    assert verdict_line(rec).startswith(
        f"rank 0 crashed (last heartbeat step 12, stage step): aborted itself (SIGABRT after {_TERMINATE!r}) at the "
        "interpreter's exit (no Python frame running), after its last step — "), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert crash.kind == "aborted", crash
    [advice] = recommendations([crash])
    assert "out-of-memory" not in advice and "who sent" not in advice, advice
    assert "destroy_process_group()" in advice and "aborted itself" in advice, advice


def test_a_rank_that_exited_early_and_aborted_at_exit_is_said_to_have_exited_early():
    """abort2_quit_at_exit: rank 1 called sys.exit(0) as step 4 of 12 began; its interpreter's exit aborted
    (no Python frame running), and torchrun then ended rank 0, still in step 4, with SIGTERM. The abort
    was its end, not its cause: it read 'rank 1 crashed (...): killed by SIGABRT'. Its heartbeats stop
    at step 3 of 12 and its abort came after its code had ended: it exited early."""
    rec = _run("abort2_quit_at_exit")
    f1 = rec.evidence.rank_failures[1]
    assert (f1.signal, f1.aborted, f1.at_exit) == ("SIGABRT", _TERMINATE, True), f1
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.QUIT and [r.rank for r in c.ranks] == [1], c
    assert verdict_line(rec).startswith(
        "rank 1 exited early (last heartbeat step 3, stage step): its heartbeats stop at step 3 of 12, and it then "
        f"aborted itself (SIGABRT after {_TERMINATE!r}) at the interpreter's exit"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert crash.kind == "quit" and "rank 1 exited early: its heartbeats stop at step 3 of 12" in crash.title, crash
    [advice] = recommendations([crash])
    assert "stop condition that holds on that rank only" in advice and "destroy_process_group()" in advice, advice
    assert "out-of-memory" not in advice, advice


def test_an_abort_with_a_python_frame_before_the_last_step_is_the_ranks_own_crash(tmp_path):
    """The same log where Python's report of the abort lists a frame of the trainer's (it aborted
    while its code ran, mid-run): no early exit is known, and rank 1 aborted itself."""
    log = (EVIDENCE / "abort2_quit_at_exit" / "trainer.stderr.log").read_text()
    log = log.replace("  <no Python frame>", '  File "mytrain.py", line 99 in main')
    rec = _run("abort2_quit_at_exit")
    rec.evidence.rank_failures = rank_failures(_write(tmp_path, log))
    assert rec.evidence.rank_failures[1].at_exit is False
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.ABORTED and c.cause == f"aborted itself (SIGABRT after {_TERMINATE!r})", c
