"""``nsa-validate`` (also ``python -m validation``): run runbook phases, render reports, list phases.

    nsa-validate run                      # the CPU smoke runbook, cpu profile, into ./results
    nsa-validate run --runbook nsa_ddp_a100 --profile a100 --phase bucket_sweep
    nsa-validate report [--runbook R --profile P] [--results-dir DIR] [--baseline DIR] [--tensorboard DIR]
    nsa-validate phases [--runbook R] [--profile P]
    nsa-validate bless --runbook R --profile P [--phase X] [--point PHASE/POINT] [--results-dir DIR]
    nsa-validate check-artifacts DIR [--adapter hf_trainer --world-size N --tokens-per-step N]

A door into the acceptance session (validation/session/session.py), as the pytest plugin is: it
turns options into ``SessionOptions``, shows progress on stderr and prints what the session says.
Exit statuses: ``EXIT_STATUSES`` below, also shown by ``nsa-validate --help``.
"""
from __future__ import annotations

import argparse
import enum
import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

from validation import DEFAULT_RESULTS_DIR, DEFAULT_RUNBOOK, checkout_problem
from validation.contract.adapters import ADAPTERS, FORMAT_OF, FORMATS
from validation.judge.check_command import check as check_artifacts
from validation.errors import HarnessError
from validation.runbook.describe import describe
from validation.runbook.load import load_profile, load_runbook, runbook_profile
from validation.session.session import (
    MISMATCH_POLICIES,
    AcceptanceSession,
    ExitStatus,
    Outcome,
    ReportInterrupted,
    SessionOptions,
    StopFlag,
    interrupted_note,
    report_interrupted_note,
    report_line,
)
from validation.store import bless
from validation.store.goldens import GoldenFile

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # as a shell reports a command killed by SIGPIPE
EXIT_STATUSES = ("exit status of run and report: 0 GO, 1 NO-GO, 3 INCOMPLETE (run --no-report: 0 once stored); "
                 "2 a bad runbook, profile or option, a results directory with nothing to report or whose files "
                 "cannot be written (a full disk: the point that ran is named as not stored), or a point that "
                 "cannot launch here (nothing is run then); 128 + the signal when stopped by SIGINT (Ctrl-C), "
                 "SIGTERM or SIGHUP, its trainers killed first (a signal inherited ignored, as nohup leaves "
                 "SIGHUP and a script's & job SIGINT, stays ignored). bless: 0 when it wrote the golden curves, 2 "
                 "when it wrote nothing. check-artifacts: 0 its files hold to the contract, 1 not, 2 not "
                 "a directory.")


TENSORBOARD_HELP = ("also write each train point's per-step metrics (loss, tokens/s, memory, grad norm, lr, mfu, "
                    "per-rank step time) as TensorBoard event files under DIR/<runbook>/<profile>/<phase>/<point>; "
                    "`tensorboard --logdir DIR` reads them (needs pip install -e '.[tensorboard]')")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {n}")
    return n


def _format(text: str) -> str:
    """check-artifacts' --adapter: a format as a runbook's trainer.format names it (contract, seed,
    ...); 'native', the contract's adapter by its own name, which this option once took, is read as
    contract."""
    return FORMAT_OF.get(text, text)


