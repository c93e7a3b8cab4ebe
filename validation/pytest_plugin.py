"""pytest integration, a door into the acceptance session (validation/session/session.py) as the
CLI is: each runbook phase point is one parametrized test carrying its phase, profile and
hardware markers, so ``pytest -m a100``, ``pytest -m bucket_sweep`` and ``-k`` reruns select what
runs; results go to the store; the report is rendered once at session end. The plugin is these
hooks plus one ``AcceptancePlugin`` object registered in ``pytest_configure`` (pytest-xdist's
shape), which holds the session; every runbook's own phase names are registered as markers, so
``pytest -m <phase> --runbook /elsewhere/my.yaml`` works for any phase name.

Enable from the root conftest.py: ``pytest_plugins = ["validation.pytest_plugin"]``.

Options: --runbook (repeatable; default every runbook in runbooks/), --profile (repeatable;
default each runbook's profiles), --results-dir (default: ./results for an acceptance run, a
temporary directory for a plain test run, see ``results_dir_for``), --hardware-mismatch
run|skip (skip turns a GPU-model mismatch into a skip), --progress-every SECONDS,
--no-acceptance-report, --baseline DIR (compare with the results stored in DIR: in the report,
and a tokens/s drop beyond the profile's max_toks_regression fails the report check),
--tensorboard DIR (the train points' per-step metrics as TensorBoard event files, beside the report).

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
from typing import Any, Iterable

import pytest

from validation import DEFAULT_RESULTS_DIR, REPO_ROOT
from validation.errors import HarnessError, StoreError
from validation.judge.record import PhaseRecord, Status
from validation.runbook.load import available, load_profile, load_runbook
from validation.runbook.plan import PhasePoint
from validation.session.session import (
    MISMATCH_POLICIES,
    AcceptanceSession,
    ExitStatus,
    NotLaunchable,
    SessionOptions,
    report_line,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("nsa-validate", "NSA acceptance harness")
    g.addoption("--runbook", action="append", default=None, help="runbook name or YAML path (repeatable; default: all)")
    g.addoption("--profile", action="append", default=None, help="hardware profile (repeatable; default: the runbook's; where the "
                "results dir holds its points run with a profile file of that name, that file)")
    g.addoption("--results-dir", default=None,
                help=f"result store directory (default: {DEFAULT_RESULTS_DIR} for an acceptance run, whose -m names a "
                     "profile or phase marker or which gives --runbook or --profile; a temporary directory for a plain "
                     "test run, its report's path printed at the end)")
    g.addoption("--hardware-mismatch", choices=MISMATCH_POLICIES, default="run",
                help="run (and report) or skip when the GPUs differ from the profile's")
    g.addoption("--no-acceptance-report", action="store_true", help="do not render the report at session end")
    g.addoption("--progress-every", type=float, default=15.0, metavar="SECONDS",
                help="a running point's progress line (step, tokens/s, ETA) every SECONDS (default 15)")
    g.addoption("--baseline", default=None, metavar="DIR",
                help="results directory to compare with point by point (report section; a tokens/s drop beyond "
                     "the profile's max_toks_regression fails the report check)")
    g.addoption("--tensorboard", default=None, metavar="DIR",
                help="also write the train points' per-step metrics as TensorBoard event files under DIR "
                     "(needs pip install -e '.[tensorboard]')")


#: options whose value is a path: given as a separate argument of an existing path, pytest (which
#: picks its rootdir and ini file before any plugin's options are known) takes it for a test path
_PATH_OPTIONS = ("--results-dir", "--baseline", "--runbook", "--profile", "--tensorboard")
_REEXEC_ENV = "VALIDATION_PYTEST_REEXEC"


#: the acceptance tests: what an acceptance run outside the checkout collects (see
#: pytest_load_initial_conftests)
ACCEPTANCE_TESTS = REPO_ROOT / "validation" / "tests" / "test_acceptance.py"


def _with_acceptance_tests(args: list[str]) -> list[str]:
    """``args`` of an acceptance run (--runbook or --profile given) that names no test path, with
    the acceptance tests named: from another directory pytest would collect that directory's tests
    (none) and run nothing."""
    given = any(a.split("=")[0] in ("--runbook", "--profile") for a in args)
    paths = [a for a in args if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    return [*args, str(ACCEPTANCE_TESTS)] if given and not paths else args


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
    """Outside this repository (no ini file found): ``pytest -m long_run --results-dir /data/r``
    into an existing /data/r, where pytest took /data/r for a test path and ran without this
    repository's pytest.ini (markers unknown, --strict-markers off), and ``pytest -m my_phase
    --runbook my.yaml`` from the directory of my.yaml, where pytest collected nothing. The command
    line is run again, as it was typed, with ``--results-dir=/data/r`` and the acceptance tests
    named (``_with_acceptance_tests``); only a command-line pytest (never one run in-process by
    another program), and only once."""
    if os.environ.pop(_REEXEC_ENV, None):  # run again already: the variable goes no further
        return
    if early_config.inipath is not None or not (REPO_ROOT / "pytest.ini").is_file():
        return
    typed = list(early_config.invocation_params.args)
    fixed = _with_acceptance_tests(_joined_path_options(typed) or typed)
    if fixed == typed or sys.argv[1:] != typed or hasattr(early_config, "workerinput"):
        return
    interpreter_args = sys.orig_argv[:len(sys.orig_argv) - len(typed)]  # python [-m pytest | .../pytest]
    capture = early_config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # give stdout and stderr back: pytest has pointed them at its capture files
        capture.stop_global_capturing()
    os.environ[_REEXEC_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [*interpreter_args, *fixed])


def is_acceptance_run(markexpr: str, runbook_opts: list[str] | None, profile_opts: list[str] | None,
                      acceptance_markers: set[str]) -> bool:
    """Whether this pytest run is an acceptance run: a marker expression naming a profile or phase
    marker, or --runbook / --profile; not a plain test run such as the README's test command."""
    words = set(markexpr.replace("(", " ").replace(")", " ").split())
    return bool(runbook_opts or profile_opts or words & acceptance_markers)


