"""Ranks whose collectives went out of step, where the rank left without a partner waits instead of failing (NCCL's
collectives do; validation/judge/diagnosis/outofstep.py ``waited_out_of_step``). Rank 1 all-reduced a copy of its
loss once more at step 3 (``log_loss``): of the same size as the step's all-reduce, it paired silently with rank 0's
of step 3, and each of rank 1's after it with rank 0's of the next step. Rank 0 completed step 8 and exited 0; rank
1 waited in its all-reduce of step 8 until the harness's stall watch stopped the run. The verdict read 'rank 1 hung
in all_reduce (...)' and its advice said nothing waited for it, as of a rank that hangs after the others were done
with it (a save, an evaluation): rank 1 waited inside the training loop, in a step rank 0 had completed.

Judged as the harness judges a run it stopped, from the files a real two-rank torchrun run of
validation/tests/record_trainer.py left (validation/tests/evidence/gloo2_outofstep_rank1_waited: NSA_RECORD_TWICE=1@3
and NSA_RECORD_HOLD=1, which keeps each rank's gloo connections open after it exits, so that gloo waits as NCCL
does; stall_s 10), and from them changed where the same ends mean a hang after the loop, a hang of the rank's own
or an early exit; nothing runs here."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from validation.contract.stacks import Frame
from validation.judge.diagnosis import Kind, NoStack, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord
from validation.tests.stopped_run import judged_stopped_run

RUN = Path(__file__).parents[1] / "evidence" / "gloo2_outofstep_rank1_waited"
#: the step's all-reduce of the loss, which rank 1 waited in
REGULAR = Frame("/tmp/s16_oos_hang/validation/tests/record_trainer.py", 135, "main")
STOPPED = "stalled: no progress for 10s after step 8; stacks taken and the run killed by the harness"


def _judged(run: Path = RUN) -> PhaseRecord:
    return judged_stopped_run(run, run / "trainer.stderr.log", stalled_s=10.0, stacks_tried=1)


def _changed(tmp_path: Path) -> Path:
    """A copy of the recorded run to change."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    return run


def _cut(run: Path, rank: int, keep: int) -> None:
    """``rank``'s heartbeats cut to their first ``keep`` records."""
    beats = run / f"heartbeat_rank{rank}.jsonl"
    beats.write_text("".join(beats.read_text().splitlines(keepends=True)[:keep]))


def _stall(rec: PhaseRecord):
    [f] = [f for f in find([rec]) if f.title.startswith("stall in")]
    return f


def test_a_rank_left_waiting_in_a_collective_within_a_step_its_peer_had_completed_before_exiting_0_is_out_of_step():
    rec = _judged()
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.waiting and d.step == 8, d
    assert [(at.rank, at.step, at.stage, at.frame, at.site, at.cause) for at in d.ranks] == [
        (1, 8, "backward", "all_reduce", REGULAR, "")], d
    assert [(at.rank, at.step, at.stage) for at in d.ended] == [(0, 8, "step")], d
    said = ("rank 1 waited in all_reduce at tests/record_trainer.py:135 (main) during step 8 (with no partner left), a "
            "step rank 0 had completed before it exited 0 (last heartbeat step 8, stage step): the ranks' collectives "
            "were out of step: rank 1 had called more collectives than rank 0 by then, one of its own that rank 0 never "
            "called or one rank 0 skipped, earlier in the run; which, and at which step, these files do not tell")
    assert verdict_line(rec) == f"{said} — {STOPPED}", verdict_line(rec)
    stall = _stall(rec)
    assert stall.kind == "out_of_step" and stall.title == (
        f"stall in ddp [default] (no progress for 10s, stopped by the harness): {said}"), stall.title
    assert "rank 0: last heartbeat step 8, stage step; no process left to take a stack of: it had ended (exited 0)" \
        in stall.detail, stall.detail
    [advice] = recommendations([stall])
    assert advice.startswith("ddp: A rank waited in a collective, with no partner left, until the harness stopped the "
                             "run (a collective without its partner waits under NCCL, where gloo's fails), within a "
                             "step that another rank had completed before it exited 0"), advice
    assert "collective called on some ranks only" in advice and "nothing waited for it" not in advice, advice


def test_a_rank_that_hangs_in_a_collective_after_its_last_step_is_still_the_one_left_running(tmp_path):
    """Rank 1 completed step 8 too (its heartbeat says so) and then waited in a collective rank 0 never called (a
    final barrier or save): it hung after the loop, as the words for the one process left running say."""
    run = _changed(tmp_path)
    beats = run / "heartbeat_rank1.jsonl"
    beats.write_text(beats.read_text() + '{"time": 1796593370.7, "rank": 1, "pid": 31460, "step": 8, "stage": "step"}\n')
    rec = _judged(run)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1], d
    assert verdict_line(rec) == f"rank 1 hung in all_reduce (last heartbeat step 8, stage step) — {STOPPED}"
    stall = _stall(rec)
    assert stall.kind == "stall" and stall.title.endswith(": hung: rank 1 in all_reduce; the other ranks had ended")
    [advice] = recommendations([stall])
    assert "outlived the other ranks, which had ended" in advice and "nothing waited for it" in advice, advice


