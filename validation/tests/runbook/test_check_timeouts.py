"""A pytest or preflight point that runs out of time is said so in its own terms: no rank,
heartbeat, stack dump or py-spy is any part of it (it once got the trainer ranks' stall finding,
"no rank was left running to take a stack of", and its advice about torchrun's exit barrier), and
a preflight command killed at its time is not advised on as one that failed ("not a git checkout")."""
from __future__ import annotations

from pathlib import Path

from validation.judge.findings import find, recommendations
from validation.judge.metrics import RunData
from validation.judge.misses import Miss
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status
from validation.launch import kinds
from validation.launch import process as runner
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand

#: what only a trainer's stall would speak of
_TRAINER_WORDS = ("rank", "heartbeat", "py-spy", "stack", "torchrun", "collective")


def _record(kind: str, **fields) -> PhaseRecord:
    base = dict(key=PointKey("checks", "cpu", "unit"), test_id="checks/cpu/unit/default", kind=kind,
                status=Status.FAIL, reason="timed out: killed by the harness at the phase timeout", exit_code=None,
                timed_out=True, timeout_s=3.0, world_size=1, out_dir="runs/checks/cpu/unit/default/abc",
                command=["python", "-m", "pytest", "-q", "--junitxml=/r/junit.xml", "tests/unit/test_x.py"])
    return PhaseRecord(**{**base, **fields})


def test_a_pytest_point_that_timed_out_is_no_stall_of_ranks():
    rec = _record("pytest", evidence=Evidence(files=["pytest.stdout.log", "pytest.stderr.log"], misses=[Miss.JUNIT],
                                              errors=["/r/junit.xml: pytest wrote no JUnit XML"]))
    findings = find([rec])
    assert [f.kind for f in findings] == ["tests_timeout"], [(f.kind, f.title) for f in findings]
    [f] = findings
    assert f.title == ("timed out in unit [default]: pytest was still running at the phase's 3 s timeout_s and was "
                       "killed; no test outcome was counted")
    assert "run the tests alone, from the repository root: python -m pytest tests/unit/test_x.py" in f.detail
    [advice] = recommendations(findings)
    assert "timeout_s" in advice and not any(w in advice for w in _TRAINER_WORDS), advice


def test_a_preflight_point_that_timed_out_is_no_stall_of_ranks():
    rec = _record("preflight", key=PointKey("checks", "cpu", "preflight"), test_id="checks/cpu/preflight/default",
                  command=[], evidence=Evidence(files=["git_describe.stderr.log"]))
    findings = find([rec])
    assert [f.kind for f in findings] == ["preflight_timeout"], [(f.kind, f.title) for f in findings]
    [advice] = recommendations(findings)
    assert "did not finish" in advice and not any(w in advice for w in _TRAINER_WORDS), advice


def test_a_preflight_command_killed_at_its_time_is_said_to_have_timed_out_not_failed(tmp_path: Path, monkeypatch):
    """git describe hung (a fake git that sleeps): the finding said 'git describe failed (exit None: ...)'
    and the advice 'not a git checkout, git not installed...'."""
    def killed(argv, *, log_dir, log_name, timeout_s, **_):
        out, err = log_dir / f"{log_name}.stdout.log", log_dir / f"{log_name}.stderr.log"
        out.write_text("")
        err.write_text(f"\n[nsa-validate] killed after {timeout_s:g}s timeout\n")
        return runner.ProcResult(list(argv), None, True, timeout_s, out, err)

    monkeypatch.setattr(kinds.runner, "run", killed)
    monkeypatch.setattr(kinds, "REPO_ROOT", tmp_path)  # no SOURCE_SHA stamp to fall back on
    point = expand(load_runbook("cpu_smoke"), load_profile("cpu"), ["preflight"])[0]
    out = tmp_path / "out"
    out.mkdir()
    run, errors = RunData(out_dir=out), []
    kinds.preflight(point, out, run, errors, None)
    assert run.misses == [Miss.TIMED_OUT, Miss.TIMED_OUT], run.misses  # git describe, collect_env
    assert errors[0].startswith("git describe did not finish within "), errors
    assert errors[1].startswith("python -m torch.utils.collect_env did not finish within "), errors
    rec = _record("preflight", key=PointKey("checks", "cpu", "preflight"), test_id="checks/cpu/preflight/default",
                  timed_out=False, exit_code=1, reason="preflight incomplete", command=[],
                  evidence=Evidence(errors=errors, misses=run.misses))
    [advice] = recommendations(find([rec]))
    assert "did not finish within its time" in advice and "not a git checkout" not in advice, advice