#: the test module whose tests are the phase points (they request ``acceptance_point``)
ACCEPTANCE_TESTS = REPO_ROOT / "validation" / "tests" / "test_acceptance.py"


def selects_only_points(markexpr: str, acceptance_markers: set[str], suite_markers: set[str]) -> bool:
    """Whether ``-m markexpr`` can select nothing but phase points: it names only profile and phase
    markers, none that this repository's own tests carry, and negates none (``not h200`` selects
    every unit test). Then nothing but the acceptance module need be collected: the rest of the
    suite takes longer to import than a short acceptance run takes to run."""
    words = set(re.findall(r"[A-Za-z_]\w*", markexpr)) - {"and", "or"}
    return bool(words) and words <= acceptance_markers and not words & suite_markers


def results_dir_for(option: str | None, acceptance_run: bool, temp: Path) -> Path:
    """Where phase points store their records: --results-dir when given; ./results for an
    acceptance run; otherwise, in a plain test run, ``temp``, so that tests never overwrite the
    user's results."""
    if option:
        return Path(option).expanduser().resolve()
    return DEFAULT_RESULTS_DIR if acceptance_run else temp


#: a plain test run's results directory, made by the controller and inherited by xdist workers
_SESSION_DIR_ENV = "VALIDATION_TEST_RESULTS_DIR"
_PLUGIN = "nsa-validate-session"


def _ini_markers(config: pytest.Config) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


def _marks(config: pytest.Config, names: tuple[str, ...]) -> list[Any]:
    """A point's marks, each registered first where pytest does not know it yet: the marker of a
    profile file the store's points ran with, which neither a runbook nor --profile named
    (--strict-markers refuses an unknown mark at collection)."""
    known = _ini_markers(config)
    for m in names:
        if m not in known:
            config.addinivalue_line("markers", f"{m}: marker of a point's hardware profile")
            known.add(m)
    return [getattr(pytest.mark, m) for m in names]


