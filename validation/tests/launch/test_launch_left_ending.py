"""A rank that left its loop early and was still ending when torchrun ended it, through both doors and a real
two-rank torchrun (gloo on CPU): validation/tests/record_trainer.py's rank 0 stops after step 5 of 8
(NSA_RECORD_LINGER=0@5), destroys its process group and returns from main, and an atexit hook keeps its interpreter's
exit going, as a real trainer's logger or uploader does. Rank 1's all-reduce of step 6 breaks on its closed
connection ('Connection closed by peer'), and torchrun ends rank 0 with SIGTERM. The verdict read 'trainer crashed
(exit code 1)' and named no rank: rank 0 is named as having left early after step 5, and rank 1's failure as the
consequence."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.record import PhaseRecord
from validation.store.results import ResultStore
from validation.tests.conftest import write_runbook

RECORD_TRAINER = "validation.tests.record_trainer"
PHASE = {"name": "linger", "kind": "train", "steps": 8, "timeout_s": 120, "stall_s": 60, "startup_s": 60,
         "env": {"NSA_RECORD_LINGER": "0@5"}, "launcher": {"kind": "torchrun", "nproc": 2},
         "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
#: the verdict line, as each door prints it after the point's status: gloo says 'Connection closed by peer' of rank 0's
#: connections closed, and 'Connection reset by peer' where rank 1's message had reached rank 0 before it closed them
#: (a connection closed with a message unread is reset)
VERDICT = (r"rank 0 left early after step 5 \(last heartbeat step 5, stage step\) and was still ending when torchrun's "
           r"agent ended it \(SIGTERM\): its connections closed under rank 1's all_reduce at "
           r"tests/record_trainer.py:\d+ \(main\) during step 6 \(RuntimeError: (Connection closed by peer|Read error "
           r"\S+: Connection reset by peer)[^)]*\) — "
           r"the other ranks failed without it \(exit code 1\)")


def _runbook(tmp_path):
    return write_runbook(tmp_path / "rb.yaml", [PHASE], defaults={"launcher": {"kind": "python",
                                                                              "module": RECORD_TRAINER}})


def _stored(results) -> PhaseRecord:
    [rec] = ResultStore(results).records()
    return rec


def _assert_left_ending(rec: PhaseRecord) -> None:
    """The typed diagnosis: rank 0 left after step 5 and was ended while ending; rank 1's all-reduce broke on it."""
    assert rec.status == "FAIL" and rec.stalled_s is None and not rec.timed_out, rec.reason
    f0 = rec.evidence.rank_failures[0]
    assert (f0.signal, f0.by_agent, f0.exception) == ("SIGTERM", True, None), f0  # the race, as the knob makes it
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.LEFT and not d.suspected and d.step == 5, d
    assert [(at.rank, at.step, at.stage) for at in d.ranks] == [(0, 5, "step")], d
    assert d.broken is not None and d.broken.one_host, d
    assert [(at.rank, at.step, at.frame, at.site.func) for at in d.broken.ranks] == [(1, 6, "all_reduce", "main")], d


@pytest.mark.distributed
def test_cli_a_rank_torchrun_ended_while_ending_after_it_left_early_is_named_as_having_left(tmp_path, capsys):
    results = tmp_path / "res"
    assert main(["run", "--runbook", str(_runbook(tmp_path)), "--profile", "cpu", "--results-dir", str(results),
                 "--no-plots"]) == 1
    err = capsys.readouterr().err
    [line] = [ln for ln in err.splitlines() if ln.startswith("[1/1] fake/cpu/linger/default: FAIL")]
    assert re.fullmatch(r"\[1/1\] fake/cpu/linger/default: FAIL \([\d.]+s\) " + VERDICT, line), line
    _assert_left_ending(_stored(results))


@pytest.mark.distributed
def test_pytest_door_a_rank_torchrun_ended_while_ending_after_it_left_early_is_named_as_having_left(tmp_path):
    results = tmp_path / "res"
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "validation/tests/test_acceptance.py", "--runbook", str(_runbook(tmp_path)), "--profile",
                          "cpu", "--results-dir", str(results), "-k", "linger"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"FAIL: " + VERDICT, out.stdout), out.stdout
    _assert_left_ending(_stored(results))
