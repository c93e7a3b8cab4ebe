"""pytest integration: each runbook phase point is one parametrized test carrying its phase,
profile and hardware markers, so ``pytest -m a100``, ``pytest -m bucket_sweep`` and ``-k`` reruns
select what runs; results go to the store; the report is rendered once at session end.

Enable from the root conftest.py: ``pytest_plugins = ["validation.pytest_plugin"]``.

Options: --runbook (repeatable; default every runbook in runbooks/), --profile (repeatable;
default each runbook's profiles), --results-dir (default: ./results for an acceptance run, a
temporary directory for a plain test run, see ``results_dir_for``), --hardware-mismatch
run|skip (skip turns a GPU-model mismatch into a skip), --progress-every SECONDS,
--no-acceptance-report, --baseline DIR (compare with the results stored in DIR: in the report,
and a tokens/s drop beyond the profile's max_toks_regression fails the report check).

The plugin is also a pytest11 entry point (pyproject.toml), so that its options are known before
any conftest is read: pytest otherwise takes the value of ``--results-dir DIR`` for a test path
when DIR exists, makes its directory the rootdir and never reads this repository's conftest.
pytest still picks its rootdir and ini file before any plugin's options are known, so a command
line that gives such a path as a separate argument is run again as ``--opt=PATH``
(``pytest_load_initial_conftests`` below).
Tests that request the ``acceptance_point`` fixture are parametrized; ``acceptance_report``
tests get one (runbook, profile) pair each and check the session's cross-point findings.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from validation import DEFAULT_RESULTS_DIR, REPO_ROOT, checkout_problem
from validation.errors import HarnessError, StoreError
from validation.judge.findings import find
from validation.judge.findings.finding import Severity
from validation.judge.findings.throughput import CROSS_POINT
from validation.judge.record import PhaseRecord, Status
from validation.report import build as report
from validation.runbook.load import available, load_profile, load_runbook
from validation.runbook.plan import PhasePoint, expand
from validation.session.run import MISMATCH_POLICIES, module_missing, run_point, why_not
from validation.store import baseline, goldens

_POINTS_KEY = pytest.StashKey[list]()
_RAN_KEY = pytest.StashKey[dict]()
_DIR_KEY = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("nsa-validate", "NSA acceptance harness")
    g.addoption("--runbook", action="append", default=None, help="runbook name or YAML path (repeatable; default: all)")
    g.addoption("--profile", action="append", default=None, help="hardware profile (repeatable; default: the runbook's)")
    g.addoption("--results-dir", default=None, help=f"result store directory (default: {DEFAULT_RESULTS_DIR})")
    g.addoption("--hardware-mismatch", choices=MISMATCH_POLICIES, default="run",
                help="run (and report) or skip when the GPUs differ from the profile's")
    g.addoption("--no-acceptance-report", action="store_true", help="do not render the report at session end")
    g.addoption("--progress-every", type=float, default=15.0, metavar="SECONDS",
                help="a running point's progress line (step, tokens/s, ETA) every SECONDS (default 15)")
    g.addoption("--baseline", default=None, metavar="DIR",
                help="results directory to compare with point by point (report section; a tokens/s drop beyond "
                     "the profile's max_toks_regression fails the report check)")


#: options whose value is a path: given as a separate argument of an existing path, pytest (which
#: picks its rootdir and ini file before any plugin's options are known) takes it for a test path
_PATH_OPTIONS = ("--results-dir", "--baseline", "--runbook", "--profile")
_REEXEC_ENV = "VALIDATION_PYTEST_REEXEC"


def _joined_path_options(args: list[str]) -> list[str] | None:
    """``args`` with each ``--opt PATH`` of an existing PATH written ``--opt=PATH``; None when
    there is none."""
    out, changed, i = [], False, 0
    while i < len(args):
        if args[i] in _PATH_OPTIONS and i + 1 < len(args) and Path(args[i + 1]).exists():
            out.append(f"{args[i]}={args[i + 1]}")
            changed, i = True, i + 2
            continue
        out.append(args[i])
        i += 1
    return out if changed else None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """``pytest -m long_run --results-dir /data/r`` into an existing /data/r: pytest took /data/r
    for a test path, found no ini file above it and ran without this repository's pytest.ini
    (markers unknown, --strict-markers off). The command line is run again, as it was typed,
    with ``--results-dir=/data/r``; only a command-line pytest (never one run in-process by
    another program), and only once."""
    if os.environ.pop(_REEXEC_ENV, None):  # run again already: the variable goes no further
        return
    if early_config.inipath is not None or not (REPO_ROOT / "pytest.ini").is_file():
        return
    typed = list(early_config.invocation_params.args)
    fixed = _joined_path_options(typed)
    if fixed is None or sys.argv[1:] != typed or hasattr(early_config, "workerinput"):
        return
    interpreter_args = sys.orig_argv[:len(sys.orig_argv) - len(typed)]  # python [-m pytest | .../pytest]
    capture = early_config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # give stdout and stderr back: pytest has pointed them at its capture files
        capture.stop_global_capturing()
    os.environ[_REEXEC_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [*interpreter_args, *fixed])


def _baseline_dir(config: pytest.Config) -> Path | None:
    option = config.getoption("--baseline")
    if option is None:
        return None
    path = Path(option).resolve()
    if not (path / "results.json").is_file():
        raise pytest.UsageError(f"nsa-validate: --baseline {option}: no result store there (results.json not found)")
    return path


def results_dir_for(option: str | None, markexpr: str, runbook_opts: list[str] | None,
                    profile_opts: list[str] | None, acceptance_markers: set[str], temp: Path) -> Path:
    """Where phase points store their records: --results-dir when given; ./results for an
    acceptance run (a marker expression naming a profile or phase marker, or --runbook /
    --profile); otherwise, in a plain test run such as the README's test command, ``temp``, so
    that tests never overwrite the user's results."""
    if option:
        return Path(option).resolve()
    words = set(markexpr.replace("(", " ").replace(")", " ").split())
    if runbook_opts or profile_opts or words & acceptance_markers:
        return DEFAULT_RESULTS_DIR
    return temp


