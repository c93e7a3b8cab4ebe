"""Rank faults through the real harness and the real trainer: a stalled rank, a SIGKILLed rank,
an exception on one rank, NaN/inf loss and out of memory. Each must end with the right verdict
and finding (cause, rank, step, evidence files) within its bound, leave no process behind, and
leave the earlier run's record, artifacts and the store intact."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults import _util as U
from validation.judge.findings.headline import verdict_line

pytestmark = pytest.mark.faults


@pytest.mark.distributed
@pytest.mark.parametrize("mode", list(U.DIST_MODES))
def test_stalled_rank_is_halted_by_the_watchdog(seeded, matrix, mode):
    name, fault = U.DIST_MODES[mode]
    matrix.start(fault, f"`NSA_FAULT=stall:rank=1:step=3`, torchrun x2 ({name}, gloo)",
                 "watchdog fires on every rank: stack dumps, .HALT, exit 3; FAIL naming rank 1 stuck at step 3")
    rb = seeded.runbook(U.fault_phase("stall", "stall:rank=1:step=3", nproc=2, overrides={"dist.mode": mode}))
    p = seeded.run(rb, "stall")
    rec = U.record(seeded.results, "stall")
    assert rec.status == "FAIL" and "watchdog" in rec.reason, rec.reason
    assert not rec.timed_out, "the harness timeout fired: the watchdog did not end the run"
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= U.STALL_BOUND_S, f"stall took {took:.1f}s from the fault to the end > {U.STALL_BOUND_S}s"
    ev = rec.evidence
    assert set(ev.stackdumps) == {0, 1}, "every rank must leave a stack dump"
    assert {"stackdump_rank0.txt", "stackdump_rank1.txt", ".HALT"} <= set(ev.files) | {".HALT"}
    assert ev.halt
    # the stalled rank is named with where it is stuck (the injected sleep) and its step
    f = U.finding(seeded.results, "stall", "stall in stall")
    text = f.title + "\n" + "\n".join(f.detail)
    assert "hung: rank 1 in at; waiting for it: rank 0" in f.title, text
    assert "rank 1: last heartbeat step 3, stage forward" in text and "faults.py" in text, text
    assert "rank 0: last heartbeat step 3" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


@pytest.mark.distributed
def test_a_stalled_middle_rank_of_four_is_named_not_the_three_that_waited(seeded, matrix):
    """World 4, rank 2 stalls: three ranks wait for it in DDP's backward, each watchdog fires and
    dumps its stack. The finding must name rank 2, neither the lowest rank nor 'the other rank' of
    a world of 2, and list every rank that waited as waiting."""
    matrix.start("stalled rank, world of 4", "`NSA_FAULT=stall:rank=2:step=3`, torchrun x4 (DDP, gloo)",
                 "watchdog fires on every rank: 4 stack dumps, .HALT; FAIL naming rank 2 stuck at step 3 and ranks 0, "
                 "1 and 3 as waiting for it")
    rb = seeded.runbook(U.fault_phase("stall4", "stall:rank=2:step=3", nproc=4))
    p = seeded.run(rb, "stall4")
    rec = U.record(seeded.results, "stall4")
    assert rec.status == "FAIL" and "watchdog" in rec.reason, rec.reason
    assert not rec.timed_out, "the harness timeout fired: the watchdog did not end the run"
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 2, 3, "forward")
    assert took <= U.STALL_BOUND_S, f"stall took {took:.1f}s from the fault to the end > {U.STALL_BOUND_S}s"
    assert set(rec.evidence.stackdumps) == {0, 1, 2, 3}, "every rank must leave a stack dump"
    f = U.finding(seeded.results, "stall4", "stall in stall4")
    text = U.finding_text(f)
    assert "hung: rank 2 in at; waiting for it: rank 0 in " in f.title, text
    assert "; rank 1 in " in f.title and "; rank 3 in " in f.title, text
    assert "rank 2: last heartbeat step 3, stage forward" in text, text
    assert [(r.rank, r.step) for r in f.diagnosis.ranks] == [(2, 3)], f.diagnosis
    assert verdict_line(rec).startswith("rank 2 hung in at (last heartbeat step 3, stage forward)"), verdict_line(rec)
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


@pytest.mark.distributed
@pytest.mark.parametrize("rank", [1, 0])
def test_sigkilled_rank_ends_the_run(seeded, matrix, rank):
    """rank 0: the lowest rank, so a blame that takes the lowest rank with an error, or assumes the
    faulty rank is not rank 0, passes it by luck or fails it; the survivor (rank 1) then fails with
    its peer's 'Connection reset', which must read as a victim's error."""
    other = 1 - rank
    matrix.start("SIGKILLed rank" + (", rank 0" if rank == 0 else ""),
                 f"`NSA_FAULT=kill:rank={rank}:step=3` (SIGKILL to itself), torchrun x2",
                 f"torchrun ends the survivors; FAIL naming rank {rank}, its signal and its last step"
                 + (", never rank 1 whose collective broke" if rank == 0 else ""))
    rb = seeded.runbook(U.fault_phase("kill", f"kill:rank={rank}:step=3", nproc=2))
    p = seeded.run(rb, "kill")
    rec = U.record(seeded.results, "kill")
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    assert not rec.timed_out
    took = U.fault_to_end_s(seeded.results / rec.out_dir, rank, 3, "forward")
    assert took <= U.STALL_BOUND_S, f"kill took {took:.1f}s from the fault to the end > {U.STALL_BOUND_S}s"
    f = U.finding(seeded.results, "kill", "crash in kill")
    text = f.title + "\n" + "\n".join(f.detail)
    assert f"exit code 1: rank {rank}: killed by SIGKILL" in f.title, text
    assert f"rank {other}" not in f.title, text
    assert f"rank {rank}: last heartbeat step 3" in text, text
    assert "trainer.stderr.log" in text
    assert [(r.rank, r.step) for r in f.diagnosis.ranks] == [(rank, 3)], f.diagnosis
    assert verdict_line(rec).startswith(f"rank {rank} crashed (last heartbeat step 3, stage forward): killed by "
                                        "SIGKILL"), verdict_line(rec)
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


@pytest.mark.distributed
def test_frozen_rank_is_named_though_it_leaves_no_stack(seeded, matrix):
    """Rank 1 SIGSTOPs itself (a frozen node): its watchdog and faulthandler threads stop with it,
    py-spy cannot read it and torchrun's SIGTERM cannot end it, so rank 0's watchdog fires, rank
    0 dumps its stack (waiting in DDP's backward) and exits 3, and the harness stops torchrun
    waiting for rank 1. The finding said "rank 0 exited 0 early", then "rank 0 in
    _engine_run_backward": the rank that waited, not the one that hung."""
    matrix.start("frozen rank", "`NSA_FAULT=freeze:rank=1:step=3` (SIGSTOP to itself), torchrun x2",
                 "the harness's stall watch ends the run; FAIL naming rank 1 hung (no stack) and rank 0 waiting")
    rb = seeded.runbook(U.fault_phase("freeze", "freeze:rank=1:step=3", nproc=2, stall_s=15,
                                      startup_s=U.STARTUP_S))
    p = seeded.run(rb, "freeze")
    rec = U.record(seeded.results, "freeze")
    assert rec.status == "FAIL" and rec.stalled_s is not None, rec.reason
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= U.STALL_BOUND_S, f"freeze took {took:.1f}s from the fault to the end > {U.STALL_BOUND_S}s"
    f = U.finding(seeded.results, "freeze", "stall in freeze")
    text = f.title + "\n" + "\n".join(f.detail)
    assert ("hung: rank 1 (no stack; its process stopped, by SIGSTOP or a debugger; last heartbeat step 3, stage "
            "forward); waiting for it: rank 0 in ") in f.title, text
    assert "exited 0" not in text, text
    # the verdict line says so too, from the point's diagnosis (it said only 'rank 1 hung (last heartbeat ...)')
    said = p.stdout + p.stderr
    assert "/freeze/default: FAIL (" in said and \
        "s) rank 1 hung (stopped, no stack; last heartbeat step 3, stage forward) — stalled: " in said, said[-3000:]
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


#: a folder whose sitecustomize injects faults below the trainer (NSA_TEST_BLOCKING_TEARDOWN=1: a
#: destroy_process_group that blocks; NSA_TEST_SLOW_HALT=1: rank 0 slow to write a NaN's .HALT)
SITE_FAULTS = Path(__file__).parent / "site_faults"


def _site_fault(phase: dict, variable: str) -> dict[str, str]:
    """Turns on one of site_faults' injections in the phase's runs; returns the environment the
    harness must run with for the trainer's processes to import it."""
    phase["env"][variable] = "1"
    return {"PYTHONPATH": os.pathsep.join([str(SITE_FAULTS), str(U.REPO)])}


@pytest.mark.distributed
@pytest.mark.parametrize("teardown", ["gloo", "blocking"])
def test_exception_on_one_rank(seeded, matrix, teardown):
    """Rank 1 raises. 'blocking': its process group's destroy blocks, as over NCCL, where it waited
    for rank 0, itself waiting for rank 1 in the step's all-gather; the rank that raised must still
    be the one named, not rank 0 whose watchdog fires in the end (as over NCCL on two GPUs,
    tests/faults/test_nccl_faults.py)."""
    blocking = teardown == "blocking"
    matrix.start("exception on one rank" + (", teardown that blocks (as NCCL's)" if blocking else ""),
                 "`NSA_FAULT=crash:rank=1:step=2:stage=backward`, torchrun x2"
                 + (", `destroy_process_group` made to block (`NSA_TEST_BLOCKING_TEARDOWN=1`)" if blocking else ""),
                 "FAIL with the exception, rank 1, step 2, stderr log")
    phase = U.fault_phase("crash", "crash:rank=1:step=2:stage=backward", nproc=2)
    env = _site_fault(phase, "NSA_TEST_BLOCKING_TEARDOWN") if blocking else None
    rb = seeded.runbook(phase)
    p = seeded.run(rb, "crash", env=env)
    rec = U.record(seeded.results, "crash")
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 2, "backward")
    assert took <= U.STALL_BOUND_S, f"{took:.1f}s from the fault to the end"
    f = U.finding(seeded.results, "crash", "crash in crash")
    text = f.title + "\n" + "\n".join(f.detail)
    assert "rank 1" in f.title, text
    assert "InjectedFault: injected crash on rank 1 at step 2 stage backward" in f.title, text
    assert "rank 1: last heartbeat step 2, stage backward" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


