"""The harness watches progress itself: a trainer whose step stops growing for the phase's
``stall_s`` is stopped within stall_s + 10 s (not at the phase timeout), with every rank's stack
taken by py-spy (or, where py-spy may not attach, asked for with SIGUSR1), and recorded NO-GO
with each rank named where it stood. The trainer is validation/tests/hang_trainer.py, under the
python launcher and under torchrun with 2 ranks."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from validation.contract.stacks import HARNESS_STACKS
from validation.judge.findings import find
from validation.judge.findings.headline import verdict_line
from validation.launch import process as runner
from validation.launch.watch import Watch
from validation.tests.conftest import FakeRun

HANG = "validation.tests.hang_trainer"
RECORD_TRAINER = "validation.tests.record_trainer"
#: the reporting bound the issue sets: a hang is reported within stall_s + this
REPORT_SLACK_S = 10.0
PYTHON_STALL_S = 4.0
TORCHRUN_STALL_S = 8.0
#: torchrun's own start-up (it imports torch) is not what these tests hang; on a loaded CI box it can
#: outlast stall_s, so the allowance before the first step is generous and the stall clock is tested after it
TORCHRUN_STARTUP_S = 60.0


def _phase(stall_s: float, env: dict[str, str], nproc: int = 1, **extra) -> dict:
    phase = {"name": "hang", "kind": "train", "steps": 1000, "timeout_s": 120, "stall_s": stall_s, "env": env,
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}], **extra}
    if nproc > 1:
        phase["launcher"] = {"kind": "torchrun", "nproc": nproc}
        phase.setdefault("startup_s", TORCHRUN_STARTUP_S)
    return phase


class Hung:
    """One run of a hanging point, timed from the last progress any rank made to the record."""

    def __init__(self, tmp_path: Path, phase: dict, module: str = HANG):
        self.run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": module}})
        self.reported = time.time()
        self.rec = self.run.record
        self.dir = self.run.results / self.rec.out_dir
        beats = [json.loads(line)["time"] for p in self.dir.glob("heartbeat_rank*.jsonl")
                 for line in p.read_text().splitlines()]
        assert beats, f"no rank wrote a heartbeat: {self.rec.status} {self.rec.reason}"
        self.last_progress = max(beats)
        [self.finding] = [f for f in self.run.findings("critical") if f.startswith("stall in hang")]

    @property
    def took(self) -> float:
        return self.reported - self.last_progress

    def check_stalled(self, stall_s: float) -> None:
        rec = self.rec
        assert rec.status == "FAIL" and rec.reason.startswith("stalled: no progress"), rec.reason
        assert rec.stalled_s is not None and rec.stalled_s >= stall_s and not rec.timed_out and rec.exit_code is None
        assert self.took <= stall_s + REPORT_SLACK_S, f"reported {self.took:.1f}s after the last progress"
        for t in rec.evidence.taken_stacks:  # the tree is dead
            assert not psutil.pid_exists(t.pid) or psutil.Process(t.pid).status() == psutil.STATUS_ZOMBIE

    def stack(self, rank: int) -> list[str]:
        return [f.func for f in self.rec.evidence.stackdumps[rank].frames]

    def advice(self) -> str:
        return self.run.report[self.run.report.index("Recommendations"):]


def test_python_hang_is_reported_within_stall_s_with_rank_0s_stack(tmp_path):
    hung = Hung(tmp_path, _phase(PYTHON_STALL_S, {"NSA_HANG_AT": "3"}))
    hung.check_stalled(PYTHON_STALL_S)
    [taken] = hung.rec.evidence.taken_stacks
    assert (taken.rank, taken.rank_from, taken.method) == (0, "single process", "py-spy")
    assert taken.path == f"{HARNESS_STACKS}/rank0.txt"
    assert hung.stack(0)[0] == "stuck_here" and "main" in hung.stack(0)
    assert "rank 0 in stuck_here" in hung.finding
    assert re.search(r"no progress for \d+s at step 2 \(the highest its files showed\) \(stall_s 4\)", (hung.dir / "trainer.stderr.log").read_text())
    assert f"stack ({HARNESS_STACKS}/rank0.txt, py-spy)" in hung.finding
    assert "The stack shows where the process waited" in hung.advice() and "collective" not in hung.advice()


@pytest.mark.distributed
def test_torchrun_one_hung_rank_each_rank_named_with_its_own_stack(tmp_path):
    hung = Hung(tmp_path, _phase(TORCHRUN_STALL_S, {"NSA_HANG_AT": "3", "NSA_HANG_RANKS": "1"}, nproc=2))
    hung.check_stalled(TORCHRUN_STALL_S)
    taken = {t.rank: t for t in hung.rec.evidence.taken_stacks}
    assert set(taken) == {0, 1} and all(t.rank_from == "RANK" and t.method == "py-spy" for t in taken.values())
    assert hung.stack(1)[0] == "stuck_here" and hung.stack(0)[0] == "wait_for_peers"
    for rank in (0, 1):  # the process dumped as rank R is the one torchrun gave RANK=R
        assert f"pid {taken[rank].pid}, rank {rank} (RANK)" in (hung.dir / taken[rank].path).read_text()
    assert "hung: rank 1 in stuck_here; waiting for it: rank 0 in wait_for_peers" in hung.finding
    assert f"rank 1: last heartbeat step 2, stage optimizer; stack ({HARNESS_STACKS}/rank1.txt, py-spy)" in hung.finding
    assert "a rank inside a collective while another is elsewhere" in hung.advice()


@pytest.mark.distributed
def test_torchrun_all_ranks_hung(tmp_path):
    hung = Hung(tmp_path, _phase(TORCHRUN_STALL_S, {"NSA_HANG_AT": "4"}, nproc=2))
    hung.check_stalled(TORCHRUN_STALL_S)
    assert hung.stack(0)[0] == hung.stack(1)[0] == "stuck_here"
    assert "rank 0 in stuck_here; rank 1 in stuck_here" in hung.finding


@pytest.mark.distributed
def test_torchrun_a_rank_hung_in_its_own_code_under_record_is_named_apart_from_the_rank_in_all_reduce(tmp_path):
    """A torch trainer whose main is wrapped in torch's ``@record`` (validation/tests/record_trainer.py,
    gloo): rank 1 sleeps in code of its own at step 3 after the heartbeat record rank 0 writes before
    the step's all-reduce, where rank 0 waits for it. @record's frame at the bottom of both stacks read
    as both waiting in a collective: 'rank 0 stalled in all_reduce ...; rank 1 stalled in
    stuck_in_own_code ...', the hung rank not named."""
    hung = Hung(tmp_path, _phase(TORCHRUN_STALL_S, {"NSA_RECORD_HANG": "1@3"}, nproc=2, steps=40),
                module=RECORD_TRAINER)
    hung.check_stalled(TORCHRUN_STALL_S)
    assert hung.stack(1)[0] == "stuck_in_own_code" and hung.stack(0)[0] == "all_reduce"
    assert all(any(f.endswith("wrapper") and "record" in f for f in hung.stack(r)) for r in (0, 1))  # @record's
    assert "hung: rank 1 in stuck_in_own_code; waiting for it: rank 0 in all_reduce" in hung.finding, hung.finding
    line = verdict_line(hung.rec)  # the point's line on the command line and in the report
    assert line.startswith("rank 1 hung in stuck_in_own_code (last heartbeat step 3, stage backward) — stalled"), line


