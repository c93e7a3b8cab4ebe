"""Fixtures for the harness's own tests: runbooks in tmp_path that launch the fake trainer."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions

FAKE = "validation.tests.fake_trainer"


class StagedLoad:
    """A stand-in for the harness's load meter (validation/launch/load.py) that reads what a test
    says the machine was doing: ``monkeypatch.setattr("validation.launch.process.LoadMeter",
    StagedLoad)``, then set ``StagedLoad.load`` before each run."""

    load = None

    def read(self):
        return type(self).load


def write_runbook(path: Path, phases: list[dict[str, Any]], **top: Any) -> Path:
    data = {"name": top.pop("name", "fake"), "profiles": ["cpu"],
            "defaults": {"launcher": {"kind": "python", "module": FAKE}, "config": "tiny", "steps": 8,
                         "timeout_s": 30, **top.pop("defaults", {})},
            "phases": phases, **top}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def train_phase(name: str = "baseline_ddp", fault: str = "", gates: list | None = None, **extra: Any) -> dict[str, Any]:
    phase = {"name": name, "kind": "train", "env": {"NSA_FAULT": fault} if fault else {},
             "gates": gates if gates is not None else [
                 {"metric": "toks_per_s_mean", "op": ">=", "threshold": {"profile": "min_toks_per_s"}, "window": "last 5 steps"},
                 {"metric": "loss_finite", "op": "==", "threshold": 1}]}
    phase["env"].update(extra.pop("env", {}))
    phase.update(extra)
    return phase


class FakeRun:
    """Runs every point of a tmp runbook on the fake trainer; keeps records and the report."""

    def __init__(self, tmp_path: Path, phases: list[dict[str, Any]], **top: Any):
        self.results = tmp_path / "results"
        self.runbook = load_runbook(write_runbook(tmp_path / "runbook.yaml", phases, **top))
        self.profile = load_profile("cpu")
        self.records = [AcceptanceSession(SessionOptions(self.results)).run_point(p) for p in expand(self.runbook, self.profile)]
        self.context = build_context(self.results, self.runbook.name, "cpu", runbook=self.runbook,
                                     profile=self.profile, now="2026-01-01 00:00 UTC")
        self.report = render_text({**self.context, "results_prefix": ".."})

    @property
    def record(self) -> dict[str, Any]:
        assert len(self.records) == 1
        return self.records[0]

    def findings(self, severity: str | None = None) -> list[str]:
        return [f.title + "\n" + "\n".join(f.detail) for f in self.context["findings"]
                if severity is None or f.severity == severity]


@pytest.fixture
def fake_run(tmp_path):
    return lambda phases, **top: FakeRun(tmp_path, phases, **top)


def error_line(err: str) -> str:
    """The one ``nsa-validate: error:`` line of a command's stderr, which holds no traceback."""
    assert "Traceback" not in err, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("nsa-validate: error: ")]
    return line


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` made one this process cannot write in: mode 555, or immutable where the tests
    run as root (root writes through the mode bits)."""
    if os.geteuid() == 0:
        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("running as root without chattr +i on this file system: no folder is read-only to root")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)


def slow_second_point(tmp_path: Path) -> tuple[Path, Callable[[Path], list[Path]]]:
    """A runbook of a quick point and a slow one (about 20 s), and the slow one's training.csv."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run", steps=400,
                                                                         env={"NSA_FAKE_STEP_S": "0.05"})])
    return rb, lambda results: list(results.glob("runs/fake/cpu/long_run/default/*/training.csv"))


def default_sigint() -> None:
    """A child's Ctrl-C as a terminal gives it (``preexec_fn``): an ignored SIGINT is inherited across
    exec, and a test process may hold one: in full-suite runs a SIGINT to the pytest run a test started
    had no effect, and started under a parent that ignores SIGINT the same tests fail alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_when_training(proc: subprocess.Popen, csvs: Callable[[], list[Path]], rows: int = 3,
                            within_s: float = 90) -> tuple[str, str]:
    """SIGINT to ``proc`` once a training.csv of ``csvs()`` holds ``rows`` lines; its output."""
    deadline = time.monotonic() + within_s
    while not any(len(c.read_bytes().splitlines()) >= rows for c in csvs()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=60)

