"""What the Slurm launcher (validation/launch/slurm.py) asks Slurm, answered by stand-ins for its
commands on PATH (no Slurm needed): the state of a job Slurm stopped, read as it ends; the host of
the rendezvous."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from validation.launch import slurm

BANNER = "slurmstepd-vm: error: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***"


def _fake(monkeypatch, tmp_path: Path, tool: str, answers: dict[str, list[str]]) -> Path:
    """``tool`` on PATH: a call whose arguments begin with a key of ``answers`` (the longest that
    fits; "" fits any) is answered with that key's answers in turn, the last one from then on. Each
    call's key appended to the returned file, a line each."""
    bin_dir, calls = tmp_path / "bin", tmp_path / f"{tool}.calls"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / f"{tool}.answers").write_text(json.dumps(answers))
    (bin_dir / tool).write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"answers = json.load(open({str(tmp_path / f'{tool}.answers')!r}))\n"
        "key = max((k for k in answers if ' '.join(sys.argv[1:]).startswith(k)), key=len)\n"
        f"calls = open({str(calls)!r}, 'a+')\ncalls.seek(0)\nn = calls.read().splitlines().count(key)\n"
        "calls.write(key + '\\n')\n"
        "print(answers[key][min(n, len(answers[key]) - 1)])\n")
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
    calls = _fake(monkeypatch, tmp_path, "squeue", {"": ["COMPLETING", "COMPLETING", "CANCELLED"]})
    assert _stopped(tmp_path) == ("node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***; "
                                  "job 14 CANCELLED")
    assert _asked(calls) == 3


def test_a_job_still_ending_at_the_bound_is_said_to_be_not_final(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm, "JOB_END_LOOK_S", 0.05)
    monkeypatch.setattr(slurm, "JOB_END_WAIT_S", 0.3)
    calls = _fake(monkeypatch, tmp_path, "squeue", {"": ["COMPLETING"]})
    assert _stopped(tmp_path) == ("node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***; job 14 still "
                                  "ending (COMPLETING 0.3 s after its step ended): the state it ended in is not "
                                  "final yet")
    assert 2 <= _asked(calls) <= 8  # looked again, and stopped looking at the bound


@pytest.mark.parametrize("state", ["RUNNING", ""])
def test_a_job_that_did_not_end_is_not_waited_for(monkeypatch, tmp_path, state):
    """A step cancelled alone leaves its job RUNNING; a squeue that does not answer says nothing."""
    calls = _fake(monkeypatch, tmp_path, "squeue", {"": [state]})
    assert _stopped(tmp_path) == "node 0: *** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***"
    assert _asked(calls) == 1


def test_the_rendezvous_is_on_the_first_nodes_name_not_its_address(monkeypatch, tmp_path):
    """The first node by the name Slurm gives it, though Slurm knows an address for it: torchrun's
    agent hosts the store where the endpoint names its machine, and takes an address as itself only
    where its host name resolves to it there (rendezvous_host says why); none where squeue says no
    node list (the run then takes task 0's name, as the shared-directory step found it)."""
    _fake(monkeypatch, tmp_path, "squeue", {"": ["vmn[0-1]"]})
    scontrol = _fake(monkeypatch, tmp_path, "scontrol", {
        "show hostnames vmn[0-1]": ["vmn0\nvmn1"],
        "show node": ["NodeName=vmn0 Arch=x86_64 NodeAddr=10.200.0.1 NodeHostName=vmn0"]})
    assert slurm.rendezvous_host("14") == "vmn0"
    assert scontrol.read_text().splitlines() == ["show hostnames vmn[0-1]"]
    _fake(monkeypatch, tmp_path, "squeue", {"": [""]})
    assert slurm.rendezvous_host("14") is None