#: a plain test run's results directory, made by the controller and inherited by xdist workers
_SESSION_DIR_ENV = "VALIDATION_TEST_RESULTS_DIR"


def _results_dir(config: pytest.Config) -> Path:
    if _DIR_KEY not in config.stash:
        markers = {p.profile.marker for p in _points(config)} | {p.phase.name for p in _points(config)}
        config.stash[_DIR_KEY] = results_dir_for(
            config.getoption("--results-dir"), config.getoption("-m") or "", config.getoption("--runbook"),
            config.getoption("--profile"), markers,
            Path(os.environ.get(_SESSION_DIR_ENV) or tempfile.mkdtemp(prefix="nsa-validate-tests-")))
    return config.stash[_DIR_KEY]


def _known_markers(config: pytest.Config) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


def _points(config: pytest.Config) -> list[PhasePoint]:
    """Every (runbook, profile, phase, sweep point) selected by the options, loaded once."""
    if _POINTS_KEY in config.stash:
        return config.stash[_POINTS_KEY]
    problem = checkout_problem()
    if problem:
        raise pytest.UsageError(f"nsa-validate: {problem}")
    names = config.getoption("--runbook") or available()
    wanted = config.getoption("--profile") or []
    points: list[PhasePoint] = []
    try:
        # an unknown profile is an error, not a silent empty selection
        wanted_names = {w: load_profile(w).name for w in wanted}
        used: set[str] = set()
        for name in names:
            rb = load_runbook(name, known_markers=_known_markers(config))
            for prof_name in rb.profiles:
                prof = load_profile(prof_name)
                if wanted and prof.name not in wanted_names.values():
                    continue
                used.add(prof.name)
                goldens.check_readable(rb.path, rb.name, prof.name)  # an unreadable golden file stops the session
                points += expand(rb, prof)
        unused = [w for w, n in wanted_names.items() if n not in used]
        if unused:
            raise HarnessError(f"--profile {', '.join(unused)}: no selected runbook uses it (runbooks: "
                               f"{', '.join(names)}; their profiles: "
                               f"{', '.join(sorted({p for n in names for p in load_runbook(n).profiles}))})")
    except HarnessError as exc:
        raise pytest.UsageError(f"nsa-validate: {exc}") from None
    config.stash[_POINTS_KEY] = points
    return points