@pytest.mark.distributed
@pytest.mark.parametrize("halt", ["prompt", "slow"])
def test_nan_loss_halts_with_the_rank_and_step(seeded, matrix, halt):
    """'slow': rank 0 takes 2 s to write the .HALT; rank 1, which saw the same gathered loss, once
    left at once, and torchrun SIGTERMed rank 0 before the .HALT existed."""
    slow = halt == "slow"
    matrix.start("NaN loss" + (", rank 0 slow to write the .HALT" if slow else ""), "`NSA_FAULT=nan:rank=0:step=3`, "
                 "torchrun x2" + (", rank 0's .HALT written 2 s late (`NSA_TEST_SLOW_HALT=1`)" if slow else ""),
                 "halt before the optimizer step, exit 4; FAIL 'non-finite loss at step 3' naming rank 0; not a stall")
    phase = U.fault_phase("nan", "nan:rank=0:step=3", nproc=2)
    env = _site_fault(phase, "NSA_TEST_SLOW_HALT") if slow else None
    rb = seeded.runbook(phase)
    p = seeded.run(rb, "nan", env=env)
    rec = U.record(seeded.results, "nan")
    took, f = U.assert_nan_halt_named(seeded, rec, p, U.STALL_BOUND_S)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, U.STALL_BOUND_S)


