"""Who is blamed where one rank hung and the others' NCCL watchdog took them down: their collective
timed out waiting for it ('Watchdog caught collective operation timeout'), the watchdog threw
c10::DistBackendError and the C++ runtime aborted the process (SIGABRT); torchrun then ended the hung
rank, still running, with SIGTERM. The verdict named the rank that waited as having crashed ('rank 1
crashed (...): killed by SIGABRT', with advice to look for the out-of-memory killer), and the one that
hung not at all; on gloo, whose collective raises in the ranks that waited ('Timed out waiting 10000ms
for recv operation to complete'), no rank was named. Judged from the files real two- and four-rank NCCL
and three-rank gloo runs of a trainer of one's own left (validation/tests/evidence/nccl2_watchdog_*,
nccl4_watchdog_*, gloo3_timeout_*: torchrun's whole log and the heartbeats; nothing runs here).
A watchdog that took its rank down for a fault of its own (a CUDA error) still blames that rank."""
from __future__ import annotations

import re
from pathlib import Path

from validation.contract.files import read_heartbeats
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.failed import root_of_evidence
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

EVIDENCE = Path(__file__).parents[1] / "evidence"
#: torchrun x2, NCCL 2.28.9, torch 2.11.0+cu130, two H200s, a trainer of one's own (not in
#: this repository): init_process_group("nccl", timeout=15 s); every step writes heartbeats of stage
#: forward, backward (before an all_reduce and .item()) and step. Rank 0 sleeps as step 3 starts
#: (stage forward); rank 1's all_reduce times out, its watchdog dumps its debug info (a minute) and
#: aborts it (SIGABRT); torchrun ends rank 0 with SIGTERM. Rank 1's .item() returned once the
#: communicator was aborted, so its heartbeats go on to step 4.
RANK0_HUNG = EVIDENCE / "nccl2_watchdog_rank0_hung"
#: the same with rank 1 asleep: rank 0's next all_reduce raised DistBackendError ('NCCL communicator
#: was aborted on rank 0.') before the watchdog's abort came (SIGABRT all the same)
RANK1_HUNG = EVIDENCE / "nccl2_watchdog_rank1_hung"
_TERM0 = """  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 803)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 803
"""


def _record(run: Path, log: str | None = None, beats: dict[int, list[dict]] | None = None,
            tmp_path: Path | None = None, world: int = 2) -> PhaseRecord:
    """A record of the run in ``run``, with ``log`` for its torchrun log and ``beats`` for its heartbeats
    where given."""
    path = run / "trainer.stderr.log"
    if log is not None:
        path = tmp_path / "trainer.stderr.log"
        path.write_text(log)
    records = beats if beats is not None else read_heartbeats(run)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in records.items()})
    return PhaseRecord(PointKey("nccl2", "h100", "hang"), "nccl2/h100/hang/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", steps=8, world_size=world, exit_code=1, evidence=ev,
                       trainer="myt")


def test_the_rank_the_watchdog_waited_for_is_named_hung_not_the_rank_it_aborted():
    """The recorded run: rank 1's SIGABRT is its NCCL watchdog's, after its all_reduce timed out waiting
    for rank 0; rank 0, asleep at step 3 (stage forward), was ended by torchrun's SIGTERM. Rank 0 hung
    and is named so; rank 1 is no crash of its own. Once 'rank 1 crashed (last heartbeat step 4, stage
    backward): killed by SIGABRT', with advice to look for who sent the signal."""
    rec = _record(RANK0_HUNG)
    f0, f1 = rec.evidence.rank_failures[0], rec.evidence.rank_failures[1]
    assert f0.signal == "SIGTERM" and f1.signal == "SIGABRT" and not f1.exception, rec.evidence.rank_failures
    assert f1.nccl_watchdog is not None and "Watchdog caught collective operation timeout" in f1.nccl_watchdog, f1
    assert not f1.own and root_of_evidence(rec.evidence) is None, f1
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [0], verdict_line(rec)
    assert verdict_line(rec).startswith(
        "rank 0 hung (last heartbeat step 3, stage forward): rank 1 gave up waiting for it in a collective (rank 1: "
        "its NCCL watchdog: timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=15000) "
        "ran for 15085 milliseconds before timing out.)"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert crash.kind == "waited" and "rank 1: killed by SIGABRT" not in crash.title, crash.title
    assert any(d.startswith("rank 1: last heartbeat step 4, stage backward; killed by SIGABRT by its NCCL watchdog")
               for d in crash.detail), crash.detail
    [advice] = recommendations([crash])
    assert "who sent it" not in advice and "stall_s below the process group's timeout" in advice, advice


def test_a_rank_whose_collective_raised_after_its_watchdog_gave_up_names_the_rank_it_waited_for():
    """The recorded run with rank 1 asleep: rank 0 raised DistBackendError (a peer's failure, not its
    own) and was aborted; rank 1, ended by torchrun's SIGTERM at step 3 (stage forward), is named hung.
    Once the verdict named no rank at all ('trainer crashed (exit code 1)')."""
    rec = _record(RANK1_HUNG)
    f0 = rec.evidence.rank_failures[0]
    assert f0.exception and "DistBackendError" in f0.exception and f0.nccl_watchdog is not None, f0
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 hung (last heartbeat step 3, stage forward): rank 0 gave up waiting "
                                        "for it in a collective (rank 0: its NCCL watchdog: timeout:"), \
        verdict_line(rec)