def _marks(names: tuple[str, ...]) -> list[Any]:
    return [getattr(pytest.mark, m) for m in names]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "acceptance_point" in metafunc.fixturenames:
        points = _points(metafunc.config)
        metafunc.parametrize("acceptance_point", [pytest.param(p, id=p.test_id, marks=_marks(p.markers)) for p in points])
    if "acceptance_pair" in metafunc.fixturenames:
        pairs: dict[tuple[str, str], PhasePoint] = {}
        for p in _points(metafunc.config):
            pairs.setdefault((p.runbook.name, p.profile.name), p)
        params = []
        for (rb, prof), p in pairs.items():
            ms = [p.profile.marker] + (["gpu"] if p.profile.hardware.accelerator == "cuda" else [])
            params.append(pytest.param((rb, prof), id=f"{rb}/{prof}", marks=_marks(tuple(ms))))
        metafunc.parametrize("acceptance_pair", params)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Report checks run after every phase point of the session."""
    last = [i for i in items if "acceptance_pair" in getattr(i, "fixturenames", ())]
    items[:] = [i for i in items if i not in last] + last


class _TerminalProgress:
    """A running point's progress on the terminal's stderr, past pytest's output capture (as
    live logging does); xdist workers share the controller's stderr. A line every ``every_s``
    seconds, the first after ``every_s`` (a point shorter than that prints none)."""

    def __init__(self, config: pytest.Config):
        self.every_s, self.last, self.lock = config.getoption("--progress-every"), time.monotonic(), threading.Lock()
        self.capman = config.pluginmanager.getplugin("capturemanager")

    def __call__(self, line: str) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last < self.every_s:
                return
            self.last = now
        with self.capman.global_and_fixture_disabled() if self.capman else contextlib.nullcontext():
            print(f"nsa-validate: {line}", file=sys.stderr, flush=True)


class Harness:
    """What an acceptance test needs: run a point, know the results directory."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.results_dir = _results_dir(config)
        self.mismatch = config.getoption("--hardware-mismatch")

    def run(self, point: PhasePoint) -> PhaseRecord:
        from validation.machine import detect
        reason = why_not(point, detect(), self.mismatch)
        if reason is None:
            reason = module_missing(point)
            if reason:
                pytest.skip(f"{reason} (the trainer is not runnable here yet)")
        record = run_point(point, self.results_dir, mismatch=self.mismatch,
                           progress=_TerminalProgress(self.config))
        self.config.stash.setdefault(_RAN_KEY, {})[point.test_id] = record
        if reason:
            pytest.skip(reason)
        return record


@pytest.fixture(scope="session")
def harness(request: pytest.FixtureRequest) -> Harness:
    return Harness(request.config)


