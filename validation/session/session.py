"""The acceptance session: the one object that both front doors drive.

``nsa-validate run`` and ``pytest -m <profile or phase>`` do the same work through it: select the
points of the runbooks and profiles asked for, check the store, the golden files and the baseline
before anything runs, run each point (launch, read, judge, store; session/point.py), stop on a
signal with the running trainers killed, render the reports and say the exit status. The doors
only turn their options into ``SessionOptions`` and show progress their own way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from validation import PROFILE_DIR, checkout_problem
from validation.errors import CorruptStore, HarnessError, RunbookError
from validation.judge.findings import CROSS_POINT, Finding, Severity, find, of_point, planned_longest
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord, Status
from validation.launch import orphans
from validation.launch.process import aborted_by
from validation.machine import Machine, detect
from validation.report import tensorboard
from validation.report.build import Interruption, Rendered, Verdict, render, withdraw_all
from validation.runbook.hardware import mismatches
from validation.runbook.load import available, load_profile, load_runbook, runbook_profile
from validation.runbook.plan import PhasePoint, batches, expand
from validation.runbook.types import Profile, Runbook
from validation.session.point import StoppedWhileStoring, cannot_launch, run_point, why_skip
from validation.store import baseline as baseline_store
from validation.store import goldens
from validation.store.results import STORE_NAME, ResultStore

MISMATCH_POLICIES = ("run", "skip")


class ExitStatus(enum.IntEnum):
    """What ``run`` and ``report`` exit with; a stop signal exits 128 + its number."""

    GO = 0
    NO_GO = 1
    USAGE = 2
    """A bad runbook, profile, option or results directory: nothing was judged."""
    INCOMPLETE = 3


EXIT_OF = {Verdict.GO: ExitStatus.GO, Verdict.NO_GO: ExitStatus.NO_GO, Verdict.INCOMPLETE: ExitStatus.INCOMPLETE}
#: signals that stop a session as Ctrl-C does; at their default they killed the harness at once
#: and orphaned the trainers running in sessions of their own
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopFlag:
    """A session's stop: set by the first stop signal, whose number it keeps (``signum``), so that
    whatever surfaces the stop (the handler's ``Stopped``, or a plain KeyboardInterrupt of a point
    that saw the flag) exits with that signal's status. Set from signal handlers, so it takes no
    lock: a threading.Event's set() holds one, and a second signal at once, handled inside the
    first's set(), waited for it forever."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._stopped = False
        self.settled = False
        """Whether the stop is over (its door is saying how it ended): a later signal then changes
        nothing."""

    def stop(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        self._stopped = True

    def set(self) -> None:
        """Stopped with no signal of its own to name (pytest's SIGINT handling keeps Ctrl-C's)."""
        self._stopped = True

    def is_set(self) -> bool:
        return self._stopped


class Stopped(KeyboardInterrupt):
    """A stop signal, raised in the main thread as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ReportInterrupted(KeyboardInterrupt):
    """A stop signal that came once every selected point had run and was stored, while the report
    was written: nothing was interrupted but the report."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def report_interrupted_note(signum: int) -> str:
    """What a session stopped while its report was written did, as the CLI says it."""
    return (f"nsa-validate: interrupted ({signal.Signals(signum).name}) while the report was written: every point "
            "ran and was stored; `nsa-validate report` writes its report")


def interrupted_note(signum: int, recorded: Sequence[str] = ()) -> str:
    """What a session stopped by a signal did, as both doors say it. ``recorded``: the points whose
    new record was stored as the signal came (``StoppedWhileStoring``)."""
    head = f"nsa-validate: interrupted ({signal.Signals(signum).name}): running trainers killed"
    if recorded:
        return (f"{head}; the signal came as the record of {', '.join(recorded)} was stored: "
                f"{'that point is' if len(recorded) == 1 else 'those points are'} recorded (the new run kept, "
                "the earlier run directory removed)")
    return f"{head}; the interrupted point was not recorded (an earlier record of it, if any, is kept with its artifacts)"


def report_line(out: Rendered, interrupted: bool) -> str:
    """A rendered report as both doors name it: 'GO -> path'. After a stop signal without its
    status: the report holds the points stored before the interrupt, and a GO or NO-GO printed
    at the end of a run reads as that run's verdict."""
    if interrupted:
        return f"report of the points stored before the interrupt (no verdict of this run) -> {out.path}"
    return f"{out.verdict} -> {out.path}"


class NotLaunchable(HarnessError):
    """A selected point cannot start on this machine (a trainer root not set, a module missing):
    nothing is run or stored for it."""


@dataclass(frozen=True)
class SessionOptions:
    results_dir: Path
    runbooks: tuple[str, ...] = ()
    """Names under runbooks/ or YAML paths; () is every runbook (see ``default_runbooks``)."""
    profiles: tuple[str, ...] = ()
    """() is each runbook's first profile (``first_profile_only``) or all of its profiles."""
    phases: tuple[str, ...] = ()
    """() is every phase."""
    first_profile_only: bool = False
    mismatch: str = "run"
    """What to do when the GPUs differ from the profile's: 'run' (and report) or 'skip'."""
    baseline: Path | None = None
    jobs: int | None = None
    """Untimed single-process points run at once (default: the runbook's max_parallel)."""
    plots: bool = True
    tensorboard: Path | None = None
    """Also write the points' per-step metrics as TensorBoard event files under this directory."""
    known_markers: frozenset[str] = frozenset()
    """Markers pytest knows (a phase may name only these and its runbook's own phases)."""


Progress = Callable[[str, str], None]
"""progress(test_id, line): a running point's latest line (step N/total, tokens/s, ETA)."""


@dataclass
class Outcome:
    """What a point's run gave: its record, and the line a door shows for it."""

    point: PhasePoint
    record: PhaseRecord

    def line(self) -> str:
        """The point's status and why; of one that passed its gates, the critical findings that
        make the report NO-GO all the same (the pytest door fails its test for them)."""
        r = self.record
        critical = of_point(r) if r.status in (Status.PASS, Status.UNMEASURED) else []
        but = "; but critical: " + "; ".join(f.title for f in critical) if critical else ""
        return f"{self.point.test_id}: {r.status} ({r.wall_s:.1f}s) {verdict_line(r)}{but}"


@dataclass
class AcceptanceSession:
    options: SessionOptions
    abort: StopFlag = field(default_factory=StopFlag)
    """Set by a stop signal (``stop_signals``): the points running in any thread kill their trainers'
    trees, and no new one starts (each point runs under ``aborted_by`` it, launch/process.py)."""
    ran: dict[str, PhaseRecord] = field(default_factory=dict)
    """Records of the points run in this process, by test id (cross-point findings read them)."""
    withdrawn: set[tuple[str, str]] = field(default_factory=set)
    """The (runbook, profile) pairs whose report a point stopped while it stored its record had
    removed (it names the runs the new record replaces): their reports are to be written again."""
    recorded_at_stop: list[str] = field(default_factory=list)
    """Test ids of the points whose new record was stored as a stop signal came."""
    cut_short: list[str] = field(default_factory=list)
    """Test ids of the points a stop signal stopped before their new record was stored."""
    stopped_by: int | None = None
    """The stop signal that ended the run (``note_stop``): the reports rendered after it say so."""
    profile_notes: list[str] = field(default_factory=list)
    """What the session says of a pair judged by a profile file the command line did not give."""
    _points: list[PhasePoint] | None = None
    _machine: Machine | None = None

    # --- selection and checks before anything runs ----------------------------------------------

    @property
    def results_dir(self) -> Path:
        return self.options.results_dir

    @property
    def machine(self) -> Machine:
        if self._machine is None:
            self._machine = detect()
        return self._machine

    def points(self) -> list[PhasePoint]:
        """Every (runbook, profile, phase, sweep point) selected, loaded and checked once: an
        unknown profile or phase, a gate naming a threshold its profile lacks and an unreadable
        golden file are errors here, before any point runs."""
        if self._points is None:
            problem = checkout_problem()
            if problem:
                raise HarnessError(problem)
            self._points = []
            for rb, prof in self.pairs():
                goldens.check_readable(rb.path, rb.name, prof.name)
                expand(rb, prof)  # every phase's gates are checked, not only the ones selected
                self._points += expand(rb, prof, list(dict.fromkeys(self.options.phases)) or None)
        return self._points

    def pairs(self) -> list[tuple[Runbook, Profile]]:
        """The (runbook, profile) pairs selected, in the order given."""
        names = self.options.runbooks or tuple(available())
        # a profile given on the command line is used as given: a YAML path of a profile that shares
        # its name with one under runbooks/profiles/ holds the user's thresholds, not the project's
        given = {w: load_profile(w) for w in self.options.profiles}
        by_name = {prof.name: prof for prof in given.values()}
        if len(by_name) < len({prof.path.resolve() for prof in given.values()}):
            raise HarnessError(f"--profile {', '.join(given)}: two files of one profile name; a point's profile "
                               "must be one file")
        out: list[tuple[Runbook, Profile]] = []
        for name in names:
            try:
                rb = load_runbook(name, known_markers=set(self.options.known_markers) or None)
            except RunbookError as exc:
                raise RunbookError(f"{exc}{self._stored_runbook(name)}") from None
            profiles = [p for p in rb.profiles if not given or p in by_name]
            if self.options.first_profile_only and not given:
                profiles = profiles[:1]
            out += [(rb, by_name[p] if p in by_name else self._stored_profile(rb, p)) for p in profiles]
        used = {prof.name for _, prof in out}
        unused = [w for w, prof in given.items() if prof.name not in used]
        if unused:
            listed = ', '.join(sorted({p for n in names for p in load_runbook(n).profiles}))
            # a file is listed by the name: in it, which a copy of a shipped profile keeps or renames
            files = [w for w in unused if Path(w).suffix in (".yaml", ".yml")]
            named = "; ".join(f"{w} is profile {given[w].name!r} (its name: key)" for w in files)
            raise HarnessError(
                f"--profile {', '.join(unused)}: no selected runbook uses it (runbooks: {', '.join(names)}; their "
                f"profiles: {listed})" + (
                    f". {named}, and a runbook runs only the profiles its profiles: lists, by name, whatever file "
                    f"they come from: keep a listed name ({listed}) in the file, or add "
                    f"{', '.join(sorted({given[w].name for w in files}))} to the runbook's profiles:" if files else ""))
        return out

    def _stored_runbook(self, name: str) -> str:
        """Where a runbook's name that is none under runbooks/ ran from, by the results dir's
        records of it ('; its stored points ran from /x/mine.yaml: give --runbook /x/mine.yaml'),
        or nothing."""
        if Path(name).suffix in (".yaml", ".yml"):
            return ""
        try:
            paths = {r.runbook_arg for r in ResultStore(self.results_dir).records(name)
                     if Path(r.runbook_arg).suffix in (".yaml", ".yml")}
        except (CorruptStore, OSError):
            return ""
        if not paths:
            return ""
        (one,) = paths if len(paths) == 1 else (None,)
        return (f"; the stored points of runbook {name!r} in {self.results_dir} ran from "
                + (f"{one}: give --runbook {one}" if one else f"{', '.join(sorted(paths))}: give --runbook one of them"))

    def _stored_profile(self, rb: Runbook, name: str) -> Profile:
        """The profile a pair runs by without --profile: the file its latest stored record ran with
        where that was a profile file of this name (`--profile PATH`), so that a re-run of one
        phase is judged with the stored ones by the thresholds they ran under; else the runbook's
        built-in profile. A store that cannot be read is left to check_ready."""
        try:
            latest = max(ResultStore(self.results_dir).records(rb.name, name), key=lambda r: r.started, default=None)
        except (CorruptStore, OSError):
            latest = None
        # a record names a built-in profile by its bare name (Profile.cli_name) and a file by its path;
        # the file is looked for first, as a runbook may list a profile that exists only as a file
        if latest is None or not latest.profile_arg or latest.profile_arg == name:
            return runbook_profile(rb, name)
        built_in = name in available(PROFILE_DIR)
        try:
            prof = load_profile(latest.profile_arg)
        except HarnessError as exc:
            raise HarnessError(f"{rb.name}/{name}: the stored points in {self.results_dir} ran with the profile file "
                               f"{latest.profile_arg}, which cannot be loaded now ({exc}); give --profile: that file "
                               "again" + (f", or {name} for the built-in profile" if built_in else
                                          f" or another file of profile {name}")) from None
        self._judged_by(rb.name, name, prof)
        return prof

    def _judged_by(self, rb_name: str, name: str, prof: Profile) -> None:
        """Note, once in ``profile_notes``, that the pair of profile ``name`` is judged by ``prof``,
        a profile file the command line did not give (the one its stored points ran with)."""
        note = (f"{rb_name}/{name} is judged by {prof.cli_name}, the profile file its stored points ran with"
                + (f" (--profile {name}: by the built-in profile)" if name in available(PROFILE_DIR) else ""))
        if note not in self.profile_notes:
            self.profile_notes.append(note)

    def check_ready(self, pairs: list[tuple[str, str]] | None = None) -> None:
        """The store readable (a corrupt results.json stops the session before anything runs) and
        the baseline, when given, another store that holds at least one of ``pairs`` (default: the
        selected ones); a comparison that could compare nothing is an error before anything runs.
        A store whose file is corrupt takes its reports with it (``_withdrawn``)."""
        try:
            ResultStore(self.results_dir).check()
        except CorruptStore as exc:
            raise CorruptStore(_withdrawn(self.results_dir, str(exc))) from None
        if self.options.tensorboard is not None:
            if why := tensorboard.missing():
                raise HarnessError(why)
            if why := tensorboard.unwritable(self.options.tensorboard):
                raise HarnessError(f"--tensorboard {self.options.tensorboard}: {why}")
        base = self.options.baseline
        if base is None:
            return
        if not ResultStore(base).exists():
            raise HarnessError(f"--baseline {base}: no result store there (results.json not found)")
        if base.resolve() == self.results_dir.resolve():
            raise HarnessError(f"--baseline {base} is the results directory itself; give the results directory "
                               "of another run")
        held = ResultStore(base).pairs()
        pairs = pairs if pairs is not None else [(rb.name, prof.name) for rb, prof in self.pairs()]
        if pairs and not set(pairs) & set(held):
            raise HarnessError(f"--baseline {base}: no records of " + ", ".join(
                f"runbook {r}, profile {p}" for r, p in pairs) + f" (it holds: "
                f"{', '.join(f'{r}/{p}' for r, p in held) or 'no records at all'})")

    def mismatch_notes(self) -> list[str]:
        """What the run says before its points: the profile files taken from the store, and where
        this machine differs from a profile's hardware."""
        differ = dict.fromkeys(d for p in self.points() for d in mismatches(p.profile, self.machine))
        return self.profile_notes + list(differ)

    def check_launchable(self, points: list[PhasePoint]) -> None:
        """NotLaunchable, naming each point among ``points`` that cannot start here and why, unless
        every one can: a door checks the points it will run before the first one starts."""
        blocked = {p.test_id: why for p in points if (why := cannot_launch(p))}
        if blocked:
            raise NotLaunchable("cannot launch here, nothing was run: " + "; ".join(
                f"{tid}: {why}" for tid, why in blocked.items()))

    # --- running ---------------------------------------------------------------------------------

    def run_point(self, point: PhasePoint, progress: Progress | None = None) -> PhaseRecord:
        """Run one point (or record why this machine skips it) and store its record. A point
        that cannot launch is NotLaunchable, before its store or run directory is touched."""
        why = cannot_launch(point)
        if why:
            raise NotLaunchable(f"{point.test_id}: {why}")
        try:
            with aborted_by(self.abort), orphans.owned_by(self.results_dir, point.test_id):
                record = run_point(point, self.results_dir, self.machine,
                                   why_skip(point, self.machine, self.options.mismatch),
                                   None if progress is None else (lambda line: progress(point.test_id, line)))
        except StoppedWhileStoring as stop:
            self.withdrawn.add((point.runbook.name, point.profile.name))
            if stop.record is not None:
                self.ran[point.test_id] = stop.record
                self.recorded_at_stop.append(point.test_id)
            else:
                self.cut_short.append(point.test_id)
            raise
        except KeyboardInterrupt:
            self.cut_short.append(point.test_id)
            raise
        except Exception:  # a stop inside C code can surface as another error (cli.main says which)
            if self.stopping():
                self.cut_short.append(point.test_id)
            raise
        self.ran[point.test_id] = record
        return record

    def stop_left_running(self, say: Callable[[str], None]) -> None:
        """Stop the processes an earlier harness process of this results directory left running
        when it died (validation/launch/orphans.py), saying which before, and any that outlived
        the kill after: they would run beside this run's points, holding their GPUs and cores,
        and nothing will ever record them."""
        for launch in orphans.left_running(self.results_dir):
            say(f"an earlier run of {self.results_dir} left processes running: {launch.describe()}; stopping them")
            left = orphans.stop(launch)
            if left:
                say(f"could not stop pid(s) {', '.join(map(str, left))} of point {launch.owner.point}: "
                    f"they run beside this run (kill -9 {' '.join(map(str, left))})")

    def note_stop(self, signum: int) -> None:
        """A stop signal ended the run: the reports rendered from here on say so, and which of
        their points it cut short."""
        self.stopped_by = signum

    def interrupted_note(self, signum: int) -> str:
        """What this session did by the time a stop signal came, as both doors say it."""
        return interrupted_note(signum, self.recorded_at_stop)

    def run(self, progress: Progress | None = None,
            started: Callable[[int, int, PhasePoint], None] | None = None,
            finished: Callable[[int, int, Outcome], None] | None = None) -> list[Outcome]:
        """Every selected point in runbook order, untimed single-process points up to ``jobs`` at
        once (validation/runbook/plan.batches: timed points always run alone). Every point that
        cannot launch is an error before the first one runs."""
        points = self.points()
        self.check_ready()
        self.check_launchable(points)
        jobs = self.options.jobs or min((p.runbook.max_parallel for p in points), default=1)
        order = {p.test_id: i + 1 for i, p in enumerate(points)}
        outcomes: list[Outcome] = []
        for batch in batches(points, jobs):
            for p in batch:
                if started:
                    started(order[p.test_id], len(points), p)
            for outcome in self._run_batch(batch, progress):
                outcomes.append(outcome)
                if finished:
                    finished(order[outcome.point.test_id], len(points), outcome)
        return outcomes

    def _run_batch(self, batch: list[PhasePoint], progress: Progress | None) -> Iterator[Outcome]:
        if len(batch) == 1:
            yield Outcome(batch[0], self.run_point(batch[0], progress))
            return
        from concurrent.futures import ThreadPoolExecutor, as_completed

        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            futures = {pool.submit(self.run_point, p, progress): p for p in batch}
            for fut in as_completed(futures):
                yield Outcome(futures[fut], fut.result())

    # --- judging across points and rendering -----------------------------------------------------

    def cross_point_findings(self, pair: tuple[str, str]) -> tuple[list[Finding], int]:
        """Critical findings that only show across the points of ``pair`` run in this process (a
        cliff along a sweep; a regression against the baseline), and how many points ran."""
        records = [r for r in self.ran.values() if (r.key.runbook, r.key.profile) == pair and r.status != Status.SKIP]
        extra: list[Finding] = []
        base = self.options.baseline
        profile = next((p.profile for p in self.points() if (p.runbook.name, p.profile.name) == pair), None)
        if base is not None and records and profile is not None:
            stored = baseline_store.load(base, self.results_dir, *pair)
            extra = baseline_store.compare(records, stored, base,
                                           profile.thresholds.get(baseline_store.REGRESSION_KEY)).findings()
        longest = planned_longest((p.phase.name, p.params) for p in self.points()
                                  if (p.runbook.name, p.profile.name) == pair)
        cross = [f for f in find(records, thresholds=profile.thresholds if profile else None, longest=longest)
                 if f.severity == Severity.CRITICAL and f.kind in CROSS_POINT]
        return cross + [f for f in extra if f.severity == Severity.CRITICAL], len(records)

    def render(self, pairs: list[tuple[str, str]] | None = None, notes: Callable[[str], None] | None = None
               ) -> list[Rendered]:
        """The report of each pair (default: the pairs selected), against the runbook and profile
        it ran from; a baseline that lacks a pair gives that report no comparison, and says so.
        With the tensorboard option each pair's train points are exported there as well."""
        selected = {(rb.name, prof.name): (rb, prof) for rb, prof in self.pairs()} if self.options.runbooks else {}
        # --profile without --runbook still judges by the file given (its name selects the pairs)
        given = {prof.name: prof for prof in map(load_profile, self.options.profiles)}
        store = ResultStore(self.results_dir)
        wanted = pairs if pairs is not None else list(selected)
        in_baseline = set(ResultStore(self.options.baseline).pairs()) if self.options.baseline else set()
        out = []
        for rb_name, prof_name in wanted:
            rb, _ = selected.get((rb_name, prof_name), (None, None))
            # without --profile the records' own profile judges them: the store keys a pair by the
            # profile's name, and a profile file of that name (`--profile PATH` at the run) may hold
            # other thresholds than the runbook's built-in profile
            prof = given.get(prof_name)
            if rb is None or prof is None:
                ran_rb, ran_prof = _ran_from(store, rb_name, prof_name, notes, runbook=rb is None)
                if prof is None and ran_prof is not None and ran_prof.cli_name != prof_name:
                    self._judged_by(rb_name, prof_name, ran_prof)  # `report` says it as `run` does
                rb, prof = rb or ran_rb, prof or ran_prof
            base = self.options.baseline
            # a pair the baseline lacks renders without a comparison (check_ready made sure it
            # holds some of the pairs)
            if base is not None and (rb_name, prof_name) not in in_baseline:
                if notes:
                    notes(f"--baseline {base} holds no records of {rb_name}/{prof_name}; its report has no comparison")
                base = None
            cut = None if self.stopped_by is None else Interruption(
                signal.Signals(self.stopped_by).name,
                tuple(t for t in self.cut_short if t.startswith(f"{rb_name}/{prof_name}/")))
            rendered = render(self.results_dir, rb_name, prof_name, runbook=rb, profile=prof,
                              plots=self.options.plots, baseline=base, interrupted=cut)
            if self.options.tensorboard is not None:
                runs = tensorboard.export(self.results_dir, store.records(rb_name, prof_name), self.options.tensorboard,
                                          prof.hardware.peak_flops if prof else None)
                rendered = dataclasses.replace(rendered, events=self.options.tensorboard if runs else None)
            out.append(rendered)
        return out

    def reportable_after_stop(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of ``pairs``, sorted, those the store holds records of: after a stop signal only those get
        a report, through either door. A report of a pair with nothing stored would be of no record
        and no verdict, and ``report`` refuses such a store and withdraws its reports; so a stopped
        run that stored nothing writes none, and ``report`` afterwards has none to remove."""
        held = set(ResultStore(self.results_dir).pairs())
        return sorted(pair for pair in set(pairs) if pair in held)

    def report_pairs(self) -> list[tuple[str, str]]:
        """The pairs ``report`` renders from the store: the selected ones, or every stored pair (of
        the profiles asked for), checked as ``check_ready`` checks a run's. No records at all (no
        results.json, or one that holds none) is a usage error, as a missing directory is, and
        takes the directory's reports with it (``_withdrawn``)."""
        self.check_ready(pairs=[])  # the store and the baseline option themselves first
        pairs = self._stored_pairs()
        self.check_ready(pairs)
        return pairs

    def _stored_pairs(self) -> list[tuple[str, str]]:
        store = ResultStore(self.results_dir)
        if not self.results_dir.is_dir():
            raise HarnessError(f"results directory {self.results_dir} "
                               f"{'is not a directory' if self.results_dir.exists() else 'does not exist'} "
                               "(give the --results-dir a run wrote into)")
        held = store.pairs()
        if not held:
            why = f"{store.path} holds no records" if store.path.exists() else f"no {STORE_NAME} in {self.results_dir}"
            raise HarnessError(_withdrawn(self.results_dir, f"no results in {self.results_dir} ({why}; give the "
                                                            "--results-dir a run wrote into)"))
        holds = ", ".join(f"{r}/{p}" for r, p in held)
        if self.options.runbooks:
            selected = [(rb.name, prof.name) for rb, prof in self.pairs()]
            chosen = [pair for pair in selected if pair in held]
            if not chosen:
                raise HarnessError(f"no records of {', '.join(f'{r}/{p}' for r, p in selected)} in {store.path} "
                                   f"(it holds: {holds})")
            return chosen
        if self.options.profiles:
            names = {load_profile(p).name for p in self.options.profiles}
            chosen = [(r, p) for r, p in held if p in names]
            if not chosen:
                raise HarnessError(f"no records of profile {', '.join(sorted(names))} in {store.path} (it holds: {holds})")
            return chosen
        return held

    @staticmethod
    def exit_status(rendered: list[Rendered]) -> ExitStatus:
        """NO-GO if any report is, else INCOMPLETE if any is, else GO."""
        codes = [EXIT_OF[r.verdict] for r in rendered]
        if ExitStatus.NO_GO in codes:
            return ExitStatus.NO_GO
        return ExitStatus.INCOMPLETE if ExitStatus.INCOMPLETE in codes else ExitStatus.GO

    # --- stopping ---------------------------------------------------------------------------------

    def stopping(self) -> bool:
        """Whether a stop signal has arrived (an error raised after it is still the user's stop)."""
        return self.abort.is_set()

    def stop_signal(self, exc: BaseException | None = None) -> int:
        """The signal that stopped the session: the first that came, else the one ``exc`` (a
        KeyboardInterrupt) carries, else SIGINT (Ctrl-C's, as pytest and Python raise it)."""
        return self.abort.signum or getattr(exc, "signum", None) or signal.SIGINT

    @staticmethod
    @contextlib.contextmanager
    def stop_signals(abort: StopFlag, signals: tuple[int, ...] = STOP_SIGNALS,
                     only_default: bool = False, ignore_after_stop: bool = False) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP stop the session whose flag is ``abort`` as Ctrl-C does: the
        flag is set, so the running trainers' trees are killed (worker threads watch it), and
        ``Stopped`` is raised in the main thread. A signal the process inherited ignored stays
        ignored, through either door, as Python leaves an ignored SIGINT: `nohup` ignores SIGHUP, and
        a non-interactive shell starts a job with `&` ignoring SIGINT (SIGTERM still stops it). With
        ``only_default``, only signals nobody handles yet (pytest keeps its own SIGINT handling).
        Restored on the way out. A door enters it before it builds its session, and gives the
        session the same flag. The first signal is the stop's (the flag keeps it): a later one (a
        second Ctrl-C, or SIGINT after SIGHUP) still interrupts what the stop is doing, as that first
        signal. With ``ignore_after_stop`` (a process about to exit with the first signal's status),
        a stopped session leaves its signals ignored rather than restored: a later one would end the
        process as its own. The signals are blocked while the handlers change hands, so one that
        comes then is handled by what follows (or dropped, ignored), not by a handler half put back."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        saved = {}
        for sig in signals:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or (only_default and current is not signal.SIG_DFL):
                continue
            saved[sig] = signal.signal(sig, functools.partial(_on_stop_signal, abort))
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, saved)
            try:
                ignore = ignore_after_stop and abort.is_set()
                for sig, handler in saved.items():
                    signal.signal(sig, signal.SIG_IGN if ignore else handler)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, saved)


