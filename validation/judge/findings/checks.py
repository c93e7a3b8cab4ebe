"""Findings of points that run no trainer and failed in their own way: a pytest point (sanity,
selection_parity: this repository's tests) whose tests failed, which pytest could not run, or
which left no JUnit XML; a preflight point that could not record the commit, collect_env or
nvidia-smi. Neither has an output contract, so neither is ever 'a trainer that broke it'; each
finding names what failed, the files to read, the command that runs the tests alone and the line
that re-runs only that point (what validation/judge/misses.py typed where it was found)."""
from __future__ import annotations

import shlex

from validation.judge.findings.finding import Facts, Finding, Severity, where
from validation.judge.misses import Miss, pytest_ended
from validation.judge.record import PhaseRecord, Status

#: the kinds of points this module judges
CHECK_KINDS = ("pytest", "preflight")
#: the log each preflight item's command leaves in the point's directory (launch/kinds.py's log names)
_PREFLIGHT_LOGS = {Miss.GIT_SHA: ("git describe", "git_describe.stderr.log"),
                   Miss.COLLECT_ENV: ("collect_env", "collect_env.stderr.log"),
                   Miss.NVIDIA_SMI: ("nvidia-smi", "nvidia_smi.stderr.log")}


def failed_checks(records: list[PhaseRecord]) -> list[Finding]:
    """A finding per pytest or preflight point that ran and failed or erred on its own terms, or
    that the harness stopped at its timeout (its own finding, never a trainer's stall: no rank,
    heartbeat or stack is any part of it); not a point that never ran."""
    out = []
    for r in records:
        if r.kind not in CHECK_KINDS or r.status not in (Status.FAIL, Status.ERROR) or r.evidence.not_run:
            continue
        if r.timed_out or r.stalled_s is not None:
            out.append(_timed_out(r))
            continue
        finding = _pytest(r) if r.kind == "pytest" else _preflight(r)
        if finding is not None:
            out.append(finding)
    return out


def _files(r: PhaseRecord, *names: str) -> list[str]:
    return [f"{r.out_dir}/{n}" for n in names if n in r.evidence.files]


def tests_alone(r: PhaseRecord) -> str | None:
    """'python -m pytest tests/unit/x.py -k "a or b"': the point's tests and arguments as its
    command ran them (everything after its --junitxml), to run from the repository root."""
    at = next((i for i, a in enumerate(r.command) if a.startswith("--junitxml=")), None)
    return None if at is None else shlex.join(["python", "-m", "pytest", *r.command[at + 1:]])


def _timed_out(r: PhaseRecord) -> Finding:
    """A pytest or preflight point the harness killed at the phase's timeout_s: what ran, the
    output it left (how far it got) and how to run it alone."""
    if r.kind == "pytest":
        alone = tests_alone(r)
        logs = _files(r, "pytest.stdout.log", "pytest.stderr.log")
        detail = ([f"pytest's output so far (how far it got): {', '.join(logs)}"] * bool(logs)
                  + [f"run the tests alone, from the repository root: {alone}"] * bool(alone))
        return Finding(Severity.CRITICAL, r.phase, f"timed out in {where(r)}: pytest was still running at the phase's "
                       f"{r.timeout_s:g} s timeout_s and was killed; no test outcome was counted", detail,
                       "tests_timeout", Facts.of(r), rerun=r)
    logs = [f"{cmd}'s error output: {r.out_dir}/{log}" for cmd, log in _PREFLIGHT_LOGS.values() if log in r.evidence.files]
    return Finding(Severity.CRITICAL, r.phase, f"timed out in {where(r)}: preflight was still running at the phase's "
                   f"{r.timeout_s:g} s timeout_s and was killed", logs, "preflight_timeout",
                   Facts.of(r), rerun=r)


def _pytest(r: PhaseRecord) -> Finding | None:
    ev, misses = r.evidence, set(r.evidence.misses)
    alone = tests_alone(r)
    how = [f"run the tests alone, from the repository root: {alone}"] if alone else []
    logs = _files(r, "pytest.stdout.log", "pytest.stderr.log")
    if Miss.TEST_PATHS in misses or r.exit_code not in (0, 1, None):
        what = pytest_ended(r.exit_code) if r.exit_code not in (0, None) else "pytest could not run the tests"
        return Finding(Severity.CRITICAL, r.phase, f"tests not run in {where(r)}: {what}",
                       ev.errors + [f"pytest's output: {', '.join(logs)}"] * bool(logs) + how,
                       "tests_not_run", Facts.of(r), rerun=r)
    if Miss.JUNIT in misses:
        return Finding(Severity.CRITICAL, r.phase, f"no test outcome in {where(r)}: {ev.errors[0] if ev.errors else ''}"
                       f" (pytest exit code {r.exit_code})",
                       ev.errors[1:] + [f"pytest's output: {', '.join(logs)}"] * bool(logs) + how,
                       "no_junit", Facts.of(r), rerun=r)
    if r.exit_code == 1:
        failed, passed = r.metrics.tests_failed, r.metrics.tests_passed
        counts = (f": {failed:g} failed, {passed:g} passed" if failed is not None and passed is not None else "")
        return Finding(Severity.CRITICAL, r.phase, f"tests failed in {where(r)}{counts}",
                       _files(r, "junit.xml") + [f"pytest's output: {', '.join(logs)}"] * bool(logs) + how,
                       "tests_failed", Facts.of(r), rerun=r)
    return None  # it ran clean and a gate failed: failed_gates says which


def _preflight(r: PhaseRecord) -> Finding | None:
    ev, misses = r.evidence, r.evidence.misses
    if not misses and not ev.errors:
        return None  # a gate failed on its counts: failed_gates says which
    logs = [f"{_PREFLIGHT_LOGS[m][0]}'s error output: {r.out_dir}/{_PREFLIGHT_LOGS[m][1]}" for m in misses
            if m in _PREFLIGHT_LOGS and _PREFLIGHT_LOGS[m][1] in ev.files]
    return Finding(Severity.CRITICAL, r.phase, f"preflight incomplete in {where(r)}: {'; '.join(ev.errors[:1])}",
                   ev.errors[1:] + logs, "preflight", Facts.of(r), rerun=r)