@pytest.mark.distributed
def test_torchrun_of_three_ranks_the_one_in_a_collective_of_its_own_is_named_off_the_common_path(tmp_path):
    """validation/tests/record_trainer.py, gloo: rank 1 calls an all-reduce at step 3 that the others never
    call (on a side group); it waits there, ranks 0 and 2 in the step's all-reduce, every heartbeat at step
    3, stage backward. The verdict named all three 'stalled in all_reduce' alike."""
    hung = Hung(tmp_path, _phase(TORCHRUN_STALL_S, {"NSA_RECORD_EXTRA": "1@3"}, nproc=3, steps=40),
                module=RECORD_TRAINER)
    hung.check_stalled(TORCHRUN_STALL_S)
    assert "sync_metrics" in hung.stack(1) and "sync_metrics" not in hung.stack(0) + hung.stack(2)
    line = verdict_line(hung.rec)
    assert line.startswith("rank 1 is in a collective the other ranks never reached: all_reduce at "
                           "tests/record_trainer.py:"), line
    assert "(sync_metrics; last heartbeat step 3, stage backward); ranks 0, 2 wait in all_reduce at " \
        "tests/record_trainer.py:" in line and "(main; last heartbeat step 3, stage backward) — stalled" in line, line
    assert "rank 1 is in a collective the other ranks never reached" in hung.finding, hung.finding
    assert "TORCH_DISTRIBUTED_DEBUG" in hung.advice()


