"""Ranks whose collectives a check found not matching (validation/judge/diagnosis/mismatch.py). A user's
two-rank gloo run whose rank 1 called one all_reduce of its own (7 floats, in ``log_metrics``) on the default
group while both ranks all-reduce their 4 gradients every step: gloo's size check fired in rank 0, which
received rank 1's 7 floats in its 4-float all-reduce, and aborted it (SIGABRT); the verdict read 'rank 0
crashed (...): killed by SIGABRT', blaming the rank that never left the common path. Which rank the check
ends depends on the sizes (with 16 gradients it ends rank 1), so the rank it ended is where the mismatch was
detected, never the culprit; the call sites the log shows tell which rank left the common path where a
majority of the ranks was at one, and of two ranks nothing does.

Judged from the files real torchrun runs of that trainer left (validation/tests/evidence/gloo*_mismatch_*:
torchrun's log trimmed of its own traceback's frames, the heartbeats; the harness sets PYTHONFAULTHANDLER,
so the aborted rank's Python stack is in the log); nothing runs here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from validation.contract.files import read_heartbeats
from validation.contract.stacks import Frame
from validation.contract.torchrun_log import rank_failures
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.blame import Check
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status

EVIDENCE = Path(__file__).parents[1] / "evidence"
TRAINER = "/tmp/s16_user/mytrain.py"
#: the step's all-reduce of the gradients, which every rank calls, and rank 1's own in log_metrics
REGULAR, EXTRA = Frame(TRAINER, 30, "main"), Frame(TRAINER, 10, "log_metrics")
#: gloo's words of the size check in rank 0, which expected 4 bytes of a chunk and received 8
GLOO_SAID = "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size"
TWO = ("nothing tells which of the two left the common path (a collective extra on one reads the same as one "
       "missing on the other)")


def _record(case: str, log: str | None = None, tmp_path: Path | None = None) -> PhaseRecord:
    """A record of the recorded run ``case``, with ``log`` for its torchrun log where given."""
    run = EVIDENCE / case
    path = run / "trainer.stderr.log"
    if log is not None:
        path = tmp_path / "trainer.stderr.log"
        path.write_text(log)
    beats = read_heartbeats(run)
    ev = Evidence(rank_failures=rank_failures(path), stderr_log="trainer.stderr.log",
                  last_heartbeat={k: Beat.of(recs) for k, recs in beats.items()})
    return PhaseRecord(PointKey("gloo_mismatch", "cpu", "two_ranks"), "gloo_mismatch/cpu/two_ranks/default", "train",
                       Status.FAIL, "trainer crashed (exit code 1)", steps=12, world_size=len(beats), exit_code=1,
                       evidence=ev, trainer="mytrain")


def _crash(rec: PhaseRecord):
    [f] = [f for f in find([rec]) if f.title.startswith("collective mismatch in")]
    return f


@pytest.mark.parametrize("case, aborted, said", [
    ("gloo2_mismatch_rank0_aborted", 0, GLOO_SAID),
    ("gloo2_mismatch_rank1_aborted", 1, "op.preamble.length <= op.nbytes. 16 vs 8. Received data size doesn't match "
                                        "expected size")])
def test_the_rank_gloos_size_check_aborted_is_where_it_was_detected_and_of_two_ranks_none_is_blamed(case, aborted, said):
    """Rank 0's abort, then (16 gradients) rank 1's: the same words but for the rank the check ended."""
    rec = _record(case)
    failures = rec.evidence.rank_failures
    assert failures[aborted].signal == "SIGABRT" and failures[aborted].mismatch == said, failures
    # the aborted rank's call site is its report of the abort (faulthandler), the other's its traceback
    assert {k: (f.raised_at, f.collective) for k, f in failures.items()} == {
        0: (REGULAR, "all_reduce"), 1: (EXTRA, "all_reduce")}, failures
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and not d.common, d
    assert [(at.rank, at.site) for at in d.ranks] == [(0, REGULAR), (1, EXTRA)], d
    assert d.detected.check == Check.GLOO_SIZE and d.detected.ranks == (aborted,) and not d.detected.unknown
    said = (f"the ranks' collectives did not match: gloo's check of a message's size aborted rank {aborted} ({said}), "
            "where the mismatch was detected; rank 0 was in all_reduce at s16_user/mytrain.py:30 (main; last heartbeat "
            "step 3, stage backward), rank 1 in all_reduce at s16_user/mytrain.py:10 (log_metrics; last heartbeat step "
            f"3, stage backward): {TWO}")
    assert verdict_line(rec) == f"{said} — trainer crashed (exit code 1)", verdict_line(rec)
    crash = _crash(rec)
    assert crash.kind == "mismatch" and crash.title == f"collective mismatch in two_ranks [default]: exit code 1: {said}"
    [advice] = recommendations([crash])
    assert "where it was detected, not the culprit" in advice and "TORCH_DISTRIBUTED_DEBUG: DETAIL" in advice, advice


def test_torchs_detail_check_raises_in_every_rank_and_names_each_ranks_collective():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL (the advice's): torch checks each collective before it runs and raises
    in both ranks; the lowest rank with an exception of its own was blamed ('rank 0 crashed (...): RuntimeError:
    Detected mismatch between collectives on ranks...', torch's whole message of both fingerprints)."""
    rec = _record("gloo2_mismatch_detail")
    failures = rec.evidence.rank_failures
    assert failures[0].mismatch == ("Detected mismatch between collectives on ranks: rank 0 ALLREDUCE [4], rank 1 "
                                    "ALLREDUCE [7]; they differ in Tensor Tensor shapes: 4vs 7"), failures[0]
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and d.detected.check == Check.TORCH_DETAIL, d
    assert d.detected.ranks == (0, 1) and [(at.rank, at.site) for at in d.ranks] == [(0, REGULAR), (1, EXTRA)], d
    assert verdict_line(rec).startswith(
        "the ranks' collectives did not match: torch's check of the collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL) raised "
        "in ranks 0, 1 (Detected mismatch between collectives on ranks: rank 0 ALLREDUCE [4], rank 1 ALLREDUCE [7]; "
        "they differ in Tensor Tensor shapes: 4vs 7), where the mismatch was detected; rank 0 was in all_reduce at "
        "s16_user/mytrain.py:30 (main; "), verdict_line(rec)
    assert verdict_line(rec).endswith(f"{TWO} — trainer crashed (exit code 1)"), verdict_line(rec)


