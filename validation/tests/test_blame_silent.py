"""Who is blamed where a rank exited 0 early and another, whose collective then broke, caught the
error and exited 1 with no traceback (its own message only): judged from the files a real
three-rank gloo run of a trainer of one's own left (torchrun's log trimmed of its own traceback's
frames, the heartbeats' last records; nothing runs here). The rank that exited non-zero silently
is no failure in its own right once a rank that torchrun lists no failure of had left before the
steps asked for: the one that left is named."""
from __future__ import annotations

import json
from pathlib import Path

from validation.contract.torchrun_log import rank_failures
from validation.judge.findings import find, recommendations
from validation.judge.findings.culprit import Did
from validation.judge.findings.headline import culprit, verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

#: MYT_FAULT=return:1@3 (rank 1 returns from main as step 3 starts), every other rank catches its
#: broken all_gather, prints one line and exits 1; torchrun x3, gloo (2026-11-27)
SWALLOWED = """rank 2: lost a peer, giving up
rank 0: lost a peer, giving up
W1127 23:26:59.306000 4064 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 4077 closing signal SIGTERM
E1127 23:26:59.326000 4064 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 4075) of binary: /venv/bin/python3
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
/tmp/b13/myt/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_23:26:59
  host      : localhost
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 4077)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4077
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_23:26:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4075) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
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
    c = culprit(rec)
    assert c is not None and c.did == Did.LEFT and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert verdict_line(rec).startswith("rank 1 exited 0 early (last heartbeat step 2, stage step)"), verdict_line(rec)
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    assert crash.kind == "departed", crash
    assert "rank 1 exited 0 early (last heartbeat step 2 of 8, stage step)" in crash.title, crash.title
    assert "rank 0: exit code 1" not in crash.title, crash.title
    assert "rank 0: last heartbeat step 3, stage forward; exit code 1" in crash.detail, crash.detail
    [advice] = recommendations([crash])
    assert "exited 0 before the steps asked for" in advice and "Rank 0 exited with code 1" not in advice, advice


def test_a_silent_exit_with_every_rank_accounted_for_is_still_the_one_named(tmp_path):
    """The same silent exit of rank 0 where torchrun lists every other rank (SIGTERMed once rank 0
    had failed): no rank left, and rank 0 is the rank that failed first."""
    every = SWALLOWED.replace("Failures:\n", "Failures:\n[2]:\n  time      : 2026-11-27_23:26:59\n"
                              "  host      : localhost\n  rank      : 1 (local_rank: 1)\n"
                              "  exitcode  : -15 (pid: 4076)  (SIGTERM)\n  error_file: <N/A>\n"
                              "  traceback : Signal 15 (SIGTERM) received by PID 4076\n")
    rec = _record(tmp_path, every)
    c = culprit(rec)
    assert c is not None and c.did == Did.CRASHED and [r.rank for r in c.ranks] == [0], verdict_line(rec)