def test_the_watchdog_of_a_torch_that_prefixes_no_rank_is_read_from_the_default_group_rank(tmp_path):
    """A torch whose C++ log lines carry no '[rank1]:' prefix: the abort's own line names the default
    process group's rank ('what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread
    terminated with exception: ...'), which is the global rank; the verdict is the same."""
    log = re.sub(r"^\[rank\d+\]:(?=\[[EWI])", "", (RANK0_HUNG / "trainer.stderr.log").read_text(), flags=re.M)
    assert "[rank1]:[E" not in log and "(default_pg) Rank 1] Process group watchdog" in log
    rec = _record(RANK0_HUNG, log, tmp_path=tmp_path)
    assert rec.evidence.rank_failures[1].nccl_watchdog is not None, rec.evidence.rank_failures
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [0], verdict_line(rec)


def test_a_watchdog_that_aborted_its_rank_for_a_fault_of_its_own_blames_that_rank(tmp_path):
    """The watchdog also takes a rank down for an error of the rank's own work (a CUDA error in its
    kernels): that abort is the rank's own failure, and it is blamed as before."""
    log = (RANK0_HUNG / "trainer.stderr.log").read_text()
    log = re.sub(r"Watchdog caught collective operation timeout: WorkNCCL\(.*?\) ran for \d+ milliseconds before "
                 r"timing out\.", "CUDA error: an illegal memory access was encountered", log)
    rec = _record(RANK0_HUNG, log, tmp_path=tmp_path)
    f1 = rec.evidence.rank_failures[1]
    assert f1.nccl_watchdog is None and f1.own, f1
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.KILLED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert (c.cause, c.step, c.stage, c.logs) == ("killed by SIGABRT", 4, "backward", ("/trainer.stderr.log",)), c
    assert "killed by SIGABRT" in verdict_line(rec), verdict_line(rec)


def _three_ranks(log: str, rank0_stage: str) -> tuple[str, dict[int, list[dict]]]:
    """The recorded run as three ranks: rank 2 asleep at step 3 (rank 0's recorded heartbeats), rank 0
    waiting in step 3 at ``rank0_stage`` and ended by torchrun's SIGTERM as rank 2 was (the agent's line
    that says so beside its SIGTERM of rank 0), rank 1 aborted."""
    term2 = _TERM0.replace("rank      : 0 (local_rank: 0)", "rank      : 2 (local_rank: 2)").replace("803", "805")
    log = log.replace(_TERM0, _TERM0 + "[2]:\n  time      : 2026-11-28_04:59:59\n  host      : localhost\n" + term2)
    agent = "torch/distributed/elastic/multiprocessing/api.py:1012] Sending process"
    log = log.replace(f"{agent} 803 closing signal SIGTERM\n", f"{agent} 803 closing signal SIGTERM\n"
                      f"W1128 04:59:59.664000 761 {agent} 805 closing signal SIGTERM\n")
    recorded = read_heartbeats(RANK0_HUNG)
    rank0 = [*recorded[0][:-1], {**recorded[0][-1], "stage": rank0_stage}]
    return log, {0: rank0, 1: recorded[1], 2: [{**b, "rank": 2} for b in recorded[0]]}


def test_of_three_ranks_the_one_furthest_behind_of_those_still_running_is_named(tmp_path):
    """Three ranks, rank 2 hung: rank 1's watchdog aborted it, and torchrun ended ranks 0 and 2 with
    SIGTERM. Rank 0 had reached the collective (stage backward of step 3), rank 2 had not (stage
    forward): rank 2 is named, rank 0 is not."""
    log, beats = _three_ranks((RANK0_HUNG / "trainer.stderr.log").read_text(), "backward")
    rec = _record(RANK0_HUNG, log, beats, tmp_path, world=3)
    assert sorted(rec.evidence.rank_failures) == [0, 1, 2], rec.evidence.rank_failures
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [2], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 2 hung (last heartbeat step 3, stage forward)"), verdict_line(rec)


def test_of_three_ranks_two_still_running_alike_name_none_hung(tmp_path):
    """As above with rank 0's heartbeat where rank 2's is: nothing tells which of them the watchdog
    waited for, and neither is named; nor is rank 1, whose abort was its watchdog's."""
    log, beats = _three_ranks((RANK0_HUNG / "trainer.stderr.log").read_text(), "forward")
    rec = _record(RANK0_HUNG, log, beats, tmp_path, world=3)
    assert diagnose(rec) is None, verdict_line(rec)
    assert verdict_line(rec) == "trainer crashed (exit code 1)", verdict_line(rec)


