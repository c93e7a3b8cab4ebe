"""What the Slurm launcher (validation/launch/slurm.py) asks Slurm, answered by stand-ins for its
commands on PATH (no Slurm needed): the state of a job Slurm stopped, read as it ends."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from validation.launch import slurm

BANNER = "slurmstepd-vm: error: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***"


def _fake(monkeypatch, tmp_path: Path, tool: str, answers: list[str]) -> Path:
    """``tool`` on PATH answering ``answers`` in turn, the last one from then on; each call's
    arguments appended to the returned file, one JSON list a line."""
    bin_dir, calls = tmp_path / "bin", tmp_path / f"{tool}.calls"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / f"{tool}.answers").write_text(json.dumps(answers))
    (bin_dir / tool).write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"calls = open({str(calls)!r}, 'a+')\ncalls.seek(0)\nn = len(calls.readlines())\n"
        "calls.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"answers = json.load(open({str(tmp_path / f'{tool}.answers')!r}))\n"
        "print(answers[min(n, len(answers) - 1)])\n")
    (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def _stopped(tmp_path: Path) -> str | None:
    (tmp_path / "node0.stderr.log").write_text(f"some agent output\n{BANNER}\n")
    return slurm.slurm_stopped(tmp_path, 1, "14")


def _asked(calls: Path) -> int:
    return len(calls.read_text().splitlines())


def test_a_job_slurm_is_still_ending_is_waited_for_until_its_state_is_final(monkeypatch, tmp_path):
    """Two Slurm nodes, someone's scancel of the job: the verdict sometimes lacked 'job 14
    CANCELLED', squeue showing COMPLETING (which hides the state the job ends in) as the harness
    read it."""
    monkeypatch.setattr(slurm, "JOB_END_LOOK_S", 0.05)
    calls = _fake(monkeypatch, tmp_path, "squeue", ["COMPLETING", "COMPLETING", "CANCELLED"])
    assert _stopped(tmp_path) == ("node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***; "
                                  "job 14 CANCELLED")
    assert _asked(calls) == 3


def test_a_job_still_ending_at_the_bound_is_said_to_be_not_final(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm, "JOB_END_LOOK_S", 0.05)
    monkeypatch.setattr(slurm, "JOB_END_WAIT_S", 0.3)
    calls = _fake(monkeypatch, tmp_path, "squeue", ["COMPLETING"])
    assert _stopped(tmp_path) == ("node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***; job 14 still "
                                  "ending (COMPLETING 0.3 s after its step ended): the state it ended in is not "
                                  "final yet")
    assert 2 <= _asked(calls) <= 8  # looked again, and stopped looking at the bound


@pytest.mark.parametrize("state", ["RUNNING", ""])
def test_a_job_that_did_not_end_is_not_waited_for(monkeypatch, tmp_path, state):
    """A step cancelled alone leaves its job RUNNING; a squeue that does not answer says nothing."""
    calls = _fake(monkeypatch, tmp_path, "squeue", [state])
    assert _stopped(tmp_path) == "node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***"
    assert _asked(calls) == 1