@pytest.mark.distributed
def test_torchrun_of_two_ranks_in_different_collectives_each_call_site_is_named_and_no_rank_blamed(tmp_path):
    """The same with two ranks: rank 1 in its own all-reduce, rank 0 in the step's. An extra collective
    on rank 1 reads the same as one missing on rank 0, so neither is blamed; both call sites are named."""
    hung = Hung(tmp_path, _phase(TORCHRUN_STALL_S, {"NSA_RECORD_EXTRA": "1@3"}, nproc=2, steps=40),
                module=RECORD_TRAINER)
    hung.check_stalled(TORCHRUN_STALL_S)
    line = verdict_line(hung.rec)
    assert re.match(r"ranks 0, 1 wait in different collectives: rank 0 in all_reduce at tests/record_trainer.py:\d+ "
                    r"\(main; last heartbeat step 3, stage backward\); rank 1 in all_reduce at "
                    r"tests/record_trainer.py:\d+ \(sync_metrics; last heartbeat step 3, stage backward\): nothing "
                    r"tells which of the two left the common path", line), line


@pytest.fixture
def pyspy_refused(tmp_path, monkeypatch):
    """py-spy as it answers where ptrace is not permitted."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr("validation.launch.stacks.pyspy_executable", lambda: str(fake))


def test_without_ptrace_sigusr1_asks_the_trainer_for_its_dump(tmp_path, pyspy_refused):
    hung = Hung(tmp_path, _phase(PYTHON_STALL_S, {"NSA_HANG_AT": "3"}))
    hung.check_stalled(PYTHON_STALL_S)
    [taken] = hung.rec.evidence.taken_stacks
    assert taken.method == "SIGUSR1" and taken.path is None and "Operation not permitted" in taken.note
    dump = hung.rec.evidence.stackdumps[0]
    assert dump.source == "SIGUSR1" and dump.path == "stackdump_rank0.txt" and dump.frames[0].func == "stuck_here"
    assert "stack (stackdump_rank0.txt, SIGUSR1)" in hung.finding and "SIGUSR1 sent instead" in hung.finding


def test_no_stack_at_all_is_said_and_the_advice_does_not_cite_dumps(tmp_path, pyspy_refused):
    hung = Hung(tmp_path, _phase(PYTHON_STALL_S, {"NSA_HANG_AT": "3", "NSA_HANG_SIGUSR1": "0"}))
    hung.check_stalled(PYTHON_STALL_S)
    [taken] = hung.rec.evidence.taken_stacks
    assert taken.method == "none" and "no SIGUSR1 handler" in taken.note and not hung.rec.evidence.stackdumps
    assert "rank 0: last heartbeat step 2, stage optimizer; no stack dump [py-spy could not" in hung.finding
    assert "No stack could be taken" in hung.advice() and "stack dumps show" not in hung.advice()


def test_timeout_of_a_slow_run_takes_the_stacks_too_and_is_no_stall(tmp_path):
    """Progress every 0.5 s: never a stall, but the phase timeout still ends it, stacks first. Its
    finding says it timed out still progressing; it once read 'stall in hang (killed at the 6s
    timeout)', sending the reader after a hang that never was."""
    run = FakeRun(tmp_path, [_phase(4, {"NSA_STEP_S": "0.5"}, timeout_s=6)],
                  defaults={"launcher": {"kind": "python", "module": HANG}})
    rec = run.record
    assert rec.timed_out and rec.stalled_s is None and "timed out" in rec.reason
    assert rec.timeout_quiet_s is not None and rec.timeout_quiet_s < 4 and rec.progressing_at_timeout
    assert [t.method for t in rec.evidence.taken_stacks] == ["py-spy"]
    critical = run.findings("critical")
    assert not [f for f in critical if "stall" in f.split(":")[0] or "hung" in f], critical
    [finding] = [f for f in critical if f.startswith("timed out in hang")]
    assert "while still progressing" in finding and "before the 6s timeout (not a stall)" in finding, finding
    assert re.search(r"step \d+ of 1000 logged", finding), finding


