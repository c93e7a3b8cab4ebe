"""A report on disk never says what its store no longer holds. `nsa-validate report` read the
store, a run stored a FAIL of a point meanwhile, and the report, written after it, said GO for
good (the run's own report came first, or the run was killed). A write of the store and a render
of a report now each hold the results directory's lock, and a write removes its pairs' reports:
whichever comes second waits, and what is left on disk agrees with the store.

The interleavings are driven in a chosen order, not raced: a hook inside one side starts the
other in a thread and goes on once that thread has either finished or is waiting for the lock
(``LockWatch``)."""
from __future__ import annotations

import dataclasses
import fcntl
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.judge.gates import GateVerdict
from validation.judge.record import PhaseRecord, Status
from validation.report import build
from validation.session.session import ExitStatus
from validation.store import results as results_module
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook

#: the most a step of a driven interleaving may take before the test fails instead of hanging
STEP_S = 60


class LockWatch:
    """validation.store.lock's ``fcntl``, telling (``moved``) when a lock is asked for that another
    holder has: the asking thread then waits, as it would without the watch."""

    def __init__(self) -> None:
        self.moved = threading.Event()

    def flock(self, fd: int, op: int) -> None:
        if op == fcntl.LOCK_EX:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                self.moved.set()
        fcntl.flock(fd, op)

    def start(self, target, *args) -> threading.Thread:
        """``target(*args)`` in a thread; returns once it has finished or waits for a lock."""
        def run() -> None:
            try:
                target(*args)
            finally:
                self.moved.set()
        thread = threading.Thread(target=run)
        thread.start()
        assert self.moved.wait(STEP_S), f"{target} neither finished nor waited for a lock"
        return thread


@pytest.fixture
def watch(monkeypatch) -> LockWatch:
    w = LockWatch()
    monkeypatch.setattr("validation.store.lock.fcntl",
                        types.SimpleNamespace(flock=w.flock, LOCK_EX=fcntl.LOCK_EX, LOCK_UN=fcntl.LOCK_UN))
    return w


@pytest.fixture
def go(tmp_path, capsys) -> tuple[Path, PhaseRecord]:
    """A point run once into results/ and its GO report written: (results, the FAIL record a run
    of the same point stores next)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == ExitStatus.GO
    capsys.readouterr()
    [rec] = ResultStore(results).records()
    gates = [dataclasses.replace(g, value=0.0, verdict=GateVerdict.FAIL) if g.metric == "loss_finite" else g
             for g in rec.gates]
    return results, dataclasses.replace(rec, gates=gates, status=Status.FAIL, reason="loss_finite = 0, needs == 1")


def _report(results: Path) -> Path:
    return results / "reports" / "fake__cpu.md"


def _verdict(report: Path) -> str | None:
    return next((line for line in report.read_text().splitlines() if line.startswith("**Status:")), None) \
        if report.exists() else None


def test_a_record_stored_while_the_report_is_rendered_waits_and_then_removes_it(go, watch, monkeypatch, capsys):
    """The run's FAIL comes between the report's read of the store and its write of the report."""
    results, fail = go
    threads: list[threading.Thread] = []
    render_text = build.render_text

    def run_stores_now(*args, **kwargs):
        threads.append(watch.start(ResultStore(results).put, fail))
        return render_text(*args, **kwargs)

    monkeypatch.setattr(build, "render_text", run_stores_now)
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == ExitStatus.GO  # the store it read
    [thread] = threads
    thread.join(STEP_S)
    assert not thread.is_alive()
    assert [r.status for r in ResultStore(results).records()] == [Status.FAIL]
    assert not _report(results).exists()  # the GO report of the record replaced is gone, not left saying GO
    monkeypatch.setattr(build, "render_text", render_text)
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == ExitStatus.NO_GO
    assert _verdict(_report(results)) == "**Status: NO-GO** ❌"


def test_a_report_rendered_while_a_record_is_stored_waits_and_renders_it(go, watch, monkeypatch, capsys):
    """`nsa-validate report` starts while the run holds the lock to store its FAIL."""
    results, fail = go
    threads: list[threading.Thread] = []
    statuses: list[int] = []
    write_atomic = results_module.write_atomic

    def report_renders_now(*args, **kwargs):
        threads.append(watch.start(lambda: statuses.append(
            main(["report", "--results-dir", str(results), "--no-plots"]))))
        return write_atomic(*args, **kwargs)

    monkeypatch.setattr(results_module, "write_atomic", report_renders_now)
    ResultStore(results).put(fail)
    [thread] = threads
    thread.join(STEP_S)
    assert not thread.is_alive()
    assert statuses == [ExitStatus.NO_GO]
    assert _verdict(_report(results)) == "**Status: NO-GO** ❌"


def test_a_write_removes_the_reports_of_its_pairs_first_and_no_other(go):
    """Killed (SIGKILL) between the two, it leaves no report of the pair and the store as it was:
    never a report the store contradicts. Another pair's report is not the write's to remove."""
    results, fail = go
    other = results / "reports" / "other__cpu.md"
    other.write_text("the report of another runbook\n")
    before = (results / "results.json").read_bytes()
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from validation.judge.record import PhaseRecord
        from validation.store import results
        from validation.store.results import ResultStore
        results.write_atomic = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        store = ResultStore({str(results)!r})
        store.put(PhaseRecord.from_json({fail.to_json()!r}, "test"))
        """)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=STEP_S)
    assert killed.returncode == -9, killed.stderr
    assert (results / "results.json").read_bytes() == before
    assert not _report(results).exists()
    assert other.read_text() == "the report of another runbook\n"
    ResultStore(results).put(fail)
    assert other.exists() and not _report(results).exists()