def test_out_of_memory_on_cpu(seeded, matrix):
    matrix.start("out of memory (CPU)", "`NSA_FAULT=oom:step=2` (torch.OutOfMemoryError at the forward allocation)",
                 "oom_rank0.txt written, FAIL naming OutOfMemoryError, rank 0, step 2")
    rb = seeded.runbook(U.fault_phase("oom", "oom:step=2"))
    p = seeded.run(rb, "oom")
    rec = U.record(seeded.results, "oom")
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    assert rec.wall_s <= 120.0
    assert "oom_rank0.txt" in rec.evidence.files
    assert "step 2" in (seeded.results / rec.out_dir / "oom_rank0.txt").read_text()
    f = U.finding(seeded.results, "oom", "crash in oom")
    assert "OutOfMemoryError" in f.title and "rank 0" in f.title and "step 2" in f.title, f.title
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, rec.wall_s, 120.0)


@pytest.mark.distributed
def test_stalled_rank_without_watchdog_is_stopped_by_the_harness_stall_watch(seeded, matrix):
    """The trainer's watchdog is off: the harness's own progress watch sees no new step for the
    phase's stall_s, takes both ranks' stacks with py-spy and kills the tree (torchrun starts
    each rank in a session of its own), within stall_s + 10 s of the fault, not at the timeout."""
    stall_s, timeout = 15.0, 120.0
    bound = stall_s + 10
    matrix.start("stalled rank, watchdog off", "`NSA_FAULT=stall:rank=1:step=3`, `watchdog.enabled=false`, "
                 f"`stall_s` {stall_s:g} s, phase timeout {timeout:g} s, torchrun x2", "the harness's stall watch: "
                 "py-spy stacks of both ranks, then the whole tree killed; FAIL 'stalled' naming rank 1 in the "
                 "injected stall")
    phase = U.fault_phase("hang", "stall:rank=1:step=3", nproc=2, timeout_s=timeout, stall_s=stall_s,
                          startup_s=U.STARTUP_S)
    phase["overrides"]["watchdog.enabled"] = False
    rb = seeded.runbook(phase)
    p = seeded.run(rb, "hang")
    rec = U.record(seeded.results, "hang")
    assert rec.status == "FAIL" and "stalled" in rec.reason, rec.reason
    assert not rec.timed_out and rec.stalled_s >= stall_s
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= bound, f"the stall was reported {took:.1f}s after the fault > {bound:g}s"
    assert {(t.rank, t.method) for t in rec.evidence.taken_stacks} == {(0, "py-spy"), (1, "py-spy")}
    f = U.finding(seeded.results, "hang", "stall in hang")
    text = f.title + "\n" + "\n".join(f.detail)
    assert "stopped by the harness" in f.title and "rank 1 in FaultInjector.at" in f.title, text
    assert "rank 1: last heartbeat step 3, stage forward; stack (harness_stacks/rank1.txt, py-spy)" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, bound)


