"""A collective of the same size, extra on one rank, through the harness and a real two-rank torchrun (gloo on CPU):
validation/tests/record_trainer.py's rank 1 all-reduces a copy of its loss at step 3 (``log_loss``) on the default
group, where every rank all-reduces the step's loss (1 float). It pairs silently with rank 0's all-reduce of step
3; rank 0 completes the last step and exits 0, and rank 1 fails in its all-reduce of the last step ('Connection
closed by peer'). The verdict read 'rank 0 exited 0 (...) — the other ranks failed without it', and its advice
spoke of collectives after the training loop: rank 1 failed within a step rank 0 had completed, so the ranks'
collectives had gone out of step inside the loop, and that is what is said.

Under NCCL the all-reduce left without a partner waits instead: rank 0 exits 0, rank 1 waits until the harness's
stall watch takes its stack and stops the run. The verdict read 'rank 1 hung in all_reduce (...)' and its advice said
nothing waited for it (a save, an evaluation after the others were done): rank 1 waited within a step rank 0 had
completed. NSA_RECORD_HOLD=1 has each rank keep its gloo connections open after it exits, so that gloo waits too."""
from __future__ import annotations

import re

import pytest

from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.tests.conftest import FakeRun

RECORD_TRAINER = "validation.tests.record_trainer"


@pytest.mark.distributed
def test_torchrun_an_extra_collective_of_the_same_size_on_rank_1_reads_as_collectives_out_of_step(tmp_path):
    phase = {"name": "twice", "kind": "train", "steps": 6, "timeout_s": 120, "stall_s": 60, "startup_s": 60,
             "env": {"NSA_RECORD_TWICE": "1@3"}, "launcher": {"kind": "torchrun", "nproc": 2},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": RECORD_TRAINER}})
    rec = run.record
    assert rec.status == "FAIL" and rec.stalled_s is None and not rec.timed_out, rec.reason
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.step == 6, d
    assert [(at.rank, at.frame, at.site.func) for at in d.ranks] == [(1, "all_reduce", "main")], d
    assert [(at.rank, at.step, at.stage) for at in d.ended] == [(0, 6, "step")], d
    assert d.files == (f"{rec.out_dir}/heartbeat_rank1.jsonl", f"{rec.out_dir}/heartbeat_rank0.jsonl"), d.files
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 1 failed in all_reduce at tests/record_trainer.py:\d+ \(main\) during step 6 "
                        r"\(RuntimeError: [^)]*Connection (?:closed|reset) by peer[^)]*\), a step rank 0 had completed before it "
                        r"exited 0 \(last heartbeat step 6, stage step\): the ranks' collectives were out of step: "
                        r"rank 1 had called more collectives than rank 0 by then, .* — trainer crashed \(exit code 1\)",
                        line), line
    [crash] = [f for f in find([rec]) if f.kind == "out_of_step"]
    [advice] = recommendations([crash])
    assert "collective called on some ranks only" in advice and "after the training loop" not in advice, advice


@pytest.mark.distributed
def test_torchrun_a_rank_left_waiting_by_an_extra_collective_of_the_same_size_reads_as_collectives_out_of_step(tmp_path):
    phase = {"name": "twice", "kind": "train", "steps": 6, "timeout_s": 120, "stall_s": 8, "startup_s": 60,
             "env": {"NSA_RECORD_TWICE": "1@3", "NSA_RECORD_HOLD": "1"}, "launcher": {"kind": "torchrun", "nproc": 2},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": RECORD_TRAINER}})
    rec = run.record
    assert rec.status == "FAIL" and rec.stalled_s is not None and not rec.timed_out, rec.reason
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.waiting and d.step == 6, d
    assert [(at.rank, at.stage, at.frame, at.site.func) for at in d.ranks] == [(1, "backward", "all_reduce", "main")], d
    assert [(at.rank, at.step, at.stage) for at in d.ended] == [(0, 6, "step")], d
    line = verdict_line(rec)
    assert re.fullmatch(r"rank 1 waited in all_reduce at tests/record_trainer.py:\d+ \(main\) during step 6 \(with no "
                        r"partner left\), a step rank 0 had completed before it exited 0 \(last heartbeat step 6, stage "
                        r"step\): the ranks' collectives were out of step: rank 1 had called more collectives than rank 0 "
                        r"by then, .* — stalled: no progress for \d+s after step 6; .*", line), line
    [stall] = [f for f in find([rec]) if f.kind == "out_of_step"]
    [advice] = recommendations([stall])
    assert "collective called on some ranks only" in advice and "nothing waited for it" not in advice, advice


@pytest.mark.distributed
def test_torchrun_an_early_exit_after_an_extra_collective_reads_as_both(tmp_path):
    """Rank 0 stops after step 5 of 8 (NSA_RECORD_QUIT=0@5), and rank 1's extra all-reduce at step 3 left it a
    collective ahead: rank 1 fails in its all-reduce of step 5, a step rank 0 had completed. The verdict read 'rank 0
    exited 0 early (...) — the other ranks failed without it', and nothing named the extra collective."""
    phase = {"name": "twice", "kind": "train", "steps": 8, "timeout_s": 120, "stall_s": 60, "startup_s": 60,
             "env": {"NSA_RECORD_TWICE": "1@3", "NSA_RECORD_QUIT": "0@5"}, "launcher": {"kind": "torchrun", "nproc": 2},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    run = FakeRun(tmp_path, [phase], defaults={"launcher": {"kind": "python", "module": RECORD_TRAINER}})
    rec = run.record
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and [(at.rank, at.step) for at in d.ranks] == [(0, 5)], d
    assert d.beside is not None and d.beside.kind == Kind.OUT_OF_STEP, d
    assert [(at.rank, at.step, at.frame) for at in d.beside.ranks] == [(1, 5, "all_reduce")], d.beside
    line = verdict_line(rec)
    assert line.startswith("rank 0 exited 0 early (last heartbeat step 5, stage step); besides, rank 1 failed in "
                           "all_reduce at tests/record_trainer.py:"), line
    assert {"departed", "out_of_step"} <= {f.kind for f in find([rec])}, find([rec])