def test_a_rank_whose_stack_is_outside_the_collectives_hung_of_its_own(tmp_path):
    """Rank 1's stack in its own code (the frames of the all-reduce gone from it): whatever rank 0 completed, nothing
    shows rank 1 waiting for a partner: the one process left running hung, in its own words."""
    run = _changed(tmp_path)
    dump = run / "harness_stacks" / "rank1.txt"
    dump.write_text("".join(ln for ln in dump.read_text().splitlines(keepends=True)
                            if "distributed_c10d.py" not in ln and "c10d_logger.py" not in ln))
    rec = _judged(run)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [(at.rank, at.frame) for at in d.ranks] == [(1, "main")], d


def _unstacked(run: Path, state: str = "sleeping") -> None:
    """No stack of rank 1: py-spy could not take one, and it has no SIGUSR1 handler; its process in ``state``."""
    (run / "harness_stacks" / "rank1.txt").unlink()
    index = run / "harness_stacks" / "index.json"
    [taken] = json.loads(index.read_text())
    index.write_text(json.dumps([{**taken, "method": "none", "path": None, "state": state, "note": (
        "py-spy could not take its stack (Permission Denied); it has no SIGUSR1 handler to ask instead")}]))


def test_a_rank_of_no_stack_within_a_step_its_peer_completed_is_suspected_out_of_step(tmp_path):
    """No stack of rank 1: its heartbeat says it was within step 8, which rank 0 completed before it exited 0. The
    verdict read 'rank 1 hung (no stack; ...)', a hang of its own, as if rank 0's completing the step said nothing:
    either rank 1 waited in a collective of step 8 with no partner (out of step), or it hung of its own after its
    part in the step's collectives; the verdict says both, and that the missing stack is why it cannot tell."""
    run = _changed(tmp_path)
    _unstacked(run)
    rec = _judged(run)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.OUT_OF_STEP and d.waiting and d.suspected, d
    assert [(at.rank, at.no_stack, at.step, at.stage, at.frame) for at in d.ranks] == [
        (1, NoStack.UNTAKEN, 8, "backward", None)], d
    assert [(at.rank, at.step, at.stage) for at in d.ended] == [(0, 8, "step")], d
    said = ("rank 1 was still running within step 8 (no stack: which call it waited in is unknown; last heartbeat "
            "step 8, stage backward), a step rank 0 had completed before it exited 0 (last heartbeat step 8, stage "
            "step): the ranks' collectives may have been out of step (rank 1 left waiting in a collective of that step "
            "with no partner, having called more collectives than rank 0 by then, one of its own that rank 0 never "
            "called or one rank 0 skipped, earlier in the run), or rank 1 hung of its own after its part in that step's "
            "collectives; with no stack of it, these files do not tell which")
    assert verdict_line(rec) == f"{said} — {STOPPED}", verdict_line(rec)
    stall = _stall(rec)
    assert stall.kind == "out_of_step" and stall.facts.suspected, stall
    [advice] = recommendations([stall])
    assert advice.startswith("ddp: A rank was still running within a step that another rank had completed before it "
                             "exited 0, and no stack of it could be taken"), advice
    assert "install py-spy" in advice and "collective called on some ranks only" in advice, advice


def test_a_stopped_rank_of_no_stack_within_a_step_its_peer_completed_is_named_hung_by_its_heartbeat(tmp_path):
    """Rank 1's process was stopped (SIGSTOP) when the harness came: it ran nothing, in no collective: hung as
    stopped, by its heartbeat."""
    run = _changed(tmp_path)
    _unstacked(run, state="stopped")
    rec = _judged(run)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG, d
    assert [(at.rank, at.no_stack, at.step, at.stage) for at in d.ranks] == [(1, NoStack.STOPPED, 8, "backward")], d


def test_a_rank_that_exited_0_before_the_step_its_peer_waits_in_left_early(tmp_path):
    """Rank 0 exited 0 after step 5 of 8 and rank 1 waits in step 6's all-reduce: rank 0 never completed the step
    rank 1 waits in: an early exit, in its own words."""
    run = _changed(tmp_path)
    _cut(run, 0, 15)  # forward, backward, step of steps 1 to 5
    _cut(run, 1, 17)  # and step 6's forward and backward
    rec = _judged(run)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and [(at.rank, at.step, at.stage) for at in d.ranks] == [
        (0, 5, "step")] and not d.ended, d
    assert verdict_line(rec).startswith("rank 0 exited 0 early (last heartbeat step 5, stage step) — stalled"), \
        verdict_line(rec)