class _Session:
    """Per-session bookkeeping: which (runbook, profile) pairs ran (from test reports, so it
    works under xdist too), and rendering the reports once, on the controller."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.pairs: set[tuple[str, str]] = set()
        self.reports: list[Any] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and "[" in report.nodeid and not report.skipped:
            name, param = report.nodeid.split("[", 1)
            parts = param.rstrip("]").split("/")
            if name.endswith("test_phase") and len(parts) == 4:
                self.pairs.add((parts[0], parts[1]))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return  # xdist workers store records; the controller renders
        temp = os.environ.get(_SESSION_DIR_ENV)
        if temp and Path(temp).is_dir() and not any(Path(temp).iterdir()):
            os.rmdir(temp)  # no point ran: leave no empty directory behind
        if self.config.getoption("--no-acceptance-report"):
            return
        loaded = {(p.runbook.name, p.profile.name): (p.runbook, p.profile) for p in _points(self.config)}
        for rb_name, prof_name in sorted(self.pairs):
            try:
                rb, prof = loaded.get((rb_name, prof_name)) or (load_runbook(rb_name), load_profile(prof_name))
                base, note = _baseline_dir(self.config), ""
                if base is not None:
                    try:  # a baseline without this pair: the report still renders, and says why it compares nothing
                        baseline.load(base, _results_dir(self.config), rb_name, prof_name)
                    except StoreError as exc:
                        base, note = None, f" (no comparison: {exc})"
                out = report.render(_results_dir(self.config), rb_name, prof_name, runbook=rb, profile=prof,
                                    baseline=base)
                self.reports.append(f"{out.verdict} -> {out.path}{note}")
            except HarnessError as exc:
                self.reports.append(f"report for {rb_name}/{prof_name} not rendered: {exc}")

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        for line in self.reports:
            terminalreporter.write_line(f"nsa-validate report: {line}")


#: signals that end a session as Ctrl-C does; at their default they killed pytest at once and the
#: running trainer (in a session of its own) ran on as an orphan
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_SAVED_HANDLERS = pytest.StashKey[dict]()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)  # runner.run kills the trainer's tree on its way out


def _stop_signals_interrupt(config: pytest.Config) -> None:
    """SIGTERM (a scheduler's cancel, `timeout`, `kill`) and SIGHUP (a closed terminal) raise
    KeyboardInterrupt, as Ctrl-C does, where nobody handles them yet; restored at unconfigure."""
    if threading.current_thread() is not threading.main_thread():
        return
    saved = {}
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            saved[sig] = signal.signal(sig, _interrupt)
    config.stash[_SAVED_HANDLERS] = saved


def pytest_unconfigure(config: pytest.Config) -> None:
    for sig, handler in config.stash.get(_SAVED_HANDLERS, {}).items():
        signal.signal(sig, handler)


def _runbook_given_as_marker(config: pytest.Config) -> str | None:
    """The runbook a ``-m`` expression names where a marker belongs (``pytest -m cpu_smoke``):
    pytest would only say the marker is unknown."""
    words = set(re.findall(r"[A-Za-z_]\w*", config.option.markexpr or "")) - {"and", "or", "not"}
    markers = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    return next((w for w in sorted(words - markers) if w in available()), None)


def pytest_configure(config: pytest.Config) -> None:
    named = _runbook_given_as_marker(config) if config.rootpath == REPO_ROOT else None
    if named is not None:
        raise pytest.UsageError(f"-m {named}: {named} is a runbook, not a marker; run it with --runbook "
                                f"{named} (markers select phases, e.g. -m long_run, and profiles, e.g. "
                                "-m cpu_profile; `nsa-validate phases --runbook NAME` lists them)")
    # a controller (or lone) session of this repository's tests gets a results directory of its
    # own, whatever it inherited; its xdist workers inherit it (other projects' sessions in this
    # environment, which load the plugin too, get none)
    if not hasattr(config, "workerinput") and config.rootpath == REPO_ROOT:
        os.environ[_SESSION_DIR_ENV] = tempfile.mkdtemp(prefix="nsa-validate-tests-")
    if config.rootpath == REPO_ROOT:
        _stop_signals_interrupt(config)
    base = _baseline_dir(config)  # a --baseline without a store is a usage error before anything runs
    if base is not None and base == _results_dir(config).resolve():  # so is one that is the results dir itself
        raise pytest.UsageError(f"nsa-validate: --baseline {config.getoption('--baseline')} is the results "
                                "directory itself; give the results directory of another run")
    config.pluginmanager.register(_Session(config), "nsa-validate-session")


def session_findings(config: pytest.Config, pair: tuple[str, str]) -> tuple[list[str], int]:
    """Critical findings across the points of ``pair`` run in this process (a cliff only shows
    across sweep points, which no single point's test can see; a regression against --baseline
    only against another run), and how many points ran."""
    records = [r for r in config.stash.get(_RAN_KEY, {}).values()
               if (r.key.runbook, r.key.profile) == pair and r.status != Status.SKIP]
    extra = []
    base_dir = _baseline_dir(config)
    if base_dir is not None and records:
        profile = next(p.profile for p in _points(config) if (p.runbook.name, p.profile.name) == pair)
        extra = baseline.compare(records, baseline.load(base_dir, _results_dir(config), *pair), base_dir,
                                 profile.thresholds.get(baseline.REGRESSION_KEY)).findings()
    cross = [f for f in find(records) if f.severity == Severity.CRITICAL and f.kind in CROSS_POINT]
    return [f.title for f in cross + extra], len(records)
