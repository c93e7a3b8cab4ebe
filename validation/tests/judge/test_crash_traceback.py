"""A crashed rank's own exception is quoted with where the trainer's code was when it was raised
(the innermost frame of its traceback outside installed packages and the standard library), and its
own traceback is kept for the report: torchrun's log ends in its agent's ChildFailedError, which
says nothing of why. The log is a user's two-rank gloo run resumed from a truncated checkpoint."""
from __future__ import annotations

from pathlib import Path

from validation.contract.stacks import Frame
from validation.contract.torchrun_log import rank_failures
from validation.judge.evidence import collect
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Status
from validation.tests.torchrun_summary import Failed, child_failed

_VENV = "/home/u/.venv/lib/python3.11/site-packages/torch"


def _rank_traceback(rank: int) -> str:
    return "".join(f"[rank{rank}]: {ln}\n" for ln in [
        "Traceback (most recent call last):",
        '  File "/home/u/mine/mytrain.py", line 49, in <module>',
        "    st = torch.load(ck, weights_only=False)",
        "         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f'  File "{_VENV}/serialization.py", line 1568, in load',
        "    with _open_zipfile_reader(opened_file) as opened_zipfile:",
        f'  File "{_VENV}/serialization.py", line 807, in __init__',
        "    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))",
        "OSError: [Errno 22] Invalid argument"])


#: rank 1's traceback, then rank 0's, then torchrun's agent: its own traceback and summary
LOG = _rank_traceback(1) + _rank_traceback(0) + """\
W1206 01:04:14.888000 16491 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 16496 closing signal SIGTERM
E1206 01:04:14.920000 16491 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 16497) of binary: /home/u/.venv/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/home/u/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
""" + child_failed("/home/u/mine/mytrain.py", Failed(1, 16497, 1), Failed(0, 16496, -15), time="2026-12-06_01:04:14")
LOCATED = ("OSError: [Errno 22] Invalid argument, at /home/u/mine/mytrain.py:49 in <module> "
           "(st = torch.load(ck, weights_only=False))")


def _log(tmp_path: Path) -> Path:
    path = tmp_path / "trainer.stderr.log"
    path.write_text(LOG)
    return path


def crashed(tmp_path: Path) -> PhaseRecord:
    """The record of the run that left LOG, judged as the harness judges it."""
    log = _log(tmp_path)
    run = RunData(tmp_path, world_size=2, exit_code=1, steps_requested=12)
    run.rank_failures = rank_failures(log)
    return PhaseRecord(PointKey("rb", "cpu", "resume"), "rb/cpu/resume/default", "train", Status.FAIL,
                       "trainer crashed (exit code 1)", out_dir="runs/x", evidence=collect(run, log, []), exit_code=1,
                       world_size=2, steps=12)


def test_a_crashed_ranks_exception_is_quoted_where_the_trainers_code_raised_it(tmp_path):
    """The finding read 'rank 0: OSError: [Errno 22] Invalid argument', no file, line or function."""
    failures = rank_failures(_log(tmp_path))
    f = failures[0]
    assert f.raised_at == Frame("/home/u/mine/mytrain.py", 49, "<module>")
    assert f.raised_code == "st = torch.load(ck, weights_only=False)" and f.located == LOCATED
    assert f.traceback.splitlines()[0] == "Traceback (most recent call last):"
    assert f.traceback.endswith(f'{_VENV}/serialization.py", line 807, in __init__\n'
                                "    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))\n"
                                "OSError: [Errno 22] Invalid argument")
    assert "[rank" not in f.traceback and "ChildFailedError" not in f.traceback
    rec = crashed(tmp_path)
    [crash] = [x for x in find([rec]) if x.kind == "crash"]
    assert crash.title == f"crash in resume [default]: exit code 1: rank 0: {LOCATED}", crash.title
    assert verdict_line(rec).startswith(f"rank 0 crashed (no heartbeat written): {LOCATED}"), verdict_line(rec)
    assert PhaseRecord.from_json(rec.to_json(), "stored").evidence.rank_failures == rec.evidence.rank_failures


def test_the_frame_quoted_is_the_innermost_of_the_trainers_own_in_the_last_of_chained_tracebacks(tmp_path):
    chained = "".join(f"[rank0]: {ln}\n" for ln in [
        "Traceback (most recent call last):",
        '  File "/srv/train/data.py", line 10, in open_shard',
        "    return open(path)",
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/s1'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/srv/train/main.py", line 80, in <module>',
        "    main()",
        '  File "/srv/train/main.py", line 71, in main',
        "    batches = load(cfg)",
        '  File "/srv/train/data.py", line 22, in load',
        '    raise RuntimeError("no data shard could be opened")',
        "RuntimeError: no data shard could be opened"])
    (tmp_path / "log").write_text(chained + child_failed("/srv/train/main.py", Failed(0, 7, 1)))
    f = rank_failures(tmp_path / "log")[0]
    assert f.exception == "RuntimeError: no data shard could be opened"
    assert f.raised_at == Frame("/srv/train/data.py", 22, "load")
    assert f.raised_code == 'raise RuntimeError("no data shard could be opened")'
    assert f.traceback.startswith("Traceback (most recent call last):\n  File \"/srv/train/data.py\", line 10")



def test_the_source_line_quoted_leaves_out_its_comment(tmp_path):
    """A comment on the line the trainer raised at was quoted as if the harness said it: 'a hung rank
    stops the others here' in the crash finding of a rank that did not hang."""
    log = _log(tmp_path)
    log.write_text(LOG.replace("st = torch.load(ck, weights_only=False)",
                               "st = torch.load(ck, weights_only=False)  # a hung rank stops the others here"))
    f = rank_failures(log)[0]
    assert f.raised_code == "st = torch.load(ck, weights_only=False)" and f.located == LOCATED, f.located
