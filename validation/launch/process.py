"""Launch one subprocess from an argument list and supervise it until it ends, never hanging the
caller and never leaving a process of it behind.

The child starts in its own session; its whole tree is tracked (validation/launch/tree.py) and
killed when the run ends in any way: on the phase timeout, on a stall (a watched trainer whose
step stops growing for ``stall_s``, or one of whose ranks shows no new step for ``stall_s`` while
another rank goes past it: validation/launch/watch.py), on an interrupt (Ctrl-C,
SIGTERM or SIGHUP in the CLI: the session's abort flag, handed down by ``aborted_by``, or a
KeyboardInterrupt in the calling thread), and after a normal exit (whatever the trainer left
running); a harness that dies without killing it (``kill -9``) takes it along
(validation/launch/warden.py). Before killing a stalled or timed-out trainer the harness takes
every rank's stack (validation/launch/stacks.py). No shell is involved: every
argv element is passed to exec as is. Several processes (one torchrun agent per node) run as one
tree with a log pair each (``run_group``); a scheduler's cancel (scancel) goes before the kill.
A launch of several processes is over when one of them has failed and nothing of it runs but the
launched processes themselves, where either ranks had run under them (no rank is left under any
of them: a torchrun agent whose workers ended waits at its exit barrier for agents that are gone)
or none ever ran and the failed one gave up on a rendezvous that no rank can start from any more
(validation/contract/torchrun_log/said.py ``closed_rendezvous``: an agent frozen before the rendezvous
would otherwise hold the run until the start-up allowance). The rest are stopped then (each one's
process state recorded first) and the run ends as the failed one did, not at the stall or the
timeout. A launcher whose one process runs every node (srun) says when its launch is over itself
(``LaunchOver``; validation/launch/slurm.py).
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol, Sequence

import psutil

from validation.contract.files import tail
from validation.contract.stacks import HARNESS_STACKS, TakenStack
from validation.contract.torchrun_log import agent_said, closed_rendezvous, gave_up
from validation.excerpt import STDERR_TAIL_LINES
from validation.judge.seen import ProcessSeen, RankSilence
from validation.launch import orphans, stacks, warden
from validation.launch.lives import Lives
from validation.launch.load import LoadMeter
from validation.launch.tree import ProcessTree, with_token
from validation.launch.watch import StepWatch, Watch
from validation.machine import MachineLoad

class AbortFlag(Protocol):
    """A session's stop flag (session.StopFlag; a threading.Event does too)."""

    def is_set(self) -> bool: ...


#: the abort flag of the session whose point runs in this context (``aborted_by``)
_ABORT: contextvars.ContextVar[AbortFlag | None] = contextvars.ContextVar("abort", default=None)
#: seconds a launch of several processes may stay open once one of them failed and no other
#: process of it runs: time for the others to end by themselves (a torchrun agent at its exit
#: barrier whose store went with the failed agent ended 1.6 s after it, measured here) before
#: the harness stops them. A stall found once every rank under the launched processes has ended
#: waits as long from the moment they had all gone: a torchrun agent on a loaded machine can take
#: longer than a short ``stall_s`` to see its workers' exits and end as they did (a crash would
#: otherwise be called a stall)
LAUNCH_OVER_GRACE_S = 5.0


@contextlib.contextmanager
def aborted_by(flag: AbortFlag) -> Iterator[None]:
    """Within it (in this thread), every ``run`` watches ``flag``, the abort flag of the session
    running the point (validation/session/session.py): once it is set (a stop signal), a running
    ``run`` kills its tree and raises KeyboardInterrupt, also in worker threads, which never see the
    signal, and a new one starts nothing."""
    token = _ABORT.set(flag)
    try:
        yield
    finally:
        _ABORT.reset(token)


def _aborted() -> bool:
    flag = _ABORT.get()
    return flag is not None and flag.is_set()