def test_a_hang_the_timeout_ends_before_stall_s_is_still_a_stall(tmp_path):
    """Hung at step 20 (about 6 s in, steps of 0.3 s) with stall_s 15: the 20 s timeout ends it
    before stall_s runs out, and the finding is a stall with the stack, as before: no new step for
    about 14 s where steps took 0.3 s."""
    hung = Hung(tmp_path, _phase(15, {"NSA_HANG_AT": "20", "NSA_STEP_S": "0.3"}, timeout_s=20))
    rec = hung.rec
    assert rec.timed_out and not rec.progressing_at_timeout, (rec.timeout_quiet_s, rec.metrics.step_time_s_mean)
    assert "killed at the 20s timeout" in hung.finding and hung.stack(0)


def test_pyspy_is_found_beside_the_interpreter():
    from validation.launch.stacks import pyspy_executable
    found = pyspy_executable()
    assert found and os.access(found, os.X_OK)


def test_a_slow_start_within_startup_s_is_no_stall_and_a_hang_after_it_still_is(tmp_path):
    """Start-up (imports, compilation, graph capture) takes longer than a step: ``startup_s``
    covers it without stretching ``stall_s`` for the steps after it."""
    slow_start = {"NSA_START_S": "6", "NSA_STEP_S": "0.01"}
    for name in ("ok", "early", "hung"):
        (tmp_path / name).mkdir()
    ok = FakeRun(tmp_path / "ok", [_phase(PYTHON_STALL_S, slow_start, steps=20, startup_s=30)],
                 defaults={"launcher": {"kind": "python", "module": HANG}}).record
    assert ok.status == "PASS" and ok.stalled_s is None, ok.reason
    early = FakeRun(tmp_path / "early", [_phase(PYTHON_STALL_S, slow_start, steps=20)],
                    defaults={"launcher": {"kind": "python", "module": HANG}}).record
    assert early.status == "FAIL" and "no progress for 4s before its first step" in early.reason, early.reason
    hung = Hung(tmp_path / "hung", _phase(PYTHON_STALL_S, {**slow_start, "NSA_HANG_AT": "5"}, startup_s=30))
    hung.check_stalled(PYTHON_STALL_S)
    assert "after step 4;" in hung.rec.reason, hung.rec.reason


def test_a_first_step_begun_and_slow_is_still_start_up(tmp_path):
    """The project's trainer writes step 1's 'data' and 'forward' records before its first step
    runs (a compiling first forward takes long): the allowance switched to stall_s at those records,
    and a 12 s first step under startup_s 60, stall_s 5 was killed as a stall after 5 s. Until a
    step is done (a record of a stage after it, a CSV row) startup_s applies; after it, stall_s."""
    slow_first = {"NSA_FIRST_STEP_S": "7", "NSA_STEP_S": "0.01"}
    ok = FakeRun(tmp_path, [_phase(PYTHON_STALL_S, slow_first, steps=10, startup_s=30)],
                 defaults={"launcher": {"kind": "python", "module": HANG}}).record
    assert ok.status == "PASS" and ok.stalled_s is None, ok.reason
    (tmp_path / "short").mkdir()
    early = FakeRun(tmp_path / "short", [_phase(PYTHON_STALL_S, slow_first, steps=10)],
                    defaults={"launcher": {"kind": "python", "module": HANG}}).record
    assert early.status == "FAIL" and "before its first step" in early.reason, early.reason


def test_a_trainer_that_never_logs_a_step_is_said_to_have_written_no_heartbeat(tmp_path):
    """Stalled before its first step: each rank's line read 'last heartbeat step ?, stage ?', as
    if a heartbeat of unknown content had been written; it names the file that never came."""
    run = FakeRun(tmp_path, [_phase(PYTHON_STALL_S, {"NSA_HANG_AT": "1"})],
                  defaults={"launcher": {"kind": "python", "module": HANG}})
    rec = run.record
    assert rec.reason.startswith("stalled: no progress") and "before its first step" in rec.reason, rec.reason
    [finding] = [f for f in run.findings("critical") if f.startswith("stall in hang")]
    assert "rank 0: no heartbeat written (no heartbeat_rank0.jsonl); stack (" in finding, finding
    assert "step ?" not in finding and "stage ?" not in finding, finding
    # a file that was opened but holds no record (a trainer that creates it at start-up) is said so
    empty = dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, files=[*rec.evidence.files,
                                                                                       "heartbeat_rank0.jsonl"]))
    [stall] = [f for f in find([empty]) if f.kind == "stall"]
    assert "rank 0: no heartbeat written (heartbeat_rank0.jsonl has no record); stack (" in stall.detail[0], stall.detail