class _TerminalProgress:
    """A running point's progress on the terminal's stderr, past pytest's output capture (as
    live logging does); xdist workers share the controller's stderr. A line every ``every_s``
    seconds, the first after ``every_s`` (a point shorter than that prints none)."""

    def __init__(self, config: pytest.Config):
        self.every_s, self.last, self.lock = config.getoption("--progress-every"), time.monotonic(), threading.Lock()
        self.capman = config.pluginmanager.getplugin("capturemanager")

    def __call__(self, test_id: str, line: str) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last < self.every_s:
                return
            self.last = now
        with self.capman.global_and_fixture_disabled() if self.capman else contextlib.nullcontext():
            print(f"nsa-validate: {line}", file=sys.stderr, flush=True)


class AcceptancePlugin:
    """The acceptance session of this pytest run, and the hooks that need it: parametrizing the
    acceptance tests with its points, noting which (runbook, profile) pairs ran (from test
    reports, so it works under xdist too), and rendering their reports once, on the controller."""

    def __init__(self, config: pytest.Config, session: AcceptanceSession, acceptance_run: bool,
                 only_points: bool = False):
        self.config, self.session, self.acceptance_run = config, session, acceptance_run
        self.only_points = only_points
        self.pairs: set[tuple[str, str]] = set()
        self.reports: list[str] = []
        self.interrupted: str | None = None
        self.progress = _TerminalProgress(config)
        self._signals = contextlib.ExitStack()

    # --- what a test runs ------------------------------------------------------------------------

    @property
    def results_dir(self) -> Path:
        return self.session.results_dir

    def run(self, point: PhasePoint) -> PhaseRecord:
        """Run the point through the session; a point that cannot launch here (a trainer root
        not set, of a runbook selected by default: ``pytest_collection_finish``) skips with no
        record, one this machine cannot run skips with its SKIP record; one whose record cannot be
        stored (a full disk) fails with the store's message, no traceback."""
        try:
            record = self.session.run_point(point, self.progress)
        except NotLaunchable as exc:
            pytest.skip(f"{exc} (nothing run or stored)")
        except StoreError as exc:
            pytest.fail(f"nsa-validate: {exc}", pytrace=False)
        if record.status == Status.SKIP:
            pytest.skip(record.reason)
        return record

    # --- hooks -----------------------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any point runs, stop what an earlier harness process of the results directory left
        running when it died, saying so, as ``nsa-validate run`` does: on the controller, whose
        xdist workers (live harness processes, whose launches are left alone) run the points, and
        not for a run that only lists them."""
        if hasattr(self.config, "workerinput") or self.config.option.collectonly:
            return
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        self.session.stop_left_running(lambda text: terminal.write_line(f"nsa-validate: warning: {text}"))

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        """A run that selects only phase points (``selects_only_points``) collects the acceptance
        module and the folders on its way, nothing else."""
        if not self.only_points or collection_path == ACCEPTANCE_TESTS or collection_path in ACCEPTANCE_TESTS.parents:
            return None
        return True if collection_path.is_relative_to(REPO_ROOT) else None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "acceptance_point" in metafunc.fixturenames:
            points = self._points()
            metafunc.parametrize("acceptance_point", [
                pytest.param(p, id=p.test_id, marks=_marks(self.config, p.markers)) for p in points])
        if "acceptance_pair" in metafunc.fixturenames:
            pairs: dict[tuple[str, str], PhasePoint] = {}
            for p in self._points():
                pairs.setdefault((p.runbook.name, p.profile.name), p)
            params = []
            for (rb, prof), p in pairs.items():
                ms = [p.profile.marker] + (["gpu"] if p.profile.hardware.accelerator == "cuda" else [])
                params.append(pytest.param((rb, prof), id=f"{rb}/{prof}", marks=_marks(self.config, tuple(ms))))
            metafunc.parametrize("acceptance_pair", params)

    def _points(self) -> list[PhasePoint]:
        try:
            return self.session.points()
        except HarnessError as exc:
            raise pytest.UsageError(f"nsa-validate: {exc}") from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Report checks run after every phase point of the session."""
        last = [i for i in items if "acceptance_pair" in getattr(i, "fixturenames", ())]
        items[:] = [i for i in items if i not in last] + last

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not hasattr(self.config, "workerinput"):  # an xdist worker's selection: its controller checks it
            self._stop_unless_launchable(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._stop_unless_launchable(ids)

    def _stop_unless_launchable(self, nodeids: Iterable[str]) -> None:
        """The selected points (by test node id) of the runbooks given with --runbook that cannot
        start here (a trainer root not set, a module missing) stop the run before any point runs,
        as bad input (exit 4), as they stop the CLI's (exit 2). Those of runbooks selected by
        default (every runbook: a plain test run, `pytest -m cpu_profile`) skip when they come:
        this machine need not be set up for every runbook's trainer. Listing the points
        (--collect-only) runs none."""
        if not self.config.getoption("--runbook") or self.config.option.collectonly:
            return
        by_id = {p.test_id: p for p in self._points()}
        selected = [by_id[m.group(1)] for nodeid in nodeids
                    if (m := re.search(r"::test_phase\[(.*)\]$", nodeid)) and m.group(1) in by_id]
        try:
            self.session.check_launchable(selected)
        except NotLaunchable as exc:
            raise pytest.UsageError(f"nsa-validate: {exc}") from None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and "[" in report.nodeid and not report.skipped:
            name, param = report.nodeid.split("[", 1)
            parts = param.rstrip("]").split("/")
            if name.endswith("test_phase") and len(parts) == 4:
                self.pairs.add((parts[0], parts[1]))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return  # xdist workers store records; the controller renders
        _remove_if_empty(os.environ.get(_SESSION_DIR_ENV))  # no point ran: leave no empty directory behind
        if self.config.getoption("--no-acceptance-report") or self.config.option.collectonly:
            return  # listing the points runs none: no report, no verdict
        rendered, unrendered = [], 0
        self.reports += [f"note: {text}" for text in self.session.profile_notes]
        # and the pair of a point stopped as its record was stored: it has no test report, and it
        # had removed its pair's report
        pairs = self.pairs | self.session.withdrawn
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        pairs = self.session.reportable_after_stop(pairs) if interrupted else sorted(pairs)
        if pairs:  # a plot per phase takes seconds: as the CLI does, say it is under way
            after = " of the points stored before the interrupt" if interrupted else ""
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            terminal.write_line("")  # ends -q's line of progress ('[100%]'), which pytest ends only later
            terminal.write_line(f"nsa-validate: writing the report{after} ...")
        for pair in pairs:
            try:
                for out in self.session.render([pair], notes=lambda text: self.reports.append(f"note: {text}")):
                    self.reports.append(report_line(out, interrupted))
                    rendered.append(out)
                    if out.events is not None:
                        self.reports.append(f"TensorBoard events -> {out.events}")
            except HarnessError as exc:
                self.reports.append(f"report for {pair[0]}/{pair[1]} not rendered: {exc}")
                unrendered += 1
        if self.acceptance_run and exitstatus == pytest.ExitCode.OK:
            self._fail_unless_go(session, rendered, unrendered)

    def _fail_unless_go(self, session: pytest.Session, rendered: list, unrendered: int) -> None:
        """An acceptance run exits 1 unless every report it rendered is GO, as the CLI exits non-zero:
        pytest alone exits 0 where a point skipped (a GPU missing), was not measured or did not run
        here, and where a report is NO-GO from records this run did not write, so a CI job gated on
        `pytest -m <profile>` passed on an INCOMPLETE report, or with no point run at all."""
        if rendered and not unrendered and self.session.exit_status(rendered) == ExitStatus.GO:
            return
        if not rendered and not unrendered:
            why = "no phase point ran (each one was skipped or deselected): no report, no verdict"
        else:
            not_go = {str(r.verdict) for r in rendered if self.session.exit_status([r]) != ExitStatus.GO}
            why = "the report is " + ", ".join(sorted(not_go) + (["not rendered"] if unrendered else []))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.reports.append(f"exit status 1: this acceptance run is not GO: {why}")

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        if isinstance(excinfo.value, pytest.Session.Interrupted):
            # pytest's own stop, a KeyboardInterrupt to its hooks: errors during collection (before
            # any point ran) or a stop between two tests; no signal came and no point was cut short
            self.interrupted = f"nsa-validate: pytest stopped the run ({excinfo.value}); no point was cut short"
            return
        # pytest's own banner says only 'KeyboardInterrupt' (or 'Stopped: SIGTERM')
        signum = getattr(excinfo.value, "signum", signal.SIGINT)
        self.session.note_stop(signum)  # before pytest_sessionfinish renders the reports
        self.interrupted = self.session.interrupted_note(signum)

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        for line in self.reports:
            terminalreporter.write_line(f"nsa-validate report: {line}")
        if self.interrupted:
            terminalreporter.write_line(self.interrupted)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._signals.close()


def _acceptance_run(config: pytest.Config, acceptance_markers: set[str]) -> bool:
    return is_acceptance_run(config.getoption("-m") or "", config.getoption("--runbook"),
                             config.getoption("--profile"), acceptance_markers)


def _options(config: pytest.Config, acceptance_run: bool) -> SessionOptions:
    for opt in _PATH_OPTIONS:  # an unset shell variable: '' would be the working directory, or ignored
        value = config.getoption(opt)
        if value == "" or (isinstance(value, list) and "" in value):
            raise pytest.UsageError(f"{opt}: an empty path (an unset shell variable?)")
    runbooks = tuple(config.getoption("--runbook") or available())
    base = config.getoption("--baseline")
    events = config.getoption("--tensorboard")
    return SessionOptions(
        results_dir=results_dir_for(config.getoption("--results-dir"), acceptance_run,
                                    Path(os.environ.get(_SESSION_DIR_ENV) or tempfile.mkdtemp(prefix="nsa-validate-tests-"))),
        runbooks=runbooks, profiles=tuple(config.getoption("--profile") or ()),
        mismatch=config.getoption("--hardware-mismatch"), baseline=Path(base).expanduser().resolve() if base else None,
        tensorboard=Path(events).expanduser().resolve() if events else None,
        known_markers=frozenset(_ini_markers(config)))


def _acceptance_markers(config: pytest.Config, runbooks: tuple[str, ...]) -> set[str]:
    """The profile markers and phase names of the selected runbooks (an acceptance run names one
    of them in -m); a runbook that does not load names none here: the session reports it."""
    out: set[str] = set()
    for name in runbooks:
        try:
            rb = load_runbook(name)
        except HarnessError:
            continue
        out |= {ph.name for ph in rb.phases}
        for prof in rb.profiles:
            with contextlib.suppress(HarnessError):
                out.add(load_profile(prof).marker)
    for prof in config.getoption("--profile") or ():
        with contextlib.suppress(HarnessError):
            out.add(load_profile(prof).marker)
    return out


def _register_markers(config: pytest.Config, runbooks: tuple[str, ...]) -> None:
    """Every selected runbook's phase names and the markers of its profiles and of the profiles
    given with --profile become markers: --strict-markers refuses a mark it does not know, so
    `pytest -m single --runbook my.yaml --profile mine.yaml` would fail at collection otherwise."""
    known = _ini_markers(config)

    def add(marker: str, what: str) -> None:
        if marker not in known:
            config.addinivalue_line("markers", f"{marker}: {what}")
            known.add(marker)

    for name in runbooks:
        try:
            rb = load_runbook(name, known_markers=known)
        except HarnessError:
            continue  # reported as a usage error when the points are loaded
        for ph in rb.phases:
            add(ph.name, f"runbook phase of {rb.name}")
    for prof in config.getoption("--profile") or ():
        with contextlib.suppress(HarnessError):  # a bad profile is reported when the points are loaded
            loaded = load_profile(prof)
            add(loaded.marker, f"hardware profile {loaded.name}")


def _runbook_given_as_marker(config: pytest.Config) -> str | None:
    """The runbook a ``-m`` expression names where a marker belongs (``pytest -m cpu_smoke``):
    pytest would only say the marker is unknown."""
    words = set(re.findall(r"[A-Za-z_]\w*", config.option.markexpr or "")) - {"and", "or", "not"}
    return next((w for w in sorted(words - _ini_markers(config)) if w in available()), None)


def _remove_if_empty(directory: str | None) -> None:
    """Remove the session's results directory where nothing was stored in it."""
    if directory and Path(directory).is_dir() and not any(Path(directory).iterdir()):
        os.rmdir(directory)


@pytest.fixture(scope="session")
def harness(request: pytest.FixtureRequest) -> AcceptancePlugin:
    return request.config.pluginmanager.get_plugin(_PLUGIN)


def pytest_configure(config: pytest.Config) -> None:
    ours = config.rootpath == REPO_ROOT
    if not ours and not config.getoption("--runbook"):
        return  # another project's session in this environment: the plugin stays out of its way
    runbooks = tuple(config.getoption("--runbook") or available())
    _register_markers(config, runbooks)
    named = _runbook_given_as_marker(config) if ours else None
    if named is not None:
        raise pytest.UsageError(f"-m {named}: {named} is a runbook, not a marker; run it with --runbook "
                                f"{named} (markers select phases, e.g. -m long_run, and profiles, e.g. "
                                "-m cpu_profile; `nsa-validate phases --runbook NAME` lists them)")
    # a controller (or lone) session of this repository's tests gets a results directory of its
    # own, whatever it inherited; its xdist workers inherit it
    made = None
    if not hasattr(config, "workerinput"):
        made = os.environ[_SESSION_DIR_ENV] = tempfile.mkdtemp(prefix="nsa-validate-tests-")
    try:
        markers = _acceptance_markers(config, runbooks)
        acceptance_run = _acceptance_run(config, markers)
        session = AcceptanceSession(_options(config, acceptance_run))
        try:  # a bad runbook, profile, golden file, store or baseline stops the run before collection
            session.points()
            session.check_ready()
        except HarnessError as exc:
            raise pytest.UsageError(f"nsa-validate: {exc}") from None
    except BaseException:
        _remove_if_empty(made)  # a run refused before it began leaves nothing behind
        raise
    only_points = ours and selects_only_points(config.option.markexpr or "", markers, _ini_markers(config) - markers)
    plugin = AcceptancePlugin(config, session, acceptance_run, only_points)
    # SIGTERM (a scheduler's cancel, `timeout`, `kill`) and SIGHUP (a closed terminal) stop the
    # run as Ctrl-C does, where nobody handles them yet; pytest keeps its own SIGINT handling
    plugin._signals.enter_context(AcceptanceSession.stop_signals(session.abort, (signal.SIGTERM, signal.SIGHUP),
                                                                 only_default=True))
    config.pluginmanager.register(plugin, _PLUGIN)


def session_findings(config: pytest.Config, pair: tuple[str, str]) -> tuple[list[str], int]:
    """Critical findings across the points of ``pair`` run in this process, and how many ran."""
    plugin = config.pluginmanager.get_plugin(_PLUGIN)
    found, n = plugin.session.cross_point_findings(pair)
    return [f.title for f in found], n