@dataclass(frozen=True)
class Command:
    """One process of a launch: its argument list, the name of its logs, and what its environment
    adds to the launch's (a node's index)."""

    argv: list[str]
    log_name: str = "trainer"
    env: Mapping[str, str] = field(default_factory=dict)
    forwards_signals: bool = False
    """A launcher that forwards a SIGTERM to every task it started on every node (srun): it gets
    SIGTERM, not SIGKILL, when the harness dies, and the harness's warden leaves its tree alone
    (validation/launch/warden.py)."""


@dataclass(frozen=True)
class Part:
    """How one launched process of a run ended."""

    log_name: str
    pid: int | None
    """None: it could not be started."""
    exit_code: int | None
    """None when the harness killed it (it was still running when the run was stopped)."""
    ended_s: float | None
    """Seconds from the launch to its exit; None when the harness killed it."""
    stdout_path: Path
    stderr_path: Path
    state: str | None = None
    """Its process state (psutil: 'stopped', 'sleeping', 'disk-sleep', ...) when the harness
    stopped it still running; None when it exited by itself or none could be read."""


@dataclass(frozen=True)
class ProcResult:
    argv: list[str]
    exit_code: int | None
    """None when the harness killed the process (timeout or stall). For several processes: the
    first that failed, else 0."""
    timed_out: bool
    wall_s: float
    stdout_path: Path
    stderr_path: Path
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped a stalled run; None when it did not."""
    stacks: list[TakenStack] = field(default_factory=list)
    """The stacks taken before a stalled or timed-out watched run was killed."""
    parts: list[Part] = field(default_factory=list)
    """Each launched process (one, or one torchrun agent per node)."""
    slurm_job_id: str | None = None
    """The Slurm job the run was a step of (kind slurm)."""
    timeout_quiet_s: float | None = None
    """On the timeout of a watched run: seconds since its files last showed a new step (None: no
    step yet, no watch, or no timeout). Under stall_s by construction, else it would be a stall."""
    processes: dict[int, ProcessSeen] = field(default_factory=dict)
    """Of a watched run: each process below the launched ones, by pid, as the harness saw it
    against the steps its files showed (validation/launch/lives.py)."""
    load: MachineLoad | None = None
    """How busy other work kept the machine's cores while it ran (None: too short to say)."""
    silent_ranks: list[RankSilence] = field(default_factory=list)
    """Of a watched run the harness stopped (a stall, its timeout): the ranks whose heartbeats had
    shown no new step for stall_s while another rank's went on (watch.py ``StepWatch.silent``)."""

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return tail(self.stderr_path, lines)


class _Why(enum.Enum):
    """Why the harness stopped processes that were still running."""

    TIMEOUT = "timeout"
    STALL = "stall"
    LAUNCH_OVER = "launch over"
    """One launched process failed and no rank is left under the others, or none ever ran and the
    failed one gave up on a rendezvous closed for good (see the module's docstring)."""


@dataclass(frozen=True)
class _Stop:
    why: _Why
    note: str
    stalled_s: float | None = None
    quiet_s: float | None = None
    """A timeout's seconds since the last new step (None: no step yet, or no watch)."""
    beat_pids: dict[int, int] = field(default_factory=dict)
    """pid -> rank as the heartbeats said when the run was stopped (stacks.ranked reads it)."""
    silent: tuple[RankSilence, ...] = ()
    """The ranks silent when the run was stopped (ProcResult.silent_ranks)."""


class LaunchOver(Protocol):
    """Whether a launch is over while a launched process still runs (see the module's docstring):
    ``_LaunchOver`` for launched processes that are the nodes' agents themselves; a scheduler's
    launcher whose one process runs every node's task gives its own (validation/launch/slurm.py)."""

    def look(self, tree: ProcessTree, now: float) -> float | None:
        """Seconds the launch has been over, as of this poll of ``tree``; None while it is not."""

    def note(self, over_s: float) -> str:
        """What the harness says in each log when it stops the rest."""

    @property
    def exit_code(self) -> int | None:
        """The code the launch ended with where no launched process's own says it (a task of
        the scheduler's one process failed); None: that of the first launched process that failed."""