def _path(text: str) -> Path:
    """A path option's value, ``~`` expanded: the shell leaves it alone after '=' (``--results-dir=~/r``),
    and a directory named '~' in the working directory is never what was meant. An empty value (an
    unset shell variable) is refused: Path('') is the working directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?)")
    return Path(text).expanduser()


def _named(text: str) -> str:
    """A runbook's or profile's name or path; empty (an unset shell variable) is refused: it would
    read as the option not given (every runbook, or the runbook's first profile)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name (an unset shell variable?)")
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsa-validate", epilog=EXIT_STATUSES,
                                description="NSA acceptance harness: runbook phases -> GO/NO-GO report")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, runbook_default: str | None, results: bool = True) -> None:
        sp.add_argument("--runbook", type=_named, default=runbook_default, help=f"runbook name under runbooks/ or a YAML path (default: {runbook_default or 'all stored'})")
        # only a command with a results directory looks there for the profile file a point ran with
        first = "the runbook's first" + ("; where the results dir holds its points run with a profile file of that "
                                         "name, that file" if results else "")
        sp.add_argument("--profile", type=_named, default=None, help="hardware profile name or YAML path (default: " + (
            f"{first})" if runbook_default else
            "every stored pair, each judged by the profile file its latest record ran with)"))
        if results:
            sp.add_argument("--results-dir", type=_path, default=DEFAULT_RESULTS_DIR,
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
    r.add_argument("--tensorboard", type=_path, default=None, metavar="DIR", help=TENSORBOARD_HELP)

    rep = sub.add_parser("report", help="render the report from stored results")
    common(rep, None)
    rep.add_argument("--no-plots", action="store_true", help="render the report without PNG plots")
    rep.add_argument("--tensorboard", type=_path, default=None, metavar="DIR", help=TENSORBOARD_HELP)
    rep.add_argument("--baseline", type=_path, default=None, metavar="DIR",
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
    ca.add_argument("dir", type=_path, help="a run directory (with --adapter: the trainer's own output directory)")
    ca.add_argument("--adapter", type=_format, choices=sorted(FORMATS), default="contract",
                    help="the format DIR holds, as a runbook's trainer.format names it: a trainer's own, read "
                         "through its adapter, or the contract itself (default: %(default)s; native, its old name, "
                         "is read as contract)")
    ca.add_argument("--world-size", type=_positive, default=None,
                    help="processes of the run, for an adapter whose files do not say (default: its heartbeat "
                         "files, else 1); the contract's own env.json says it, so not without --adapter")
    ca.add_argument("--tokens-per-step", type=_tokens, default=None, metavar="N",
                    help="one rank's tokens per optimizer step, as the runbook's trainer.tokens_per_step gives them "
                         "(a whole number, or its factors as AxB..., e.g. 4x64 for batch size 4 of 64 tokens); "
                         "times the world size, the run's tokens per step, from which the adapter derives tokens/s as "
                         "`nsa-validate run` does (without it tokens/s is UNMEASURED, as in a run whose runbook gives "
                         "none). For " + _tokens_formats() + " only: other formats' files say their own rate")
    return p


def _tokens_formats() -> str:
    """The formats whose adapter takes --tokens-per-step, as --adapter names them: 'hf_trainer'."""
    return "/".join(n for n in sorted(FORMATS) if ADAPTERS[FORMATS[n]].takes_tokens_per_step)


def _tokens(text: str) -> int:
    """check-artifacts' --tokens-per-step: a whole number >= 1, or factors of them joined by x
    (4x64), as a runbook's trainer.tokens_per_step lists them."""
    total = 1
    for factor in text.lower().split("x"):
        try:
            total *= _positive(factor.strip())
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= 1 or factors such as 4x64, got {text!r}") \
                from None
    return total


def _load(runbook_arg: str, profile_arg: str | None):
    rb = load_runbook(runbook_arg)
    prof = load_profile(profile_arg) if profile_arg else runbook_profile(rb, rb.profiles[0])
    return rb, prof


def _options(args: argparse.Namespace, runbook: str | None) -> SessionOptions:
    return SessionOptions(results_dir=args.results_dir, runbooks=(runbook,) if runbook else (),
                          profiles=(args.profile,) if args.profile else (), phases=tuple(getattr(args, "phase", None) or ()),
                          first_profile_only=True, mismatch=getattr(args, "hardware_mismatch", "run"),
                          baseline=getattr(args, "baseline", None), jobs=getattr(args, "jobs", None),
                          plots=not args.no_plots, tensorboard=getattr(args, "tensorboard", None))


#: what ``run`` says of its report after a stop signal, by whether it wrote one (None: --no-report)
class AfterStop(enum.Enum):
    """What became of the report of a run stopped among its points."""

    WRITTEN = ", and the report shows the points finished before"
    SECOND_STOP = ("; no report was written (a second stop came while it was): `nsa-validate report` writes it from "
                   "the stored records")
    NOT_ASKED = ", and no report was asked (--no-report)"
    NOTHING_STORED = "; no point of it is stored, so no report was written (there is nothing to report)"


class RunStopped(KeyboardInterrupt):
    """A stop signal while ``run``'s points ran, with what the session says it did by then and
    what became of the report of the points finished before."""

    def __init__(self, signum: int, note: str, reported: AfterStop):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.note, self.reported = signum, note, reported

    def text(self) -> str:
        return self.note + self.reported.value


class _Progress:
    """Progress of the running points: each point's latest line (step N/total, tokens/s, ETA),
    shown every few seconds; on a terminal in place, one line, the points side by side."""

    def __init__(self, stream=None, every_s: float = 5.0):
        self.stream, self.every_s, self.last = stream or sys.stderr, every_s, 0.0
        self.tty = self.stream.isatty()
        self.lines: dict[str, str] = {}
        self.lock = threading.Lock()

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


def cmd_run(args: argparse.Namespace, abort: StopFlag) -> int:
    session = AcceptanceSession(_options(args, args.runbook), abort)
    points = session.points()
    session.check_ready()
    progress = _Progress()
    print(f"nsa-validate: {len(points)} point(s) of {', '.join(f'{rb.name}/{prof.name}' for rb, prof in session.pairs())}"
          f" on {session.machine.describe()}", file=sys.stderr)
    for note in session.mismatch_notes():
        print(f"nsa-validate: note: {note}", file=sys.stderr)
    session.stop_left_running(lambda text: print(f"nsa-validate: warning: {text}", file=sys.stderr))

    def started(i: int, n: int, point) -> None:
        progress.done(None, f"[{i}/{n}] {point.test_id} ...")

    def finished(i: int, n: int, outcome: Outcome) -> None:
        progress.done(outcome.point.test_id, f"[{i}/{n}] {outcome.line()}")

    try:
        session.run(progress.update, started, finished)
    except KeyboardInterrupt as exc:
        signum = session.stop_signal(exc)
        session.note_stop(signum)
        reported = AfterStop.NOT_ASKED
        if not args.no_report:  # the points finished before the interrupt, in a report
            pairs = session.reportable_after_stop((rb.name, prof.name) for rb, prof in session.pairs())
            try:
                if pairs:
                    _render(session, pairs, interrupted=True)
                reported = AfterStop.WRITTEN if pairs else AfterStop.NOTHING_STORED
            except KeyboardInterrupt:  # a second stop signal: the report stays unwritten
                reported = AfterStop.SECOND_STOP
            except Exception:  # a stop inside C code while plots are drawn (see main)
                if not session.stopping():
                    raise
                reported = AfterStop.SECOND_STOP
        raise RunStopped(signum, session.interrupted_note(signum), reported) from exc
    try:
        return 0 if args.no_report else _render(session)
    except KeyboardInterrupt as exc:  # every point was stored: only the report was stopped
        raise ReportInterrupted(session.stop_signal(exc)) from exc
    except Exception as exc:  # a Ctrl-C inside C code while plots are drawn (see main)
        if session.stopping():
            raise ReportInterrupted(session.stop_signal()) from exc
        raise


def _render(session: AcceptanceSession, pairs: list[tuple[str, str]] | None = None, interrupted: bool = False,
            profile_notes: bool = False) -> int:
    """Render, and print each report's line; ``profile_notes``: first the notes of the pairs judged
    by a profile file the command line did not give (``run`` says them before its points). Rendering
    (a plot per phase) takes seconds, after a stop signal too: the user is told it is under way."""
    after = " of the points stored before the interrupt (another stop signal leaves it unwritten)" if interrupted else ""
    print(f"nsa-validate: writing the report{after} ...", file=sys.stderr, flush=True)
    rendered = session.render(pairs, notes=_note)
    for note in session.profile_notes if profile_notes else ():
        _note(note)
    for out in rendered:
        print(f"nsa-validate: {report_line(out, interrupted)}")
        if out.events is not None:
            print(f"nsa-validate: TensorBoard events -> {out.events} (tensorboard --logdir {out.events})")
    return session.exit_status(rendered)


def _note(text: str) -> None:
    print(f"nsa-validate: note: {text}", file=sys.stderr)


def cmd_report(args: argparse.Namespace, abort: StopFlag) -> int:
    session = AcceptanceSession(_options(args, args.runbook), abort)
    return _render(session, session.report_pairs(), profile_notes=True)


def cmd_bless(args: argparse.Namespace) -> int:
    rb, prof = _load(args.runbook, args.profile)
    bless.check_store(args.results_dir)
    points = bless.select(rb, prof, args.phase, args.point)
    for b in bless.bless(args.results_dir, rb, prof, points):
        print(f"blessed {b.point} on {b.hardware_class}: {b.steps} steps from {b.run} (trainer {b.trainer} at "
              f"{b.commit or '?'}; this repository at {b.harness_commit or '?'})")
    print(f"nsa-validate: golden curves -> {GoldenFile.for_pair(rb.path, rb.name, prof.name).path}")
    return 0


def cmd_phases(args: argparse.Namespace) -> int:
    rb, prof = _load(args.runbook, args.profile)
    print("\n".join(describe(rb, prof, GoldenFile.for_pair(rb.path, rb.name, prof.name).path.name)))
    return 0


def cmd_check_artifacts(args: argparse.Namespace) -> int:
    adapter = FORMATS[args.adapter]
    if args.world_size is not None and not ADAPTERS[adapter].converts:
        print(f"nsa-validate check-artifacts: error: --world-size is for an adapter (--adapter "
              f"{'/'.join(n for n in sorted(FORMATS) if ADAPTERS[FORMATS[n]].converts)}); the contract's world size "
              "is env.json's world_size", file=sys.stderr)
        return ExitStatus.USAGE
    if args.tokens_per_step is not None and not ADAPTERS[adapter].takes_tokens_per_step:
        print(f"nsa-validate check-artifacts: error: --tokens-per-step is for --adapter {_tokens_formats()}, whose "
              f"tokens/s the harness derives from it; {args.adapter}'s files say their own tokens/s (or none)",
              file=sys.stderr)
        return ExitStatus.USAGE
    return check_artifacts(args.dir, adapter, args.world_size, tokens_per_step=args.tokens_per_step)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    abort = StopFlag()  # the flag of the session a command builds, set by a stop signal
    # the nsa-validate process itself (no argv given) ends, once stopped, as its first stop signal
    # says: a later one that came after the stop was over would end it as its own
    with AcceptanceSession.stop_signals(abort, ignore_after_stop=argv is None):
        try:
            problem = checkout_problem()
            if problem:
                raise HarnessError(problem)
            command = {"run": functools.partial(cmd_run, abort=abort),
                       "report": functools.partial(cmd_report, abort=abort), "phases": cmd_phases,
                       "bless": cmd_bless, "check-artifacts": cmd_check_artifacts}[args.command]
            return int(command(args))
        except HarnessError as exc:
            print(f"nsa-validate: error: {exc}", file=sys.stderr)
            return ExitStatus.USAGE
        except ReportInterrupted as exc:
            abort.settled = True
            print(report_interrupted_note(exc.signum), file=sys.stderr)
            return 128 + exc.signum
        except RunStopped as exc:
            abort.settled = True
            print(exc.text(), file=sys.stderr)
            return 128 + exc.signum
        except KeyboardInterrupt as exc:
            abort.settled = True
            return _interrupted(args.command, abort.signum or getattr(exc, "signum", None) or signal.SIGINT)
        except BrokenPipeError:
            # the reader went away (`nsa-validate phases | head -1`): stop quietly, as other command-line
            # tools do; stdout now points at /dev/null so that the interpreter's last flush cannot fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except Exception:
            # A Ctrl-C that lands inside C code can surface as another error: during a C extension's
            # first import (matplotlib's Agg backend, while plots are drawn) it becomes
            # "ImportError: initialization failed". It is still the user's interrupt.
            if abort.is_set():
                abort.settled = True
                return _interrupted(args.command, abort.signum or signal.SIGINT)
            raise


def _interrupted(command: str, signum: int) -> int:
    """What the command stopped by ``signum`` did, said on stderr; its exit status. Only ``run``
    runs trainers and points; ``report`` writes its report whole (a temporary file renamed) or
    not at all, and changes no record."""
    if command == "run":  # stopped outside its points' run (RunStopped says what a stop among them did)
        print(f"{interrupted_note(signum)}; no report was written: `nsa-validate report` writes it from the stored "
              "records", file=sys.stderr)
    elif command == "report":
        print(f"nsa-validate: interrupted ({signal.Signals(signum).name}) while the report was written: a report not "
              "finished stays as it was before (with several runbooks or profiles, the ones finished were written); "
              "the stored records are unchanged; `nsa-validate report` writes it", file=sys.stderr)
    else:
        print(f"nsa-validate: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
    return 128 + signum


if __name__ == "__main__":
    raise SystemExit(main())
