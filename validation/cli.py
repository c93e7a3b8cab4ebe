"""``nsa-validate`` (also ``python -m validation``): run runbook phases, render reports, list phases.

    nsa-validate run                      # the CPU smoke runbook, cpu profile, into ./results
    nsa-validate run --runbook nsa_ddp_a100 --profile a100 --phase bucket_sweep
    nsa-validate report [--runbook R --profile P] [--results-dir DIR] [--baseline DIR]
    nsa-validate phases [--runbook R] [--profile P]
    nsa-validate bless --runbook R --profile P [--phase X] [--point PHASE/POINT] [--results-dir DIR]
    nsa-validate check-artifacts DIR [--adapter seed]

Exit statuses: ``EXIT_STATUSES`` below, also shown by ``nsa-validate --help``.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from validation import DEFAULT_RESULTS_DIR, DEFAULT_RUNBOOK, checkout_problem
from validation.contract import check_command as check_artifacts
from validation.contract.adapters import ADAPTERS
from validation.errors import HarnessError
from validation.judge.metrics import costs as metric_costs
from validation.launch import process as runner
from validation.machine import detect
from validation.report import build as report
from validation.runbook.hardware import mismatches
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import batches, expand
from validation.session.run import MISMATCH_POLICIES, run_point
from validation.store import bless, goldens
from validation.store.results import ResultStore

EXIT = {report.Verdict.GO: 0, report.Verdict.NO_GO: 1, report.Verdict.INCOMPLETE: 3}
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # as a shell reports a command killed by SIGPIPE
EXIT_STATUSES = ("exit status of run and report: 0 GO, 1 NO-GO, 3 INCOMPLETE (run --no-report: 0 once stored); "
                 "2 a bad runbook, profile or option; 128 + the signal when stopped by SIGINT (Ctrl-C), SIGTERM or "
                 "SIGHUP, its trainers killed first. bless: 0 when it wrote the golden curves, 2 when it wrote "
                 "nothing. check-artifacts: 0 the contract holds, 1 not, 2 not a directory.")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {n}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsa-validate", epilog=EXIT_STATUSES,
                                description="NSA acceptance harness: runbook phases -> GO/NO-GO report")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, runbook_default: str | None, results: bool = True) -> None:
        sp.add_argument("--runbook", default=runbook_default, help=f"runbook name under runbooks/ or a YAML path (default: {runbook_default or 'all stored'})")
        sp.add_argument("--profile", default=None, help="hardware profile name or YAML path (default: " + (
            "the runbook's first)" if runbook_default else "with --runbook its first; without, every stored pair)"))
        if results:
            sp.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR,
                            help="result store and run artifacts (default: %(default)s)")

    r = sub.add_parser("run", help="run phases, store results, render the report")
    common(r, DEFAULT_RUNBOOK)
    r.add_argument("--phase", action="append", default=None,
                   help="run only this phase (repeatable; each phase runs once, in runbook order)")
    r.add_argument("--hardware-mismatch", choices=MISMATCH_POLICIES, default="run",
                   help="what to do when the GPUs differ from the profile's (default: run and report)")
    r.add_argument("--jobs", type=_positive, default=None,
                   help="untimed points (pytest, preflight) to run at once; timed points always run alone "
                        "(default: the runbook's max_parallel)")
    r.add_argument("--no-report", action="store_true",
                   help="store results without rendering the report; exit 0 once stored (the verdict and its exit "
                        "status come from `nsa-validate report`)")
    r.add_argument("--no-plots", action="store_true", help="render the report without PNG plots")

    rep = sub.add_parser("report", help="render the report from stored results")
    common(rep, None)
    rep.add_argument("--no-plots", action="store_true", help="render the report without PNG plots")
    rep.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                     help="another results directory to compare with, point by point (its commit, date and hardware "
                          "named); a tokens/s drop beyond the profile's max_toks_regression fails the report")

    ph = sub.add_parser("phases", help="list a runbook's phases and sweep points")
    common(ph, DEFAULT_RUNBOOK, results=False)

    b = sub.add_parser("bless", help="write golden loss curves from stored runs (only the points selected)",
                       description="Copy the loss of steps 1..golden_steps of stored runs into the runbook's golden "
                                   "file (runbooks/goldens/<runbook>__<profile>.yaml), for the hardware class each "
                                   "run ran on. Only the selected points' curves are replaced; without --phase or "
                                   "--point every point with golden_steps is blessed.")
    common(b, DEFAULT_RUNBOOK)
    b.add_argument("--phase", action="append", default=None, help="bless this phase's points (repeatable)")
    b.add_argument("--point", action="append", default=None, metavar="PHASE/POINT",
                   help="bless one point, e.g. long_run/default or scaling_sweep/seq_len=32,batch_size=1 (repeatable)")

    ca = sub.add_parser("check-artifacts", help="check a run directory against the artifact contract "
                        "(docs/artifact_contract.md): present / missing / malformed",
                        description="Check a run directory against the artifact contract (docs/artifact_contract.md) "
                                    "and print each file as present, missing or malformed. Exit 0 when it holds, 1 "
                                    "when a required file or field is missing or malformed, 2 for a DIR that is not "
                                    "a directory or a bad option.")
    ca.add_argument("dir", type=Path, help="a run directory (with --adapter: the trainer's own output directory)")
    ca.add_argument("--adapter", choices=sorted(ADAPTERS), default="native",
                    help="read DIR in a trainer's own format through this adapter (default: %(default)s, the contract)")
    ca.add_argument("--world-size", type=_positive, default=None,
                    help="processes of the run, for an adapter whose files do not say (default: its heartbeat "
                         "files); the contract's own env.json says it, so not without --adapter")
    return p


def _load(runbook_arg: str, profile_arg: str | None):
    rb = load_runbook(runbook_arg)
    prof = load_profile(profile_arg or rb.profiles[0])
    return rb, prof


class _Progress:
    """Progress of the running points: each point's latest line (step N/total, tokens/s, ETA),
    shown every few seconds; on a terminal in place, one line, the points side by side."""

    def __init__(self, stream=None, every_s: float = 5.0):
        self.stream, self.every_s, self.last = stream or sys.stderr, every_s, 0.0
        self.tty = self.stream.isatty()
        self.lines: dict[str, str] = {}
        self.lock = threading.Lock()

    def for_point(self, test_id: str):
        return lambda line: self.update(test_id, line)

    def update(self, test_id: str, line: str) -> None:
        with self.lock:
            self.lines[test_id] = line
            now = time.monotonic()
            if now - self.last < (0.5 if self.tty else self.every_s):
                return
            self.last = now
            if self.tty:
                self.stream.write("\r" + " | ".join(self.lines.values())[:159].ljust(79))
            else:
                self.stream.writelines(f"  ... {ln}\n" for ln in self.lines.values())
            self.stream.flush()

    def done(self, test_id: str | None, line: str) -> None:
        with self.lock:
            self.lines.pop(test_id, None)
            self.stream.write(("\r" if self.tty else "") + line.ljust(79 if self.tty else 0) + "\n")
            self.stream.flush()


def cmd_run(args: argparse.Namespace) -> int:
    rb, prof = _load(args.runbook, args.profile)
    expand(rb, prof)  # every phase's gates are checked, as pytest and `phases` do, not only the ones run
    points = expand(rb, prof, list(dict.fromkeys(args.phase)) if args.phase else None)
    ResultStore(args.results_dir).check()  # a broken store stops the run before anything runs
    goldens.check_readable(rb.path, rb.name, prof.name)  # so does an unreadable golden file
    hw = detect()
    progress = _Progress()
    print(f"nsa-validate: runbook {rb.name}, profile {prof.name}, {len(points)} point(s) on {hw.describe()}",
          file=sys.stderr)
    for diff in mismatches(prof, hw):
        print(f"nsa-validate: note: {diff}", file=sys.stderr)
    n = len(points)
    try:
        for batch in batches(points, args.jobs or rb.max_parallel):
            for point in batch:
                progress.done(None, f"[{points.index(point) + 1}/{n}] {point.test_id} ...")
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                futures = {pool.submit(run_point, p, args.results_dir, mismatch=args.hardware_mismatch,
                                       progress=progress.for_point(p.test_id)): p for p in batch}
                for fut in as_completed(futures):
                    point, rec = futures[fut], fut.result()
                    progress.done(point.test_id, f"[{points.index(point) + 1}/{n}] {point.test_id}: {rec.status} "
                                                 f"({rec.wall_s:.1f}s) {rec.reason}")
    except KeyboardInterrupt:
        if not args.no_report:  # the points finished before the interrupt, in a report
            _render(args.results_dir, rb.name, prof.name, rb, prof, not args.no_plots)
        raise
    if args.no_report:
        return 0
    return _render(args.results_dir, rb.name, prof.name, rb, prof, not args.no_plots)


def _render(results_dir: Path, rb_name: str, prof_name: str, rb, prof, plots: bool,
            baseline: Path | None = None) -> int:
    out = report.render(results_dir, rb_name, prof_name, runbook=rb, profile=prof, plots=plots, baseline=baseline)
    print(f"nsa-validate: {out.verdict} -> {out.path}")
    return EXIT[out.verdict]


def cmd_report(args: argparse.Namespace) -> int:
    if not args.results_dir.is_dir():
        print(f"nsa-validate: error: results directory {args.results_dir} "
              f"{'is not a directory' if args.results_dir.exists() else 'does not exist'} "
              "(give the --results-dir a run wrote into)", file=sys.stderr)
        return EXIT_USAGE
    if args.baseline is not None and not (args.baseline / "results.json").is_file():
        print(f"nsa-validate: error: --baseline {args.baseline}: no result store there (results.json not found)",
              file=sys.stderr)
        return EXIT_USAGE
    store = ResultStore(args.results_dir)
    pairs = store.pairs()
    given = {}  # --runbook (a name or a path) loads once, as given
    if args.runbook:
        rb, prof = _load(args.runbook, args.profile)
        pairs, given = [(rb.name, prof.name)], {(rb.name, prof.name): (rb, prof)}
    elif args.profile:
        name = load_profile(args.profile).name
        if not any(p == name for _, p in pairs):
            held = ", ".join(f"{r}/{p}" for r, p in pairs) or "no records at all"
            print(f"nsa-validate: error: no records of profile {name} in {store.path} (it holds: {held})",
                  file=sys.stderr)
            return EXIT_USAGE
        pairs = [(r, p) for r, p in pairs if p == name]
    if not pairs:
        print(f"nsa-validate: no results in {store.path}", file=sys.stderr)
        return EXIT[report.Verdict.INCOMPLETE]
    # of several stored pairs, those the baseline lacks are rendered without a comparison (when it
    # has none of them, the comparison's error says what it holds)
    in_baseline = set(ResultStore(args.baseline).pairs()) if args.baseline is not None else set()
    worst = 0
    for rb_name, prof_name in pairs:
        try:
            rb, prof = given.get((rb_name, prof_name)) or _load(*_ran_from(store, rb_name, prof_name))
        except HarnessError as exc:  # the runbook changed or moved: render what is stored
            print(f"nsa-validate: note: {exc}; rendering stored records only", file=sys.stderr)
            rb = prof = None
        baseline = args.baseline
        if baseline is not None and (rb_name, prof_name) not in in_baseline and in_baseline & set(pairs):
            print(f"nsa-validate: note: --baseline {baseline} holds no records of {rb_name}/{prof_name}; "
                  "its report has no comparison", file=sys.stderr)
            baseline = None
        code = _render(args.results_dir, rb_name, prof_name, rb, prof, not args.no_plots, baseline)
        worst = code if code == 1 or worst == 0 else worst
    return worst


def _ran_from(store: ResultStore, rb_name: str, prof_name: str) -> tuple[str, str]:
    """The runbook and profile the pair's latest record ran from (a path for a runbook outside
    runbooks/), or their names for records that do not say."""
    latest = max(store.records(rb_name, prof_name), key=lambda r: r.started, default=None)
    if latest is None:
        return rb_name, prof_name
    return latest.runbook_arg or rb_name, latest.profile_arg or prof_name


def cmd_bless(args: argparse.Namespace) -> int:
    rb, prof = _load(args.runbook, args.profile)
    if not (args.results_dir / "results.json").is_file():
        print(f"nsa-validate: error: no result store in {args.results_dir} (give the --results-dir a run wrote "
              "into)", file=sys.stderr)
        return EXIT_USAGE
    points = bless.select(rb, prof, args.phase, args.point)
    for b in bless.bless(args.results_dir, rb, prof, points):
        print(f"blessed {b.point} on {b.hardware_class}: {b.steps} steps from {b.run} (trainer {b.trainer} at "
              f"{b.commit or '?'}; this repository at {b.harness_commit or '?'})")
    print(f"nsa-validate: golden curves -> {goldens.GoldenFile.for_pair(rb.path, rb.name, prof.name).path}")
    return 0


def cmd_phases(args: argparse.Namespace) -> int:
    rb, prof = _load(args.runbook, args.profile)
    print(f"runbook {rb.name} ({rb.path}); profiles: {', '.join(rb.profiles)}; showing {prof.name}")
    if rb.trainer is not None:
        t = rb.trainer
        print(f"trainer {t.name}: {' '.join(t.entry)} in {t.root.describe()}, adapter {t.adapter}, "
              f"phases {', '.join(t.phases)}")
    for phase in rb.phases:
        pts = [p for p in expand(rb, prof, [phase.name])]
        launch = phase.launcher.kind + (f" x{phase.launcher.nproc}" if phase.launcher.kind == "torchrun" else "")
        config = f"config {phase.config}" if rb.trainer is None else f"trainer {rb.trainer.name}"
        what = {"train": f"{launch}, {config}, {phase.steps} steps", "pytest": " ".join(phase.tests),
                "preflight": "git SHA, collect_env, nvidia-smi", "profile": f"torch.profiler, {phase.steps} steps"}[phase.kind]
        print(f"  {phase.name:18s} {phase.kind:9s} {len(pts)} point(s)  timeout {phase.timeout_s:g}s  {what}")
        for g in pts[0].gates():
            thr = "to be measured" if g.threshold is None else f"{g.threshold:g}"
            print(f"      gate: {g.metric} {g.op} {thr} ({g.window.describe()})")
        if phase.golden_steps:
            rtol = prof.thresholds.get(goldens.RTOL_KEY)
            print(f"      golden: loss of steps 1-{phase.golden_steps} within rel {'to be measured' if rtol is None else f'{rtol:g}'} "
                  f"of {goldens.GoldenFile.for_pair(rb.path, rb.name, prof.name).path.name}")
        if len(pts) > 1:
            print(f"      sweep: {', '.join(p.slug for p in pts)}")
        print(f"      markers: {' '.join(pts[0].markers)}")
    return 0


def cmd_check_artifacts(args: argparse.Namespace) -> int:
    if args.world_size is not None and not ADAPTERS[args.adapter].converts:
        print(f"nsa-validate check-artifacts: error: --world-size is for an adapter (--adapter "
              f"{'/'.join(n for n in sorted(ADAPTERS) if ADAPTERS[n].converts)}); the contract's world size is "
              "env.json's world_size", file=sys.stderr)
        return EXIT_USAGE
    return check_artifacts.check(args.dir, args.adapter, args.world_size, costs=metric_costs())


#: signals that stop a run as Ctrl-C does; left to their default, SIGTERM (a scheduler's cancel,
#: `timeout`, `kill`) and SIGHUP (a closed terminal) killed the harness and orphaned its trainers
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopped(KeyboardInterrupt):
    """A stop signal, raised in the main thread as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_stop_signal(signum, frame) -> None:
    runner.ABORT.set()  # worker threads running trainers kill their process groups
    raise _Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:  # Ctrl-C always; the others unless ignored (`nohup` ignores SIGHUP)
            if sig == signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, _on_stop_signal)
    problem = checkout_problem()
    if problem:
        print(f"nsa-validate: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return {"run": cmd_run, "report": cmd_report, "phases": cmd_phases, "bless": cmd_bless,
                "check-artifacts": cmd_check_artifacts}[args.command](args)
    except HarnessError as exc:
        print(f"nsa-validate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        return _interrupted(getattr(exc, "signum", signal.SIGINT))
    except BrokenPipeError:
        # the reader went away (`nsa-validate phases | head -1`): stop quietly, as other command-line
        # tools do; stdout now points at /dev/null so that the interpreter's last flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception:
        # A Ctrl-C that lands inside C code can surface as another error: during a C extension's
        # first import (matplotlib's Agg backend, while plots are drawn) it becomes
        # "ImportError: initialization failed". It is still the user's interrupt.
        if runner.ABORT.is_set():
            return _interrupted(signal.SIGINT)
        raise


def _interrupted(signum: int) -> int:
    print(f"nsa-validate: interrupted ({signal.Signals(signum).name}): running trainers killed; the interrupted "
          "point was not recorded (its earlier record and artifacts are kept), and the report shows the points "
          "finished before", file=sys.stderr)
    return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())