def test_of_three_ranks_the_one_away_from_the_majoritys_call_site_left_the_common_path():
    """Three ranks, rank 1's extra all-reduce: the check aborted rank 0, and ranks 0 and 2 raised or aborted in the
    step's all-reduce: rank 1 is named, never rank 0."""
    rec = _record("gloo3_mismatch_rank0_aborted")
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and d.detected.ranks == (0,), d
    assert [(at.rank, at.site) for at in d.ranks] == [(1, EXTRA)], d
    assert [(at.rank, at.site) for at in d.common] == [(0, REGULAR), (2, REGULAR)], d
    assert verdict_line(rec).startswith(
        f"the ranks' collectives did not match: gloo's check of a message's size aborted rank 0 ({GLOO_SAID}), where "
        "the mismatch was detected; rank 1 called all_reduce at s16_user/mytrain.py:10 (log_metrics; last heartbeat "
        "step 3, stage backward) where ranks 0, 2 called all_reduce at s16_user/mytrain.py:30 (main): it left the "
        "common path — "), verdict_line(rec)


def test_without_pythons_report_of_the_abort_the_aborted_ranks_collective_is_unknown_and_none_is_blamed(tmp_path):
    """A torchrun run outside the harness (no PYTHONFAULTHANDLER) prints gloo's words but no Python stack of the
    rank it aborts: its call site is unknown, and one rank's is no majority."""
    log = (EVIDENCE / "gloo2_mismatch_rank0_aborted" / "trainer.stderr.log").read_text()
    log = re.sub(r"Fatal Python error: Aborted\n.*?Extension modules:[^\n]*\n", "", log, flags=re.S)
    rec = _record("gloo2_mismatch_rank0_aborted", log, tmp_path)
    f0 = rec.evidence.rank_failures[0]
    assert f0.mismatch == GLOO_SAID and f0.raised_at is None and f0.collective is None, f0
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.MISMATCHED and d.detected.unknown == (0,), d
    assert [(at.rank, at.site) for at in d.ranks] == [(0, None), (1, EXTRA)], d
    assert verdict_line(rec).startswith(
        f"the ranks' collectives did not match: gloo's check of a message's size aborted rank 0 ({GLOO_SAID}), where "
        "the mismatch was detected; rank 0 (last heartbeat step 3, stage backward), rank 1 in all_reduce at "
        "s16_user/mytrain.py:10 (log_metrics; last heartbeat step 3, stage backward): the log shows no collective of "
        "rank 0, so nothing tells which rank left the common path — "), verdict_line(rec)


def test_an_abort_with_no_words_of_gloos_check_stays_the_ranks_own(tmp_path):
    """The check's words are what tell it: the same run's log without them is a rank killed by SIGABRT."""
    log = (EVIDENCE / "gloo2_mismatch_rank0_aborted" / "trainer.stderr.log").read_text()
    log = "\n".join(ln for ln in log.splitlines() if "Received data size" not in ln) + "\n"
    rec = _record("gloo2_mismatch_rank0_aborted", log, tmp_path)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.KILLED and [at.rank for at in d.ranks] == [0], d
