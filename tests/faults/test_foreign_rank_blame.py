"""Rank faults whose blame hangs on whose signal ended a rank and on what a rank's broken collective
says, through the real harness with a test trainer outside the nsa package (tests/trainers/
native_train.py, gloo all-reduce each step, under torchrun). The unit tests with recorded runs
(validation/tests/judge/test_diagnosis_signals.py, test_diagnosis_collective_timeouts.py) say why each once
named the wrong rank or none; these run the faults end to end.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults import _util as U
from validation.judge.diagnosis import Kind
from validation.judge.diagnosis import diagnose
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord, Status

pytestmark = [pytest.mark.faults, pytest.mark.distributed]

TRAINER = {"name": "native", "root": "tests/trainers", "script": "native_train.py",
           "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
#: the process group's timeout of the hung-rank run: gloo's collective gives up before the stall watch
PG_TIMEOUT_S, STALL_S = 5, 30.0


def _run(tmp_path: Path, monkeypatch, fault: str, nproc: int, stall_s: float = 10.0) -> PhaseRecord:
    monkeypatch.setenv("TEST_TRAINER_FAULT", fault)
    phase = {"name": "blame", "kind": "train", "steps": 8, "timeout_s": 90, "stall_s": stall_s, "startup_s": 60,
             "launcher": {"kind": "torchrun", "nproc": nproc}, "env": {"OMP_NUM_THREADS": 1},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    return U.run_one_point(tmp_path, "foreign_blame", TRAINER, phase)


def test_a_rank_killed_by_a_sigterm_of_its_own_is_named_of_three(tmp_path, matrix, monkeypatch):
    matrix.start("rank SIGTERMed from outside, world of 3", "`TEST_TRAINER_FAULT=term_rank:1@3` (native_train.py: "
                 "SIGTERM to itself), torchrun x3 (gloo)",
                 "FAIL naming rank 1 killed by a SIGTERM that was not torchrun's (its agent signalled ranks 0 and 2 "
                 "only), not ranks 0 and 2's broken collectives")
    t0 = time.time()
    rec = _run(tmp_path, monkeypatch, "term_rank:1@3", 3)
    assert rec.status == Status.FAIL and "crashed" in rec.reason, rec.reason
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.KILLED and [r.rank for r in c.ranks] == [1], verdict_line(rec)
    assert "killed by SIGTERM, not torchrun's" in verdict_line(rec), verdict_line(rec)
    matrix.done(rec.status, verdict_line(rec), time.time() - t0, None)


def test_a_rank_its_peers_collective_timed_out_waiting_for_is_named_hung(tmp_path, matrix, monkeypatch):
    matrix.start("hung rank, gloo's timeout first", f"`TEST_TRAINER_FAULT=hang_rank:1@3` (native_train.py), "
                 f"`TEST_TRAINER_PG_TIMEOUT_S={PG_TIMEOUT_S}`, `stall_s` {STALL_S:g} s, torchrun x2 (gloo)",
                 "rank 0's all-reduce raises gloo's timeout, torchrun ends rank 1; FAIL naming rank 1 hung at step 3, "
                 "not rank 0's exception")
    monkeypatch.setenv("TEST_TRAINER_PG_TIMEOUT_S", str(PG_TIMEOUT_S))
    t0 = time.time()
    rec = _run(tmp_path, monkeypatch, "hang_rank:1@3", 2, stall_s=STALL_S)
    assert rec.status == Status.FAIL and rec.stalled_s is None, rec.reason  # gloo's timeout, not the stall watch
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HUNG and [(r.rank, r.step) for r in c.ranks] == [(1, 2)], verdict_line(rec)
    assert "rank 0 gave up waiting for it in a collective (rank 0: RuntimeError: Timed out waiting" in \
        verdict_line(rec), verdict_line(rec)
    matrix.done(rec.status, verdict_line(rec), time.time() - t0, None)