def _withdrawn(results_dir: Path, why: str) -> str:
    """``why`` the store backs no report (it is corrupt, gone or empty), every report of
    ``results_dir`` removed and named: a previous GO left in place reads as current to a reader
    or CI."""
    gone = withdraw_all(results_dir)
    return why + (f". Removed the report(s) rendered from it, which it no longer backs: {', '.join(map(str, gone))}"
                  if gone else "")


def _on_stop_signal(abort: StopFlag, signum, frame) -> None:
    if abort.settled:
        return
    abort.stop(signum)  # worker threads running trainers kill their process trees
    if _drops_exceptions(frame):
        threading.Timer(REDELIVER_S, _redeliver, (signum,)).start()
        return
    raise Stopped(abort.signum)


#: seconds after which a stop signal that landed where its exception would be dropped is sent again
REDELIVER_S = 0.05


def _drops_exceptions(frame) -> bool:
    """Whether the main thread is in code whose exceptions Python prints and drops ('Exception
    ignored in ...'): the weakref callback of an import's module lock, a finalizer, or code they
    called. A stop raised there is lost, its traceback printed."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib") or code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """The stop signal again, to the main thread, while the session's handler still takes it."""
    handler = signal.getsignal(signum)
    if isinstance(handler, functools.partial) and handler.func is _on_stop_signal:
        signal.pthread_kill(threading.main_thread().ident, signum)


def _ran_from(store: ResultStore, rb_name: str, prof_name: str, notes: Callable[[str], None] | None,
              runbook: bool = True) -> tuple[Runbook | None, Profile | None]:
    """The runbook (unless not ``runbook``) and profile the pair's latest record ran from (a path
    for a runbook or profile file given at the run); None for one that cannot be loaded any more:
    the report renders what is stored."""
    latest = max(store.records(rb_name, prof_name), key=lambda r: r.started, default=None)
    rb_arg = (latest.runbook_arg if latest else "") or rb_name
    prof_arg = (latest.profile_arg if latest else "") or prof_name
    out: list = []
    for load, arg in ((load_runbook, rb_arg if runbook else None), (load_profile, prof_arg)):
        if arg is None:
            out.append(None)
            continue
        try:
            out.append(load(arg))
        except HarnessError as exc:  # the report says which could not be loaded, and is never GO
            if notes:
                notes(f"{exc}; rendering stored records only")
            out.append(None)
    return out[0], out[1]