Cancel = Callable[[Callable[[], bool]], None]
"""Called before the harness kills a run it stops (or that an interrupt ends), with a function
that says whether every launched process has exited: a scheduler's own cancel (scancel), which
must give the run its grace and return once it has ended or the grace is spent."""


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float, log_dir: Path,
        log_name: str = "trainer", on_poll: Callable[[float], None] | None = None,
        poll_s: float = 0.25, watch: Watch | None = None) -> ProcResult:
    """Run ``argv`` to completion, or until ``timeout_s`` or (with ``watch``) a stall; stdout and
    stderr go to log_dir. An interrupt kills the tree and raises KeyboardInterrupt."""
    return run_group([Command([str(a) for a in argv], log_name)], env=env, cwd=cwd, timeout_s=timeout_s,
                     log_dir=log_dir, on_poll=on_poll, poll_s=poll_s, watch=watch)


def run_group(commands: Sequence[Command], *, env: Mapping[str, str], cwd: Path, timeout_s: float, log_dir: Path,
              on_poll: Callable[[float], None] | None = None, poll_s: float = 0.25, watch: Watch | None = None,
              tree: ProcessTree | None = None, on_tree: Callable[[ProcessTree], None] | None = None,
              cancel: Cancel | None = None, over: LaunchOver | None = None) -> ProcResult:
    """Run the processes side by side as one tree (one token), each with its own logs, until all
    have exited, or until ``timeout_s``, a stall or the launch is over (``over``, else
    ``_LaunchOver`` of the launched processes); ``on_tree`` sees the tree at every poll;
    ``cancel`` runs before the kill of a stopped or interrupted run. The result names the first
    command (all of a launch's agents run the same argv) and the log of the first that failed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if _aborted():  # interrupted before this point started: start nothing
        raise KeyboardInterrupt
    tree = tree or ProcessTree()
    meter = LoadMeter()
    start = time.monotonic()
    stop: _Stop | None = None
    taken: list[TakenStack] = []
    procs: list[subprocess.Popen | None] = []
    ended: dict[int, float] = {}
    states: dict[int, str] = {}
    lives: Lives | None = None
    with contextlib.ExitStack() as logs:
        files = [(logs.enter_context(open(log_dir / f"{c.log_name}.stdout.log", "wb")),
                  logs.enter_context(open(log_dir / f"{c.log_name}.stderr.log", "wb"))) for c in commands]
        try:
            try:
                warden.keep_watch()
                for c, (out, err) in zip(commands, files):
                    own = {**env, **c.env} if c.forwards_signals else with_token({**env, **c.env}, warden.HARNESS_TOKEN)
                    procs.append(_start(c, orphans.with_owner(tree.environment(own), tree.token), cwd, out, err))
                    if procs[-1] is not None:
                        tree.adopt(procs[-1].pid)
                if any(p is not None for p in procs):
                    logs_err = [log_dir / f"{c.log_name}.stderr.log" for c in commands]
                    over = over or _LaunchOver(procs, logs_err)
                    lives = Lives({p.pid for p in procs if p is not None}) if watch is not None else None
                    stop = _supervise(procs, over, ended, tree, start, timeout_s, poll_s, on_poll, on_tree, watch,
                                      lives)
            except KeyboardInterrupt:
                if cancel is not None:
                    cancel(lambda: all(p is None or p.poll() is not None for p in procs))
                raise
            if stop is not None:
                if watch is not None and stop.why != _Why.LAUNCH_OVER:  # a launch over has no rank to take
                    taken = stacks.take(stacks.ranked(tree.members(), tree.roots, watch.single_process,
                                                      stop.beat_pids), watch.run_dir, stop.note)
                if cancel is not None:
                    cancel(lambda: all(p is None or p.poll() is not None for p in procs))
                _record_ends(procs, ended, start)  # those the cancel ended exited by themselves
                states = _states(procs)
                _kill(tree)
                for p, (_, err) in zip(procs, files):
                    if p is not None:
                        p.wait()
                        err.write(f"\n[nsa-validate] {stop.note}: {_stacks_note(taken)}process tree killed "
                                  f"(root pid {p.pid})\n".encode())
        finally:
            _kill(tree)  # on an interrupt, and whatever a finished trainer left running
    wall = time.monotonic() - start
    parts = [_part(c, p, ended, log_dir, states) for c, p in zip(commands, procs)]
    failed = sorted((part.ended_s if part.ended_s is not None else wall, i) for i, part in enumerate(parts)
                    if part.exit_code != 0)
    first = parts[failed[0][1]] if failed else parts[0]
    killed = stop is not None and stop.why != _Why.LAUNCH_OVER  # a launch over ended as its failed process did
    code = None if killed else (first.exit_code if failed else 0)
    if stop is not None and stop.why == _Why.LAUNCH_OVER and over is not None and over.exit_code is not None:
        code = over.exit_code  # a task of the one launched process (srun) failed: the launch ended as it did
    return ProcResult(commands[0].argv, code, stop is not None and stop.why == _Why.TIMEOUT, wall, first.stdout_path,
                      first.stderr_path, stop.stalled_s if stop else None, taken, parts,
                      timeout_quiet_s=stop.quiet_s if stop else None, processes=lives.seen() if lives else {},
                      load=meter.read(), silent_ranks=list(stop.silent) if stop else [])


def _start(c: Command, env: Mapping[str, str], cwd: Path, out, err) -> subprocess.Popen | None:
    """The process started in a session of its own, to die with the harness (warden.py); None (the
    reason in its stderr log) when it cannot be."""
    # SIGKILL, as the harness's own stops kill: a trainer may catch or ignore SIGTERM and hold its
    # GPUs for as long as it likes, and what torchrun does on SIGTERM (stop its workers) the
    # warden does for it. srun forwards the SIGTERM to the ranks on every node.
    death = warden.dies_with_harness(signal.SIGTERM if c.forwards_signals else signal.SIGKILL)
    try:
        return subprocess.Popen(c.argv, cwd=cwd, env=dict(env), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=death)
    except OSError as exc:
        err.write(f"cannot start {c.argv[0]}: {exc}\n".encode())
        err.flush()
        return None


def _part(c: Command, p: subprocess.Popen | None, ended: dict[int, float], log_dir: Path,
          states: dict[int, str]) -> Part:
    out, err = log_dir / f"{c.log_name}.stdout.log", log_dir / f"{c.log_name}.stderr.log"
    if p is None:
        return Part(c.log_name, None, 127, 0.0, out, err)
    done = p.pid in ended
    return Part(c.log_name, p.pid, p.returncode if done else None, round(ended[p.pid], 2) if done else None, out, err,
                None if done else states.get(p.pid))


def _states(procs: list[subprocess.Popen | None]) -> dict[int, str]:
    """The process state of each launched process still running, as the harness is about to stop
    it: 'stopped' (SIGSTOP, a debugger) tells a frozen agent from one that waits."""
    out = {}
    for p in procs:
        if p is not None and p.poll() is None:
            with contextlib.suppress(psutil.Error):
                out[p.pid] = psutil.Process(p.pid).status()
    return out


def _record_ends(procs: list[subprocess.Popen | None], ended: dict[int, float], start: float) -> None:
    """The moment each process that has exited since the last look was seen gone."""
    for p in procs:
        if p is not None and p.pid not in ended and p.poll() is not None:
            ended[p.pid] = time.monotonic() - start


def _supervise(procs: list[subprocess.Popen | None], over: LaunchOver, ended: dict[int, float],
               tree: ProcessTree, start: float, timeout_s: float, poll_s: float,
               on_poll: Callable[[float], None] | None, on_tree: Callable[[ProcessTree], None] | None,
               watch: Watch | None, lives: Lives | None = None) -> _Stop | None:
    """Poll until every process exits (None), the launch is over, the timeout or a stall (the
    reason to stop them). A launch that is over when the stall or the timeout comes is stopped as
    over: no rank is left that could have stalled. ``lives`` (with ``watch``) follows each process
    of the tree against the steps the files show, also once every launched process has exited."""
    steps = StepWatch(watch.progress_dir, watch.csv, watch.step_of, watch.live_steps) if watch is not None else None
    last_progress = start
    launched = {p.pid for p in procs if p is not None}
    ranks_ran = False
    ranks_gone_at: float | None = None
    while True:
        running = [p for p in procs if p is not None and p.poll() is None]
        _record_ends(procs, ended, start)
        if not running:
            if steps is not None and lives is not None:
                for _ in range(2):  # those found gone now are placed by the read of the files after
                    steps.look()
                    tree.poll()
                    lives.poll(tree.known(), steps.highest)
            return None
        try:
            running[0].wait(timeout=poll_s)
            continue
        except subprocess.TimeoutExpired:
            pass
        if _aborted():  # Ctrl-C in the CLI while this runs in a worker thread
            raise KeyboardInterrupt
        tree.poll()
        if on_tree is not None:
            on_tree(tree)
        now = time.monotonic()
        elapsed = now - start
        if on_poll is not None:
            on_poll(elapsed)
        over_s = over.look(tree, now)
        ranks_ran = ranks_ran or any(p.pid not in launched for p in tree.known())
        stop = None
        silent: list[RankSilence] = []
        if steps is not None:
            if steps.look(now):
                last_progress = now
            if lives is not None:
                lives.poll(tree.known(), steps.highest)  # after the read: see validation/launch/lives.py
            silent = steps.silent(now, watch.stall_s, watch.last_step, lives.ended() if lives is not None else ())
            stop = _stalled(steps, watch, now - last_progress) or _left_behind(silent, watch)
        if stop is None and elapsed >= timeout_s:
            quiet = round(now - last_progress, 1) if steps is not None and steps.highest is not None else None
            stop = _Stop(_Why.TIMEOUT, f"killed after {timeout_s:.0f}s timeout", quiet_s=quiet)
        if over_s is not None and (stop is not None or over_s >= LAUNCH_OVER_GRACE_S):
            return _Stop(_Why.LAUNCH_OVER, over.note(over_s))
        if stop is not None and stop.why == _Why.STALL and ranks_ran and not watch.single_process:
            # every rank under the launcher has ended: it is reporting how, not stalled
            # (LAUNCH_OVER_GRACE_S); a python launch's own process is its rank
            gone = all(m.pid in launched for m in tree.members())
            ranks_gone_at = (ranks_gone_at or now) if gone else None
            if gone and now - ranks_gone_at < LAUNCH_OVER_GRACE_S:
                continue
        if stop is not None:
            if steps is None:
                return stop
            # a stall of the run names only the ranks left behind: one a lockstep rank merely waits for
            # is the classic hang, named from the stacks; a timeout names every silent rank
            kept = silent if stop.why == _Why.TIMEOUT else [s for s in silent if s.left_behind]
            return replace(stop, beat_pids=dict(steps.pids), silent=tuple(kept))


def _left_behind(silent: list[RankSilence], watch: Watch) -> _Stop | None:
    """A stall of the ranks left behind (RankSilence.left_behind): each hung while the others went
    on past it without waiting for it, so the run's highest step kept growing."""
    behind = [s for s in silent if s.left_behind]
    if not behind:
        return None
    return _Stop(_Why.STALL, f"{'; '.join(s.text() for s in behind)} (stall_s {watch.stall_s:g})", behind[0].silent_s)