@pytest.mark.gpu
def test_out_of_memory_on_cuda(seeded, matrix):
    """On CUDA the oom fault really allocates twice the device's memory: the allocator's own
    OutOfMemoryError, and the memory summary in oom_rank0.txt (a path that exists only on GPU)."""
    matrix.start("out of memory (CUDA)", "`NSA_FAULT=oom:step=2` on CUDA (a real allocation of 2x the device)",
                 "FAIL naming OutOfMemoryError at step 2; oom_rank0.txt with torch.cuda.memory_summary")
    rb = seeded.runbook(U.fault_phase("oom_cuda", "oom:step=2", overrides={"train.device": "cuda"}))
    p = seeded.run(rb, "oom_cuda")
    rec = U.record(seeded.results, "oom_cuda")
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    text = (seeded.results / rec.out_dir / "oom_rank0.txt").read_text()
    assert "CUDA out of memory" in text or "out of memory" in text.lower()
    assert "memory summary" in text.lower() or "PyTorch CUDA memory summary" in text
    f = U.finding(seeded.results, "oom_cuda", "crash in oom_cuda")
    assert "OutOfMemoryError" in f.title, f.title
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, f.title, rec.wall_s, 120.0)


@pytest.mark.distributed
def test_an_error_on_every_rank_before_the_process_group_heads_the_crash(tmp_path, matrix, monkeypatch):
    """A runbook's own trainer whose import fails on every rank, before init_process_group (so its
    tracebacks carry no [rankN] prefix): the crash was headed by torchrun's own line,
    'torch.distributed.elastic.multiprocessing.errors.ChildFailedError:', whose traceback comes
    last in its log, and the ranks' error was 40 lines above the stderr tail the record keeps."""
    
    from validation.judge.findings import find
    from validation.judge.record import Status
            
    matrix.start("import error on every rank", "a trainer whose first line imports a module that is not there, "
                 "torchrun x2", "FAIL 'trainer ended before its first step'; the crash finding names the ImportError, "
                 "not torchrun's ChildFailedError")
    root = tmp_path / "trainer"
    root.mkdir()
    # rank 1 a moment after rank 0: two ranks raising at one instant interleave their unbuffered
    # stderr writes byte by byte ('ModuleNotFoundErrorModuleNotFoundError: : ...'), which no reader of
    # the log can take apart
    (root / "train.py").write_text("import os, time\ntime.sleep(0.05 * int(os.environ.get('LOCAL_RANK', '0')))\n"
                                   "import a_module_that_is_not_there  # noqa\n")
    monkeypatch.setenv("BROKEN_TRAINER_ROOT", str(root))
    phase = {"name": "broken", "kind": "train", "steps": 4, "timeout_s": 120, "stall_s": 30,
             "launcher": {"kind": "torchrun", "nproc": 2}, "env": {"OMP_NUM_THREADS": 1},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    trainer = {"name": "broken", "root": {"env": "BROKEN_TRAINER_ROOT"}, "script": "train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
    rec = U.run_one_point(tmp_path, "broken", trainer, phase)
    assert rec.status == Status.FAIL and rec.exit_code == 1, rec.reason
    [crash] = [f for f in find([rec]) if f.title.startswith("crash in")]
    # every rank failed alike ('ModuleNotFoundError' closing the title); where torchrun stopped one rank before
    # it exited, the one it saw fail is named beside it ('rank 0: exit code 1; the log's traceback ...: ...')
    assert crash.title.startswith("crash in broken [default]: exit code 1: ") and crash.title.endswith(
        "ModuleNotFoundError: No module named 'a_module_that_is_not_there'") and "ChildFailedError" not in crash.title, \
        crash.title
    matrix.done(rec.status, rec.reason + " | " + crash.title, rec.wall_s, None)