#: rank 1 of the fake trainer hangs within step 3 while rank 0, not waiting for it, steps on (0.05 s a
#: step, far past stall_s); the phase's timeout bounds the run that the watch does not stop
LONE_HANG = {"NSA_FAULT": "lone_hang:rank=1:step=3", "NSA_FAKE_STEP_S": "0.05"}
LONE_TIMEOUT_S = 90


@pytest.mark.distributed
def test_torchrun_a_rank_that_hangs_while_the_other_steps_on_is_a_stall_of_that_rank(tmp_path):
    """A user's pass: rank 1 hung (its process alive, its heartbeats stopped) while rank 0, which does
    not wait for it, kept writing heartbeats of new steps. The watch took rank 0's steps for the run's
    progress: the run went on to the phase timeout and its finding read 'timed out ... while still
    progressing'. Rank 1's silence of stall_s while rank 0 went past it is a stall of rank 1: its
    stacks taken and the tree killed within stall_s + 10 s, the finding naming rank 1, its step, how
    long it was silent and how far rank 0 went."""
    run = FakeRun(tmp_path, [_phase(TORCHRUN_STALL_S, LONE_HANG, nproc=2, steps=2000, timeout_s=LONE_TIMEOUT_S)])
    rec = run.record
    assert not rec.timed_out and rec.exit_code is None, rec.reason
    assert TORCHRUN_STALL_S <= rec.stalled_s <= TORCHRUN_STALL_S + REPORT_SLACK_S, rec.stalled_s
    [silent] = rec.evidence.silent_ranks
    assert (silent.rank, silent.step, silent.silent_s) == (1, 3, rec.stalled_s)
    [(other, went_to)] = silent.others.items()
    assert other == 0 and went_to > 3 and silent.left_behind
    assert rec.reason.startswith(f"stalled: rank 1 hung at step 3: its heartbeats showed no new step for "
                                 f"{rec.stalled_s:.0f}s while rank 0 went on to step {went_to}; stacks taken"), \
        rec.reason
    taken = {t.rank: t for t in rec.evidence.taken_stacks}
    assert set(taken) == {0, 1} and rec.evidence.stackdumps[1].frames[0].func == "hung_alone"
    for t in taken.values():  # the tree is dead
        assert not psutil.pid_exists(t.pid) or psutil.Process(t.pid).status() == psutil.STATUS_ZOMBIE
    [finding] = [f for f in run.findings("critical") if f.startswith("stall in hang")]
    assert finding.startswith(f"stall in hang [default] (stopped by the harness): rank 1 hung at step 3 in hung_alone: "
                              f"its heartbeats showed no new step for {rec.stalled_s:.0f}s while rank 0 went on to "
                              f"step {went_to}\n"), finding
    assert "still progressing" not in run.report and "stall in hang" in run.report
    assert "the other ranks did not wait for it" in run.report[run.report.index("Recommendations"):]


def test_a_timeout_records_a_rank_silent_within_its_first_step(tmp_path):
    """Rank 1's heartbeats stop within its first step (start-up: no step of its own done, so the watch
    does not stop the run for it) while rank 0 steps on until the timeout: the timeout's result
    names rank 1 silent, which its finding then calls hung (validation/tests/judge/test_silent_ranks.py),
    not a run still progressing."""
    ranks = textwrap.dedent("""
        import json, sys, time
        def beat(rank, step, stage):
            with open(f"{sys.argv[1]}/heartbeat_rank{rank}.jsonl", "a") as fh:
                fh.write(json.dumps({"time": time.time(), "rank": rank, "step": step, "stage": stage}) + "\\n")
        beat(1, 1, "forward")
        for step in range(1, 100000):
            beat(0, step, "step")
            time.sleep(0.05)
    """)
    watch = Watch(tmp_path, tmp_path / "training.csv", 2.0, 2.0, tmp_path, single_process=True, last_step=100000)
    result = runner.run([sys.executable, "-c", ranks, str(tmp_path)], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                        timeout_s=6, log_dir=tmp_path, poll_s=0.1, watch=watch)
    assert result.timed_out and result.stalled_s is None and result.timeout_quiet_s < 2, result
    [silent] = result.silent_ranks
    assert (silent.rank, silent.step, silent.left_behind) == (1, 1, False) and silent.silent_s >= 2, silent
    assert list(silent.others) == [0] and silent.others[0] > 1, silent