def _stalled(steps: StepWatch, watch: Watch, quiet: float) -> _Stop | None:
    """A stall when the files showed no new step for ``quiet`` seconds, the allowance (startup_s
    until a first step is done, else stall_s) or more."""
    first = not steps.stepped
    limit = watch.startup_s if first else watch.stall_s
    if quiet < limit:
        return None
    # the highest step any file showed: a heartbeat's step in progress, not the last one
    # training.csv logged (the verdict's 'after step N')
    if not first:
        at = f"at step {steps.highest} (the highest its files showed)"
    elif steps.highest is None:
        at = "before its first step"
    else:
        at = f"before its first step was done (its files showed step {steps.highest} begun)"
    key = "startup_s" if first else "stall_s"
    return _Stop(_Why.STALL, f"no progress for {quiet:.0f}s {at} ({key} {limit:g})", round(quiet, 1))


class _LaunchOver:
    """When a launch of several processes is over (see the module's docstring): one of them has
    failed, and nothing of the launch runs now but launched processes, where ranks had run under
    them or, none having run, the failed one gave up on a rendezvous closed for good. Before any
    rank ran and short of that, there is nothing to be over: agents still meeting end by
    themselves at their rendezvous's join timeout, saying which node never came."""

    def __init__(self, procs: list[subprocess.Popen | None], stderr_paths: list[Path]):
        self.procs = [p for p in procs if p is not None]
        self.logs = {p.pid: path for p, path in zip(procs, stderr_paths) if p is not None}
        self.launched = {p.pid for p in self.procs}
        self.ranks_ran = False
        self.closed: int | None = None
        """The pid of a failed process that gave up on a rendezvous closed for good."""
        self.read: set[int] = set()
        """Failed processes whose log was read (whole: they had exited)."""
        self.since: float | None = None
        self.exit_code: int | None = None
        """Always None: the launch ends as its first failed process did."""

    def look(self, tree: ProcessTree, now: float) -> float | None:
        """Seconds the launch has been over, as of this poll of ``tree``; None while it is not."""
        self.ranks_ran = self.ranks_ran or any(p.pid not in self.launched for p in tree.known())
        failed = [p for p in self.procs if p.poll() not in (None, 0)]
        for p in failed:
            if self.closed is None and not self.ranks_ran and p.pid not in self.read:
                self.read.add(p.pid)  # once: its log is whole, it has exited
                self.closed = p.pid if closed_rendezvous(agent_said(self.logs[p.pid])) else None
        if len(self.procs) < 2 or not failed or not (self.ranks_ran or self.closed is not None) or \
                any(m.pid not in self.launched for m in tree.members()):
            self.since = None
            return None
        self.since = now if self.since is None else self.since
        return now - self.since

    def note(self, over_s: float) -> str:
        """What the harness says in each log when it stops the rest."""
        if self.ranks_ran:
            return f"a launched process failed and no rank was left running under the others for {over_s:.0f}s"
        return (f"a launched process gave up on the rendezvous ({gave_up(agent_said(self.logs[self.closed]))}), "
                f"which no rank can start from any more, and no rank had started under the others for {over_s:.0f}s")


def _stacks_note(taken: list[TakenStack]) -> str:
    if not taken:
        return ""
    methods = sorted({t.method for t in taken})
    return f"stacks of {len(taken)} process(es) taken ({', '.join(methods)}; {HARNESS_STACKS}/index.json); "


def _kill(tree: ProcessTree) -> None:
    """Kill the tree; a second interrupt while it sweeps restarts the sweep rather than cut it
    short (leaving survivors), and is raised once the tree is dead."""
    pending: BaseException | None = None
    while True:
        try:
            tree.kill()
            break
        except KeyboardInterrupt as exc:
            pending = exc
    if pending is not None:
        raise pending