#: torchrun x3, gloo, the process group's timeout 10 s: rank 1 sleeps as step 3 starts
#: (stage data); ranks 0 and 2 raise gloo's 'Timed out waiting 10000ms for recv (send) operation to
#: complete' in their all_reduce, and torchrun's agent ends rank 1, still asleep, and rank 2 with SIGTERM
GLOO_TIMEOUT = EVIDENCE / "gloo3_timeout_rank1_hung"


def test_on_gloo_the_rank_whose_peers_collective_timed_out_waiting_for_it_is_named_hung():
    """The gloo form of the same: the ranks that waited raise (a peer's failure, not their own) and
    the one torchrun ended, still running and furthest behind, is named hung. Once the verdict named no
    rank and the finding's title was rank 2's 'Timed out waiting 10000ms for send operation'."""
    rec = _record(GLOO_TIMEOUT, world=3)
    f = rec.evidence.rank_failures
    assert f[0].gave_up_waiting == "RuntimeError: Timed out waiting 10000ms for recv operation to complete", f[0]
    assert f[1].signal == "SIGTERM" and f[1].by_agent and root_of_evidence(rec.evidence) is None, f
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith(
        "rank 1 hung (last heartbeat step 3, stage data): ranks 0, 2 gave up waiting for it in a collective (rank 0: "
        "RuntimeError: Timed out waiting 10000ms for recv operation to complete)"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.kind == "waited" and crash.title.startswith("crash in hang [default]: exit code 1: rank 1 hung: "), \
        crash.title


#: GLOO_TIMEOUT's run where ranks 0 and 2 catch the error, print 'rank 0: lost a peer, giving up: <it>' and
#: exit 1 (sys.exit), as many trainers do: torchrun reports them as exit code 1, no traceback
CAUGHT = EVIDENCE / "gloo3_timeout_caught_rank1_hung"


def test_ranks_that_caught_their_collectives_timeout_and_exited_1_name_the_rank_they_waited_for():
    """Each silent exit follows a printed gloo timeout (two lines for two exits): they waited for a peer
    that was there and never came, and rank 1, ended by torchrun and furthest behind, is named hung.
    Once the verdict named no rank ('trainer crashed (exit code 1)')."""
    rec = _record(CAUGHT, world=3)
    f = rec.evidence.rank_failures
    assert f[0].caught_timeout and f[2].caught_timeout and not f[0].silent and not f[2].silent, f
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 hung (last heartbeat step 3, stage data): ranks 0, 2 gave up waiting "
                                        "for it in a collective"), verdict_line(rec)


def test_a_silent_exit_that_no_printed_timeout_accounts_for_stays_the_ranks_own(tmp_path):
    """One printed timeout for two silent exits: the log does not say whose it is, so neither exit is
    taken for a caught timeout, and rank 1 is not named hung."""
    log = (CAUGHT / "trainer.stderr.log").read_text()
    log = "".join(ln for ln in log.splitlines(keepends=True) if not ln.startswith("rank 2: lost a peer"))
    rec = _record(CAUGHT, log, tmp_path=tmp_path, world=3)
    assert all(f.caught_timeout is None for f in rec.evidence.rank_failures.values()), rec.evidence.rank_failures
    assert rec.evidence.rank_failures[0].silent and rec.evidence.rank_failures[2].silent
    c = diagnose(rec)
    assert c is None or c.kind != Kind.HUNG, verdict_line(rec)


#: torchrun x4, NCCL 2.28.9, torch 2.11.0+cu130, four H200s, the same trainer: rank 2 sleeps
#: as step 3 starts; the watchdogs of ranks 0, 1 and 3 catch the timeout; rank 1's aborts it first
#: (SIGABRT), and torchrun ends ranks 0 and 2 with SIGTERM and finds rank 3 aborted too
FOUR = EVIDENCE / "nccl4_watchdog_rank2_hung"


def test_of_four_ranks_the_one_no_watchdog_waited_in_is_named_hung_and_the_others_say_how_they_ended():
    """Rank 0 was SIGTERMed like rank 2, but its own watchdog had given up waiting: rank 2 alone is named.
    Rank 0's end is torchrun's SIGTERM, its watchdog's word beside it (not 'killed by SIGTERM by its NCCL
    watchdog'); rank 3's abort is its watchdog's."""
    rec = _record(FOUR, world=4)
    f = rec.evidence.rank_failures
    assert all(f[k].nccl_watchdog for k in (0, 1, 3)) and f[2].nccl_watchdog is None, f
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [r.rank for r in c.ranks] == [2], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 2 hung (last heartbeat step 3, stage forward): ranks 0, 1, 3 gave up "
                                        "waiting for it in a collective"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert any(d.startswith("rank 0: last heartbeat step 4, stage backward; killed by SIGTERM from torchrun's agent, "
                            "its NCCL watchdog having given up on a collective (Watchdog caught") for d in crash.detail), \
        crash.detail
    assert any(d.startswith("rank 3: last heartbeat step 4, stage backward; killed by SIGABRT by its NCCL watchdog")
               for d in crash.detail), crash.detail