#: a module whose import does not return: a torch.distributed module of rank 0's (its ops registered at
#: import, as torch.distributed.tensor._ops does) and a plain one of rank 1's
_SLOW_TORCH_MODULE = "import time\n\n\ndef register_ops():\n    while True:\n        time.sleep(1)\n\n\nregister_ops()\n"
_SLOW_MODULE = "import time\n\nwhile True:\n    time.sleep(1)\n"


@pytest.mark.distributed
def test_torchrun_ranks_still_importing_at_the_start_up_stall_are_named_so_none_as_waiting(tmp_path):
    """A user's pass, on a busy machine: both ranks of a torchrun point were still importing when the
    start-up allowance ran out, rank 0 inside torch.distributed's own import-time code. Its frame under
    torch/distributed/ read as a collective: 'hung: rank 1 in _create_fn; waiting for it: rank 0 in
    _get_overload_packet', and the advice sought a rank-dependent branch. No rank waited for another:
    each is named with the module it was importing and the trainer's line that imported it."""
    torch_module = tmp_path / "lib" / "torch" / "distributed" / "_slow_ops.py"
    torch_module.parent.mkdir(parents=True)
    torch_module.write_text(_SLOW_TORCH_MODULE)
    plain = tmp_path / "lib" / "slow_plugin.py"
    plain.write_text(_SLOW_MODULE)
    phase = _phase(TORCHRUN_STALL_S, {"NSA_START_IMPORT": f"{torch_module},{plain}"}, nproc=2, steps=5,
                   startup_s=20.0)
    (tmp_path / "run").mkdir()
    run = FakeRun(tmp_path / "run", [phase], defaults={"launcher": {"kind": "python", "module": HANG}})
    rec = run.record
    assert rec.status == "FAIL" and "before its first step" in rec.reason, rec.reason
    line = verdict_line(rec)
    assert line.startswith("every rank found running was still importing, none waiting for another: rank 0 "
                           f"{torch_module.parent.name}/{torch_module.name} (line 9; imported from "
                           "tests/hang_trainer.py:"), line
    assert "hung" not in line and "waiting for it" not in line, line
    [finding] = [f for f in run.findings("critical") if f.startswith("stall in hang")]
    assert "still importing" in finding and "waiting for it" not in finding, finding
    advice = run.report[run.report.index("Recommendations"):]
    assert "startup_s" in advice and "rank-dependent branch" not in advice, advice
    dumps = rec.evidence.stackdumps
    assert dumps[0].importing.torch_code and dumps[0].importing.module.file == str(torch_module)
    assert dumps[1].importing.module.file == str(plain) and not dumps[1].importing.torch_code
    assert all(d.importing.origin.file.endswith("hang_trainer.py") for d in dumps.values())


def test_a_rank_waiting_for_its_data_loader_is_named_with_the_worker_where_the_data_is_stuck(tmp_path):
    """A user's pass: a DataLoader worker's read hung; the rank's stack showed only the wait ('rank 0 hung in
    _PollLikeSelector.select'), and the worker, a process below the rank, was not dumped. Its stack is taken
    as the rank's helper, and the rank is named with it."""
    hung = Hung(tmp_path, _phase(PYTHON_STALL_S, {"NSA_LOADER_HANG_AT": "3", "NSA_STEP_S": "0.01"}, steps=10,
                                 startup_s=60.0))
    hung.check_stalled(PYTHON_STALL_S)
    [worker] = hung.rec.evidence.helper_stacks[0]
    assert worker.frames[0].func == "read_shard" and hung.rec.evidence.stackdumps[0].loader is not None
    line = verdict_line(hung.rec)
    assert line.startswith(f"rank 0 hung in {hung.stack(0)[0]}, waiting for its data loader's workers: pid "
                           f"{worker.pid} in read_shard (tests/hang_trainer.py:"), line
    assert f"rank 0's helper pid {worker.pid} (a process below it): stack (harness_stacks/rank0_helper{worker.pid}.txt" \
        in hung.finding, hung.finding
