"""A run that torchrun --max-restarts started again into the same log is judged by its last
attempt: the ranks' ends are read from the part of the log after the attempt before it ended (its
agent's failure line per attempt), and each earlier attempt's failure is said as that attempt's.
The crash finding once joined the last attempt's exit (SIGKILL) to the first attempt's exception,
read from the whole log: 'rank 1: RuntimeError: ...', a cause no process of the run's end had. The
log is a user's two-rank run of a trainer of their own; nothing runs here."""
from __future__ import annotations

from pathlib import Path

from validation.contract.torchrun_log import AttemptEnd, rank_failures
from validation.judge.evidence import collect
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Status

_AGENT = "E1206 01:04:1{i}.920000 16491 torch/distributed/elastic/multiprocessing/api.py:1002] "
_SIGNAL = "W1206 01:04:1{i}.888000 16491 torch/distributed/elastic/multiprocessing/api.py:1028] "
_RAISED = "RuntimeError: shard 7 is truncated at step 12"

#: attempt 1: rank 1 raises at step 12, the agent ends rank 0; attempt 2: rank 1 is killed by
#: SIGKILL (the out-of-memory killer's), the agent ends rank 0, and torchrun gives up: its summary
LOG = "".join(f"[rank1]: {ln}\n" for ln in [
    "Traceback (most recent call last):",
    '  File "/home/u/mine/mytrain.py", line 88, in <module>',
    "    batch = next(shards)",
    _RAISED]) + (_SIGNAL.format(i=1) + "Sending process 701 closing signal SIGTERM\n"
                 + _AGENT.format(i=1) + "failed (exitcode: 1) local_rank: 1 (pid: 702) of binary: /home/u/.venv/bin/python3\n"
                 + _SIGNAL.format(i=7) + "Sending process 703 closing signal SIGTERM\n"
                 + _AGENT.format(i=7) + "failed (exitcode: -9) local_rank: 1 (pid: 704) of binary: /home/u/.venv/bin/python3\n"
                 ) + """\
Traceback (most recent call last):
  File "/home/u/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
/home/u/mine/mytrain.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-06_01:04:17
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 703)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 703
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_01:04:17
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 704)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 704
============================================================
"""


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
    assert rec.evidence.attempts == [AttemptEnd(1, 1, 702, 1, _RAISED, restarted=True),
                                     AttemptEnd(2, 1, 704, -9)], rec.evidence.attempts
    assert verdict_line(rec).startswith("rank 1 crashed (no heartbeat written): killed by SIGKILL"), verdict_line(rec)
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title == "crash in ddp [default]: exit code 1: rank 1: killed by SIGKILL", crash.title
    assert "shard 7" not in " ".join(crash.detail[:-1]), crash.detail
    assert crash.detail[-1] == ("earlier attempts, each followed by torchrun starting the workers again "
                                "(trainer.stderr.log): attempt 1 ended as local rank 1 (pid 702) failed: "
                                f"{_RAISED}"), crash.detail


def test_a_run_that_was_not_restarted_reads_as_it_did(tmp_path):
    """The second attempt's lines taken out: one attempt, whose exception is rank 1's end, and no
    word of earlier attempts."""
    once = LOG.replace(_SIGNAL.format(i=7) + "Sending process 703 closing signal SIGTERM\n", "").replace(
        _AGENT.format(i=7) + "failed (exitcode: -9) local_rank: 1 (pid: 704) of binary: /home/u/.venv/bin/python3\n", "")
    once = once.replace("exitcode  : -9 (pid: 704)  (SIGKILL)", "exitcode  : 1 (pid: 702)").replace(
        "(pid: 703)", "(pid: 701)")
    rec = _record(tmp_path, once)
    assert rec.evidence.rank_failures[1].exception == _RAISED and rec.evidence.rank_failures[1].exit_code == 1
    assert rec.evidence.attempts == [AttemptEnd(1, 1, 702, 1, _RAISED)], rec.evidence.attempts
    [crash] = [x for x in find([rec]) if x.title.startswith("crash in")]
    assert crash.title.startswith(f"crash in ddp [default]: exit code 1: rank 1: {_RAISED}, at "), crash.title
    assert not any(d.startswith("earlier attempts") for d in crash.detail), crash.detail
