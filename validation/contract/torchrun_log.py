"""How each rank of a torchrun launch ended, and what its agent itself last said, read from
torchrun's own log (its stderr)."""
from __future__ import annotations

import io
import re
import signal
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

from validation.contract.stacks import Frame
from validation.excerpt import EXCERPT_CHARS, STDERR_TAIL_LINES

#: a line a rank wrote with its prefix: Python's '[rank1]: Traceback ...' (the excepthook torch.distributed
#: installs), C++ logging's '[rank1]:[E1128 04:58:52.554 ProcessGroupNCCL.cpp:689] ...' (no space)
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
#: a rank's entry in torchrun's summary as it gives up ('  rank      : 1 (local_rank: 0)'): its global rank
#: and its local one, on its agent's node
_TR_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank(?:: (?P<local>\d+))?")
_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Fault|Interrupt|Failure)\b")
_TR_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+)(?: \(pid: (\d+)\))?")
#: torchrun's agent signalling a worker still running, once one had failed (or it was told to stop):
#: 'Sending process 4149 closing signal SIGTERM' (workers it started as subprocesses), 'Closing process
#: 4149 via signal SIGTERM' (as multiprocessing's), 'Unable to shutdown process 4149 via Signals.SIGTERM,
#: forcefully exiting via Signals.SIGKILL' (one that outlived its SIGTERM)
_AGENT_SIGNALLED = re.compile(r"^(Sending process|Closing process|Unable to shutdown process) (\d+) "
                              r"(closing signal|via)")
#: a line of torchrun's own logging in the formats of torch before 2.4, which whose_lines does not read
#: ('WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 59460 closing signal SIGTERM',
#: '[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 270
#: closing signal SIGTERM'): the module named is torchrun's, so the line is its agent's
_OLD_AGENT_LINE = re.compile(r"^(?:[A-Z]+:|\[[^\]]*\] )torch\.distributed\.elastic\.[\w.]+:"
                             r"(?: \[[A-Z]+\])? ?(?P<msg>.*)$")
#: torchrun's agent itself told to stop (SIGTERM, SIGINT): it signals its workers as it goes, and any of
#: them may have had the signal from where the agent did
_AGENT_TOLD = re.compile(r"^Received \S+ death signal, shutting down workers")
#: the harness's own notes in a log (validation/launch/process.py)
_HARNESS_NOTE = "[nsa-validate]"
#: Slurm's step daemon writing into a task's stderr ('slurmstepd-vmn0: error: *** STEP 7.1 ON vmn0
#: CANCELLED AT ... ***', 'slurmstepd: error: ...'): neither the agent's word nor a worker's
_SLURMSTEPD = re.compile(r"^slurmstepd(-\S+)?: ")
#: torchrun's agent gave up on its rendezvous: the others never came within its join timeout
#: (RendezvousTimeoutError), one that gave up had closed it (RendezvousClosedError), or the store
#: host never answered or went away (RendezvousConnectionError, DistNetworkError)
_GAVE_UP = re.compile(r"RendezvousTimeoutError|RendezvousConnectionError|DistNetworkError|RendezvousClosedError")
#: of those, the ones after which no rank can start under any agent of the rendezvous: the agent
#: waited in it (or found it closed) and, exiting on an error that is no signal, torchrun's
#: launch_agent shuts its rendezvous handler down, which closes the rendezvous for good; an agent
#: still in it sees that at its next sync (RendezvousClosedError, or RendezvousConnectionError
#: once the store went with the agent that held it, about a second after). A connection
#: error alone may be the agent's own (it never reached the store): the others are not told.
_CLOSED = re.compile(r"RendezvousTimeoutError|RendezvousClosedError")
#: torchrun's own report that a worker failed (its agent's traceback, last in its log): it says
#: nothing of why
_CHILD_FAILED = "ChildFailedError"
_TRACEBACK = "Traceback (most recent call last):"
#: a line that looks like an error where no traceback says one: an exception's ('OSError: ...'), a
#: trainer's own one-line error ('error: ...', '[rank 0] error at step 6: ...'), its rank prefix dropped,
#: or argparse's refusal of a command line ('train.py: error: unrecognized arguments: --bogus 1')
_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception|Interrupt)|RuntimeError|AssertionError)\b.*")
_SAID_ERROR = re.compile(r"^(\[rank \d+\] )?(?P<said>([\w.-]+: )?error\b.*:.*)$", re.IGNORECASE)
#: a rank's exception that is a peer's failure breaking its collective, not its own
_VICTIM = re.compile(r"Connection closed by peer|remote worker|Connection reset|DistBackendError|NCCL|"
                     r"ProcessGroup|Broken pipe|Timed out waiting", re.IGNORECASE)
#: a line a worker printed of its collective broken by a peer (a caught error, in the trainer's own words
#: around gloo's or NCCL's): stricter than ``_VICTIM``, which reads a known exception, not any line
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|remote (worker|process)|DistBackendError|"
                        r"NCCL error", re.IGNORECASE)
#: the C++ runtime's last word before it aborts a process (SIGABRT) whose threads were never joined: at an
#: interpreter's exit, those of a process group whose collective broke (gloo's), or that was never destroyed
_TERMINATE = "terminate called without an active exception"
#: Python's report of a fatal signal (faulthandler, which torchrun's workers enable) and what ends it; the
#: frames it lists between, of each thread, are '  File "...", line N in f' lines, or '  <no Python frame>'
_FATAL_ABORT = "Fatal Python error: Aborted"
_FATAL_END = "Extension modules:"
#: NCCL's watchdog, in the rank's own log lines (a ``[rankN]:`` prefix, or the default process group's
#: rank in its message: '[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated
#: with exception: ...'): the collective it watched timed out, or failed, and it takes the process down
#: (SIGABRT, after 'terminate called after throwing an instance of 'c10::DistBackendError'')
_WATCHDOG = re.compile(r"(\[PG [^\]]*\(default_pg\) Rank (?P<rank>\d+)\] )?(Process group|NCCL) watchdog thread "
                       r"terminated with exception: (?P<why>.*)|(?P<timeout>Watchdog caught collective operation "
                       r"timeout: .*)")
#: of the watchdog's reasons, those of a peer: its collective timed out waiting for one that never came,
#: or a peer went away under it (ncclRemoteError); not a fault of the rank's own (a CUDA error)
_PEER_FAILED = re.compile(r"Watchdog caught collective operation timeout|ncclRemoteError|remote process exited|"
                          r"Connection (closed|reset) by peer", re.IGNORECASE)
#: a frame of a Python traceback, and a file of no trainer's own: an installed package's, the standard
#: library's, or none ('<frozen runpy>', '<string>')
_TB_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<")
#: the markers under a traceback's source line that point at the expression ('   ^^^^^^')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")

#: gloo's collective that gave up waiting for a peer, in the exception it raised in the rank that waited
#: ('[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete')
_GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (recv|send) operation")


@dataclass(frozen=True)
class RankFailure:
    """How one rank ended, from torchrun's log."""

    exception: str | None = None
    signal: str | None = None
    exit_code: int | None = None
    unranked: str | None = None
    """Of a rank that failed silently (``silent``), the only one of its log: the exception of the
    log's worker tracebacks that name no rank (``worker_said``; one, or several that all end in it,
    as where every rank failed one import and torchrun stopped the others before they exited),
    most likely its own, printed before its process group; the log does not say whose, and the
    report says so."""
    broken_collective: str | None = None
    """Of a rank killed by SIGABRT with no exception of it in the log: the error of a broken collective
    that the log shows before its abort ('error: [..pair.cc:553] Connection closed by peer [..]:5860';
    ``_teardown_aborts``), most likely its own, caught: the rank caught its collective broken by a
    peer's failure and exited (sys.exit(1), as many trainers do), and its interpreter's exit aborted on
    the broken process group's threads. It failed after a peer, not in its own right."""
    nccl_watchdog: str | None = None
    """Of a rank whose NCCL watchdog found its collective failed by a peer (``_WATCHDOG``, of that rank
    in the log): it timed out waiting for a peer that never came ('Watchdog caught collective operation
    timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, ...) ran for 15085 milliseconds before timing out'), or a
    peer went away under it (ncclRemoteError). The watchdog then took the process down (SIGABRT), or its
    next collective raised (DistBackendError): it failed waiting for a peer, not in its own right, and
    the peer it waited for may have been still running (a hang: torchrun's SIGTERM ended it)."""
    caught_timeout: str | None = None
    """Of a rank that exited non-zero with no exception of it in the log: gloo's timeout of a collective
    that a worker printed ('rank 0: giving up: [..unbound_buffer.cc:78] Timed out waiting 10000ms for recv
    operation to complete'; ``_caught_timeouts``), most likely its own, caught: its collective gave up
    waiting for a peer that was there and never came (a peer that had left breaks it at once, 'Connection
    closed by peer'), and it exited of its own choosing after. It failed waiting, not in its own right."""
    aborted: str | None = None
    """Of a rank killed by SIGABRT with no exception of it in the log, no broken collective before its
    abort and no NCCL watchdog's word: the C++ runtime's last word (``_TERMINATE``; ``_own_aborts``):
    the process aborted itself (a C++ thread object destroyed while still joinable; at an
    interpreter's exit, a process group's threads never torn down). No signal came from elsewhere:
    not the kernel's OOM killer, which sends SIGKILL."""
    at_exit: bool = False
    """Of an ``aborted`` rank: Python's report of the abort (``_FATAL_ABORT``) lists no Python frame
    in any thread: the trainer's code had ended (sys.exit, a return from main) and the interpreter's
    exit aborted."""
    pid: int | None = None
    """Its process id, as torchrun's summary reports it."""
    traceback: str | None = None
    """Its own traceback as the log prints it (its ``[rankN]:`` lines, the prefix dropped), from its
    first 'Traceback' line to its exception, the last STDERR_TAIL_LINES lines of it; None where the
    log holds none of it."""
    raised_at: Frame | None = None
    """The innermost frame of its last traceback in the trainer's own code (no installed package's,
    no standard library's: ``_LIBRARY``): where the trainer called what raised; None where no frame is."""
    raised_code: str | None = None
    """That frame's source line, as the traceback prints it, without its comment."""
    ended_by_agent: bool | None = None
    """Whether torchrun's agent signalled this rank's process (``_AGENT_SIGNALLED``): True, its end was
    the agent ending the ranks still running; False, the agent signalled other ranks (so its log shows
    its signals) but not this one, which had ended before, and a SIGTERM that killed it came from
    elsewhere (a person's kill, a scheduler, a preemption of one process); None where the log cannot
    say (no pid, no signal of the agent's in it, or the agent was itself told to stop)."""

    @classmethod
    def from_json(cls, d: dict) -> RankFailure:
        """A stored record's failure of a rank."""
        return cls(**{**d, "raised_at": Frame(**d["raised_at"]) if d.get("raised_at") else None})

    @property
    def located(self) -> str | None:
        """Its exception and where the trainer's code was when it was raised: 'OSError: [Errno 22]
        Invalid argument, at /x/train.py:49 in <module> (st = torch.load(ck))'; its exception alone
        where no frame of the trainer's is known."""
        if not self.exception or self.raised_at is None:
            return self.exception
        f = self.raised_at
        return (f"{self.exception}, at {f.file}:{f.line} in {f.func}"
                + (f" ({self.raised_code[:EXCERPT_CHARS]})" if self.raised_code else ""))

    @property
    def own(self) -> bool:
        """Failed in its own right: killed by a signal that was not torchrun's agent ending it
        (``by_agent``), or an exception that is not a peer's collective breaking under it."""
        if self.exception:
            return not _VICTIM.search(self.exception)
        return (bool(self.signal) and not self.by_agent and self.broken_collective is None
                and self.nccl_watchdog is None)

    @property
    def gave_up_waiting(self) -> str | None:
        """What says its collective gave up waiting for a peer that never came: its NCCL watchdog's
        word ('its NCCL watchdog: timeout: WorkNCCL(SeqNum=3, ...) ran for 15085 milliseconds before
        timing out.'), or gloo's exception ('RuntimeError: Timed out waiting 10000ms for recv operation
        to complete'); None where nothing does."""
        if self.nccl_watchdog is not None:
            return "its NCCL watchdog: " + self.nccl_watchdog.removeprefix("Watchdog caught collective operation ")
        if self.exception and _GLOO_TIMEOUT.search(self.exception):
            return short_exception(self.exception)
        return self.caught_timeout

    @property
    def by_agent(self) -> bool:
        """Ended by torchrun's agent, which ends the ranks still running once one has failed: its log
        says it signalled this rank's process (``ended_by_agent``; a SIGKILL after a SIGTERM the rank
        outlived too), else, where the log cannot say, a SIGTERM is taken for the agent's."""
        if self.ended_by_agent is not None:
            return self.ended_by_agent and bool(self.signal)
        return self.signal == "SIGTERM"

    @property
    def silent(self) -> bool:
        """Exited with a code of its own (no signal) and no exception of it in the log: a rank that
        failed before its process group (its traceback, if any, carries no ``[rankN]:``), or one
        that printed its error its own way and exited non-zero; or one that did the latter after its
        collective broke and whose exit then aborted (``broken_collective``): what torchrun saw of it
        is an exit of its own choosing, after a peer's failure."""
        if self.broken_collective is not None:
            return True
        if self.nccl_watchdog is not None or self.caught_timeout is not None:
            return False
        return not self.exception and not self.signal and self.exit_code is not None and self.exit_code > 0

    @property
    def cause(self) -> str | None:
        """What ended it, in short: its exception without gloo's source path, else the signal
        that killed it ('killed by SIGKILL'), else its exit code ('exit code 1'); None where
        torchrun said none of them."""
        if self.exception:
            return short_exception(self.exception)
        if self.broken_collective is not None:
            return f"killed by {self.signal} after a collective broke ({short_exception(self.broken_collective)})"
        if self.aborted is not None:
            return (f"aborted itself ({self.signal} after {self.aborted!r})"
                    + (" at the interpreter's exit (no Python frame running)" if self.at_exit else ""))
        if self.nccl_watchdog is not None and self.signal == "SIGABRT":  # the watchdog's own abort
            return f"killed by SIGABRT by its NCCL watchdog ({self.nccl_watchdog[:EXCERPT_CHARS]})"
        if self.nccl_watchdog is not None and self.signal:  # ended before its watchdog's abort came
            sender = " from torchrun's agent" if self.by_agent else ""
            return (f"killed by {self.signal}{sender}, its NCCL watchdog having given up on a collective "
                    f"({self.nccl_watchdog[:EXCERPT_CHARS]})")
        if self.signal and self.ended_by_agent is True and self.signal != "SIGTERM":
            return f"killed by {self.signal} from torchrun's agent, once its SIGTERM had not ended it"
        if self.signal == "SIGTERM" and self.ended_by_agent is False:
            return "killed by SIGTERM, not torchrun's (its agent signalled only ranks still running after it had ended)"
        if self.signal:
            return f"killed by {self.signal}"
        if self.exit_code is None:
            return None
        if self.caught_timeout is not None:
            return f"exit code {self.exit_code} after a collective timed out ({self.caught_timeout})"
        return f"exit code {self.exit_code}" + (
            f"; the log's traceback that names no rank: {short_exception(self.unranked)}" if self.unranked else "")


def short_exception(text: str) -> str:
    """A rank's exception without gloo's source path: 'RuntimeError: Connection closed by peer [..]:1686'."""
    m = re.match(r"^(?P<name>[\w.]+): (\[[^\]]*\] )?(?P<msg>.*)$", text)
    if m is None:
        return text[:EXCERPT_CHARS]
    return f"{m['name'].split('.')[-1]}: {m['msg'].split('. ')[0][:EXCERPT_CHARS]}"


def rank_failures(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None
                  ) -> dict[int, RankFailure]:
    """Per rank: the exception its traceback ended with (an uncaught exception's lines carry
    ``[rankN]:``, from the sys.excepthook that torch.distributed installs with its process group;
    they are often far above the tail) and the exit code torchrun reported for it (negative:
    killed by that signal). Of the log's last attempt only (``last_attempt``, with what the harness
    ``seen`` of the agent): under ``--max-restarts`` an earlier attempt's exception is not how the
    run's ranks ended."""
    text = _read(stderr_path, max_bytes)
    if text is None:
        return {}
    text = last_attempt(text, seen)
    found: dict[int, dict] = {}
    said: dict[int, list[str]] = {}  # each rank's own lines, its prefix dropped
    rank = None
    for ln in text.splitlines():
        m = _RANK_LINE.match(ln)
        if m:
            said.setdefault(int(m.group(1)), []).append(m.group(2))
        if m and _EXC.match(m.group(2)):
            found.setdefault(int(m.group(1)), {})["exception"] = m.group(2).strip()
        t = _TR_RANK.match(ln)
        if t:
            rank = int(t.group(1))
        e = _TR_EXIT.match(ln)
        if e and rank is not None:
            code = int(e.group(1))
            entry = found.setdefault(rank, {})
            entry["exit_code"] = code
            if e.group(2) is not None:
                entry["pid"] = int(e.group(2))
            if code < 0:
                entry["signal"] = _signal_name(-code)
            rank = None
    # an agent that gave up without its summary (it lost the rendezvous as it went to restart them) names
    # the failed worker in its failure line only, by its local rank counted from its node's first rank
    first = (seen or AgentSeen()).first_rank
    ended = list(_ATTEMPT_FAILED.finditer(text))
    if ended and first is not None:
        f = ended[-1]
        rank, code = first + int(f["local"]), int(f["code"])
        if "exit_code" not in found.get(rank, {}):
            entry = found.setdefault(rank, {})
            entry.update(exit_code=code, pid=int(f["pid"]))
            if code < 0:
                entry["signal"] = _signal_name(-code)
    for r, f in found.items():
        if f.get("exception"):
            f.update(_traceback(said[r], f["exception"]))
    failures = {r: RankFailure(**f) for r, f in found.items()}
    signalled = _agent_signalled(text)
    if signalled:
        failures = {r: replace(f, ended_by_agent=f.pid in signalled) if f.pid is not None else f
                    for r, f in failures.items()}
    for r, why in _watchdog_failures(text).items():
        if r in failures:
            failures[r] = replace(failures[r], nccl_watchdog=why)
    for r, broken in _teardown_aborts(text, failures).items():
        failures[r] = replace(failures[r], broken_collective=broken)
    for r, (said, at_exit) in _own_aborts(text, failures).items():
        failures[r] = replace(failures[r], aborted=said, at_exit=at_exit)
    for r, caught in _caught_timeouts(text, failures).items():
        failures[r] = replace(failures[r], caught_timeout=caught)
    silent = [r for r, f in failures.items() if f.silent]
    unranked = set(_worker_exceptions(text))
    if len(silent) == 1 and len(unranked) == 1:
        failures[silent[0]] = replace(failures[silent[0]], unranked=unranked.pop())
    return failures


#: torchrun's agent on a failed attempt of its workers, once an attempt: the first of them to fail
#: ('failed (exitcode: -9) local_rank: 0 (pid: 703) of binary: ...'); under ``--max-restarts`` it then
#: starts them all again, as long as restarts are left. It names the worker by its local rank, its
#: place on the agent's node, not by its global rank
_ATTEMPT_FAILED = re.compile(r"\bfailed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")


@dataclass(frozen=True)
class AgentSeen:
    """What the harness saw of one torchrun agent beside its log, where the log cannot say it: how
    the agent ended, which of its workers were running when the harness stopped the run, and the
    global ranks its node's workers had."""

    exit_code: int | None = None
    """Its exit status; None where the harness killed it (its stall watch, the timeout) or it is not
    known. An agent that gives up on its workers exits 1 after its summary: one that exits 0 after a
    failure line had started its workers again, and they succeeded."""
    running: frozenset[int] = frozenset()
    """The process ids of its workers the harness found running as it stopped the run (the stacks it
    took, or tried to)."""
    first_rank: int | None = None
    """The global rank of its local rank 0: torchrun gives a node's workers consecutive ranks from
    its node rank times its processes per node. 0 for a launch of one agent; None where not known."""
    node: int | None = None
    """Its node's index in a launch of several nodes; None for a launch of one agent."""
    nproc: int | None = None
    """How many workers it starts in each attempt (its processes per node); None where not known."""


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt of a torchrun agent's workers failed, by its agent's word (``attempt_ends``):
    the process that failed first, and the exception it printed in that attempt."""

    attempt: int
    """Which attempt of the launch's workers: 1 the first, 2 the first restart's. Of a launch of several
    nodes it is the same attempt on every node (their agents meet in one rendezvous round per attempt),
    not the count of its own agent's restarts: an agent whose workers another node's restart stopped
    (``for_peer``) starts them again without counting a restart."""
    local_rank: int | None
    """None of an attempt its agent stopped for another node's restart, of a node of several processes
    (its agent's line names the process id only)."""
    pid: int
    exit_code: int
    """Negative: killed by that signal."""
    exception: str | None = None
    """The last exception that worker printed with its rank's prefix in that attempt ('[rank1]: ...',
    the prefix naming its global rank, ``rank``); None where it printed none, or its global rank is
    not known."""
    restarted: bool = False
    """torchrun started the workers again after it (``_restarted``): an earlier attempt's end, not
    the run's. False also of a record stored before it was read: nothing is then said of it as an
    earlier attempt."""
    rank: int | None = None
    """Its global rank: the agent's summary names it as it gives up ('rank : 1 (local_rank: 0)'), and
    otherwise it is its local rank counted from the first rank of its agent's node (AgentSeen,
    else that summary's). None where nothing says it, and in records stored before it was read
    (whose ``exception`` took the local rank for the global one)."""
    node: int | None = None
    """Of a launch of several nodes, the node whose agent's log says it; None of a launch of one."""
    for_peer: bool = False
    """Its workers did not fail: its agent stopped them (SIGTERM, no failure line) to join the
    rendezvous round that another node's restart opened (torchrun's agent restarts its workers when
    it sees a node waiting), which counts as no restart of this agent's ``--max-restarts``. ``pid`` is
    the first it stopped."""

    @property
    def who(self) -> str:
        """'rank 1 (pid 702)'; of a node of several, 'rank 1 (local rank 0, pid 4888)'; 'local rank 0
        (pid 4888)' where its global rank is not known."""
        if self.rank is None:
            return f"local rank {self.local_rank} (pid {self.pid})" if self.local_rank is not None else f"pid {self.pid}"
        local = f"local rank {self.local_rank}, " if self.node is not None else ""
        return f"rank {self.rank} ({local}pid {self.pid})"

    def cause(self) -> str:
        """'rank 0 (pid 703) was killed by SIGKILL', 'rank 1 (pid 702) failed: RuntimeError: ...'; of an
        attempt stopped for another node's restart, 'its agent stopped rank 0 (...) for another node's
        restart (no restart counted on node 0)'."""
        if self.for_peer:
            others = " and the node's other workers" * (self.local_rank is None)
            return (f"its agent stopped {self.who}{others}, which had not failed, for another node's restart "
                    f"(no restart counted against node {self.node}'s --max-restarts)")
        if self.exception:
            return f"{self.who} failed: {short_exception(self.exception)}"
        if self.exit_code < 0:
            return f"{self.who} was killed by {_signal_name(-self.exit_code)}"
        return f"{self.who} exited with code {self.exit_code}"

    @property
    def own(self) -> bool:
        """Failed in its own right, not on a peer's failure breaking its collective (``_VICTIM``), nor
        stopped for another node's restart."""
        return not (self.for_peer or self.exception and _VICTIM.search(self.exception))

    def text(self) -> str:
        """'attempt 1 ended as rank 1 (pid 702) failed: ...'; of a launch of several nodes, whose agent
        counts it: 'attempt 1 of node 1 ended as rank 1 (local rank 0, pid 4888) failed: ...'."""
        of = f" of node {self.node}" if self.node is not None else ""
        return f"attempt {self.attempt}{of} ended as {self.cause()}"


def attempt_ends(stderr_path: Path, seen: AgentSeen | None = None) -> list[AttemptEnd]:
    """Each attempt of the workers torchrun's log (its stderr, all of it: the attempts are counted
    from its first) shows ended before the next, in order: its agent's failure line ends a failed
    attempt, and the exception the failed worker printed in that attempt is that attempt's; of a
    node of several, its agent's stopping its workers for another node's restart
    (``_peer_stops``) ends an attempt too (``AttemptEnd.for_peer``), so that a node's attempt N is
    every node's round N of the rendezvous. A worker's exception is matched to the attempt it came
    in, never to the run as a whole: of a run restarted after a crash, the last attempt's is not the
    first's. The agent names the worker by its local rank and its pid; its global rank (the rank
    its exception's prefix names) is the summary's where the agent gave up with one, else its local
    rank counted from its node's first rank (``seen``, what the harness saw of the agent; else the
    summary's rank less its local rank: torchrun's c10d rendezvous orders the same agents the same
    way in every round, so a node keeps its node rank across restarts). Where neither says it, no
    exception is taken: another node's rank of the same local rank is not this worker."""
    seen = seen or AgentSeen()
    try:
        with open(stderr_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    parts, rounds = _attempt_parts(text), _rounds(text, seen)
    restarted = _restarted(parts, seen)
    summary = _summary(parts[-1])  # of the attempt whose failure line it follows: none once restarted
    first = seen.first_rank if seen.first_rank is not None else next(
        (rank - local for rank, local in summary.values() if local is not None), None)
    ends: list[AttemptEnd] = []
    for i, (part, stopped) in enumerate(rounds[:-1], start=1):
        later = i < len(rounds) - 1 or restarted  # torchrun started the workers again after it
        if stopped:
            local = 0 if seen.nproc == 1 else None
            rank = first + local if first is not None and local is not None else None
            ends.append(AttemptEnd(i, local, stopped[0], -int(signal.SIGTERM), restarted=True, rank=rank, node=seen.node,
                                   for_peer=True))
            continue
        said: dict[int, str] = {}  # each rank's last exception in the attempt
        for ln in part.splitlines():
            if (m := _RANK_LINE.match(ln)) and _EXC.match(m.group(2)):
                said[int(m.group(1))] = m.group(2).strip()
        f = _ATTEMPT_FAILED.search(part.splitlines()[-1])
        local, pid = int(f["local"]), int(f["pid"])
        rank = summary[pid][0] if pid in summary else first + local if first is not None else None
        ends.append(AttemptEnd(i, local, pid, int(f["code"]), said.get(rank) if rank is not None else None,
                               restarted=later, rank=rank, node=seen.node))
    return ends


def _rounds(text: str, seen: AgentSeen) -> list[tuple[str, tuple[int, ...]]]:
    """``text`` cut where an attempt of the agent's workers ended: after each failure line
    (``_attempt_parts``) and, of a node of several, after each stop of its workers for another
    node's restart (``_peer_stops``, whose process ids come with its part; () with a failed
    part's); the last part is what follows the last (as ``_attempt_parts``'s)."""
    cuts = sorted([(end, ()) for end in _failure_ends(text)] + _peer_stops(text, seen))
    out, start = [], 0
    for end, stopped in cuts:
        out.append((text[start:end], stopped))
        start = end
    return out + [(text[start:], ())]


def _failure_ends(text: str) -> list[int]:
    """Where each failure line of torchrun's agent ends in ``text`` (after its newline)."""
    ends = []
    for m in _ATTEMPT_FAILED.finditer(text):
        end = text.find("\n", m.end())
        ends.append(len(text) if end < 0 else end + 1)
    return ends


def _peer_stops(text: str, seen: AgentSeen) -> list[tuple[int, tuple[int, ...]]]:
    """Of a node of a launch of several, each time its agent stopped its workers although none had
    failed: where in ``text`` that ended, and the process ids it signalled. torchrun's agent, its
    workers healthy, restarts them as soon as it sees another node waiting at the rendezvous (one
    whose workers failed and were restarted by its agent): it signals every worker
    ('Sending process P closing signal SIGTERM', ``_AGENT_SIGNALLED``) and writes no failure line,
    counting no restart. On a failure it signals only the workers still running, fewer than it
    started (the failed one has exited), and writes its failure line next; told to stop itself
    (``_AGENT_TOLD``) it signals them as it ends. So a run of such lines is a stop for another node's
    restart where nothing of the agent's follows it but a failure line of a later attempt (it
    signalled as many workers as it starts, ``AgentSeen.nproc``), another line of its own, or the
    log's end."""
    if seen.node is None:  # a launch of one agent has no other node to restart for
        return []
    out: list[tuple[int, tuple[int, ...]]] = []
    batch: list[int] = []
    batch_end = 0
    pos = 0
    for ln in text.splitlines(keepends=True):
        pos += len(ln)
        msg = _agent_message(ln.rstrip("\n"))
        if msg is None:
            continue
        if _AGENT_TOLD.match(msg):
            return out  # what it signals from here on, it signals as it ends
        if (m := _AGENT_SIGNALLED.match(msg)) is not None:
            if not m.group(1).startswith("Unable"):  # that one repeats a process it signalled already
                batch.append(int(m.group(2)))
            batch_end = pos
            continue
        if batch and (not _ATTEMPT_FAILED.search(msg) or seen.nproc is not None and len(batch) >= seen.nproc):
            out.append((batch_end, tuple(batch)))
        batch = []
    if batch:
        out.append((batch_end, tuple(batch)))
    return out


def _agent_message(line: str) -> str | None:
    """The message of a line of torchrun's own logging (``_LOG_LINE`` from its code, or
    ``_OLD_AGENT_LINE``); None of any other line."""
    if (m := _LOG_LINE.match(line)) is not None:
        return m["msg"] if _LAUNCHER.search(m["path"].replace("\\", "/")) else None
    old = _OLD_AGENT_LINE.match(line)
    return old["msg"] if old is not None else None


def _summary(text: str) -> dict[int, tuple[int, int | None]]:
    """Per process id, its global and local rank, from torchrun's summary in ``text`` (each entry's
    'rank : 1 (local_rank: 0)', then its 'exitcode : 1 (pid: 4888)')."""
    out: dict[int, tuple[int, int | None]] = {}
    rank = None
    for ln in text.splitlines():
        if t := _TR_RANK.match(ln):
            rank = (int(t.group(1)), int(t["local"]) if t["local"] is not None else None)
        elif (e := _TR_EXIT.match(ln)) and rank is not None:
            if e.group(2) is not None:
                out[int(e.group(2))] = rank
            rank = None
    return out


def last_attempt(text: str, seen: AgentSeen | None = None) -> str:
    """The part of a torchrun log that is its last attempt of the workers (under ``--max-restarts``
    the agent starts them again after a failure, into the same log): from after the failure line of
    the attempt before it, to the log's end (torchrun's summary, as it gave up, is of the attempt
    whose failure line it follows). A log of one attempt is all of it. ``seen``: what the harness
    saw of the agent (``_restarted``)."""
    seen = seen or AgentSeen()
    rounds = _rounds(text, seen)
    if len(rounds) == 1:
        return text
    if rounds[-2][1] or _restarted(_attempt_parts(text), seen):  # [-2][1]: stopped for another node's restart
        return rounds[-1][0]
    return rounds[-2][0] + rounds[-1][0]


def _attempt_parts(text: str) -> list[str]:
    """``text`` cut after each failure line of torchrun's agent (``_ATTEMPT_FAILED``): a part per
    failed attempt, each ending in its failure line, then what follows the last (torchrun's summary,
    or an attempt that did not fail by its agent's word: one that succeeded, or one still running
    when the agent was stopped)."""
    parts, start = [], 0
    for end in _failure_ends(text):
        parts.append(text[start:end])
        start = end
    return parts + [text[start:]]


def _restarted(parts: list[str], seen: AgentSeen) -> bool:
    """Whether torchrun started the workers again after the last failed attempt of ``_attempt_parts``:
    no summary of torchrun's (the exit codes it reports as it gives up) follows its failure line, and
    something shows workers ran after it. The agent ends every worker still running before it writes
    its failure line, so a worker after it is a later attempt's: one the agent signals after it (as it
    is stopped itself), or one the harness found running as it stopped the run that the log names
    nowhere up to that line. An earlier failure line shows that this launch restarts its workers, and
    an agent that exits 0 (``seen``) had restarted them: one that gives up exits 1. Otherwise a log
    of one failed attempt and no summary is one whose agent was stopped between its failure line and
    its summary. An agent whose only word after its failure line is its own rendezvous error
    (``_GAVE_UP``: it went to start its workers again and could not rejoin, as where the store's node
    had given up first) started none: the failed attempt was its workers' last."""
    if len(parts) < 2 or any(_TR_EXIT.match(ln) for ln in parts[-1].splitlines()):
        return False
    before = "".join(parts[:-1])
    named = {int(m["pid"]) for m in _ATTEMPT_FAILED.finditer(before)} | _signalled(before)
    if (seen.exit_code != 0 and not _signalled(parts[-1]) and not seen.running - named
            and any(_GAVE_UP.search(ln) for ln in _agent_lines(parts[-1]))):
        return False
    if len(parts) >= 3 or seen.exit_code == 0 or _signalled(parts[-1]):
        return True
    return bool(seen.running - named)


def _traceback(lines: list[str], exception: str) -> dict:
    """Of a rank's own lines (its prefix dropped) that end its traceback in ``exception``: the
    traceback's text (from its first 'Traceback' line, which a chained exception's precede, to that
    exception; its last STDERR_TAIL_LINES lines), and the innermost frame of the last traceback in
    the trainer's own code with its source line (RankFailure)."""
    end = max(i for i, ln in enumerate(lines) if ln.strip() == exception) + 1
    starts = [i for i, ln in enumerate(lines[:end]) if ln.startswith(_TRACEBACK)]
    if not starts:
        return {}
    out: dict = {"traceback": "\n".join(lines[starts[0]:end][-STDERR_TAIL_LINES:])}
    last = lines[starts[-1]:end]
    for i in reversed(range(len(last))):
        m = _TB_FRAME.match(last[i])
        if m is None or _LIBRARY.search(m["file"].replace("\\", "/")):
            continue
        out["raised_at"] = Frame(m["file"], int(m["line"]), m["func"].strip())
        code = last[i + 1] if i + 1 < len(last) else ""
        if code.startswith("    ") and not _TB_FRAME.match(code) and not _CARETS.match(code):
            out["raised_code"] = _without_comment(code.strip())
        break
    return out


def _without_comment(code: str) -> str:
    """A traceback's source line without its trailing comment: the finding quotes what ran (a
    comment's words, 'a hung rank stops the others here', would read as the harness's)."""
    cut = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                cut = tok.start[1]
                break
    except (tokenize.TokenError, SyntaxError):  # a line of a statement that goes on: its tokens so far
        pass
    return code if cut is None else code[:cut].rstrip()


def agent_signalled(stderr_path: Path, max_bytes: int = 1 << 20) -> list[int]:
    """The process ids torchrun's agent says in its log that it signalled (``_agent_signalled``),
    lowest first."""
    text = _read(stderr_path, max_bytes)
    return [] if text is None else sorted(_agent_signalled(text))


def _agent_signalled(text: str) -> set[int]:
    """The process ids torchrun's agent says it signalled (its own log lines, ``_AGENT_SIGNALLED``);
    empty where it signalled none or was itself told to stop (``_AGENT_TOLD``): then any worker's signal
    may have come from where the agent's did."""
    if any(_AGENT_TOLD.match(ln) for ln in _agent_lines(text)):
        return set()
    return _signalled(text)


def _signalled(text: str) -> set[int]:
    """The process ids torchrun's agent says it signalled in ``text``, whether or not it was told to
    stop itself."""
    return {int(m.group(2)) for ln in _agent_lines(text) if (m := _AGENT_SIGNALLED.match(ln))}


def _agent_lines(text: str) -> list[str]:
    """torchrun's agent's own lines (``whose_lines``), and its logging in the formats of torch before
    2.4 (``_OLD_AGENT_LINE``), each as its message."""
    out = []
    for who, ln in whose_lines(text):
        if who == _AGENT:
            out.append(ln)
        elif (old := _OLD_AGENT_LINE.match(ln)) is not None:
            out.append(old["msg"])
    return out


def _watchdog_failures(text: str) -> dict[int, str]:
    """Per rank, the first word of its NCCL watchdog on a collective that a peer failed (``_WATCHDOG``,
    ``_PEER_FAILED``): the line's ``[rankN]:`` prefix names the rank, else the default process group's
    rank in the message (a group's rank is the global one only there). A watchdog's exception of the
    rank's own (a CUDA error) is not taken."""
    out: dict[int, str] = {}
    for ln in text.splitlines():
        m = _RANK_LINE.match(ln)
        line = m.group(2) if m else ln.strip().removeprefix("what():").strip()
        w = _WATCHDOG.search(line)
        if w is None:
            continue
        rank = int(m.group(1)) if m else int(w["rank"]) if w["rank"] is not None else None
        why = re.sub(r"^\[Rank \d+\] ", "", (w["timeout"] or w["why"]).strip())
        if rank is not None and rank not in out and _PEER_FAILED.search(why):
            out[rank] = why.split(". ")[0]
    return out


def _caught_timeouts(text: str, failures: dict[int, RankFailure]) -> dict[int, str]:
    """The ranks that exited non-zero silently (``silent``) after a collective timed out, each with gloo's
    words of it: where the log holds a worker's line of gloo's timeout (``_GLOO_TIMEOUT``, not a
    ``[rankN]:`` exception line: a rank's own print of the error it caught) for each such rank. The log
    does not say whose line is whose: fewer such lines than silent ranks, and none is taken for a caught
    timeout (a silent exit stays a failure of the rank's own)."""
    silent = [r for r, f in failures.items() if f.silent]
    said = [ln for who, ln in whose_lines(text)
            if who != _AGENT and not _RANK_LINE.match(ln) and _GLOO_TIMEOUT.search(ln)]
    if not silent or len(said) < len(silent):
        return {}
    words = short_exception(said[0][_GLOO_TIMEOUT.search(said[0]).start():].strip())
    return {r: words for r in silent}


def _teardown_aborts(text: str, failures: dict[int, RankFailure]) -> dict[int, str]:
    """The ranks killed by SIGABRT with no exception of theirs in the log whose abort was their exit
    after a broken collective, each with the line of that collective's error: those where a worker's
    line of a peer gone (``_PEER_GONE``) comes before the C++ runtime's abort line (``_TERMINATE``), and
    there are as many such abort lines as ranks torchrun saw killed by SIGABRT (each aborting process
    prints its own), so every abort is accounted for. An abort after a peer was already gone is not the
    run's first failure, whatever joinable thread it was (a broken gloo group's, a data loader's at
    shutdown). The log does not say whose line is whose: one abort line fewer, or one before any such
    error (a rank's own abort, which then broke the others' collectives), and none is taken for an exit
    after a broken collective; a rank's abort stays its own failure."""
    aborted = [r for r, f in failures.items() if f.signal == "SIGABRT"]
    if not aborted:
        return {}
    broken, after = None, 0
    for who, ln in whose_lines(text):
        line = m.group(2) if (m := _RANK_LINE.match(ln)) else ln
        if who == _AGENT:
            continue
        if _PEER_GONE.search(line):
            broken = broken or line.strip()[:EXCERPT_CHARS]
        elif _TERMINATE in line:
            if broken is None:
                return {}  # an abort before any peer was gone: a rank's own
            after += 1
    if after < len(aborted):
        return {}
    return {r: broken for r in aborted if not failures[r].exception}


def _own_aborts(text: str, failures: dict[int, RankFailure]) -> dict[int, tuple[str, bool]]:
    """The ranks killed by SIGABRT that aborted themselves, each with the C++ runtime's line and
    whether the interpreter was exiting: those with no exception in the log, no broken collective
    before the abort (``_teardown_aborts``) and no NCCL watchdog's word, where the log holds a worker's
    abort line (``_TERMINATE``) for each (every aborting process prints its own; fewer, and an abort
    may have come from elsewhere: none is taken). At the interpreter's exit where the log's reports of
    the abort (``_FATAL_ABORT``), one at least for each, list no Python frame: the log does not say whose
    report is whose, so all of them must."""
    aborted = [r for r, f in failures.items() if f.signal == "SIGABRT" and not f.exception
               and f.broken_collective is None and f.nccl_watchdog is None]
    if not aborted:
        return {}
    lines = [(m.group(2) if (m := _RANK_LINE.match(ln)) else ln) for who, ln in whose_lines(text) if who != _AGENT]
    if sum(_TERMINATE in ln for ln in lines) < len(aborted):
        return {}
    reports, frames, inside = 0, False, False
    for ln in text.splitlines():
        if ln.strip() == _FATAL_ABORT:
            reports, inside = reports + 1, True
        elif inside and (ln.startswith(_FATAL_END) or _LOG_LINE.match(ln)):
            inside = False
        elif inside and ln.lstrip().startswith('File "'):
            frames = True
    at_exit = reports >= len(aborted) and not frames
    return {r: (_TERMINATE, at_exit) for r in aborted}


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


#: a line of Python's logging in torchrun's (glog-like) format: level, date, time, pid, source path
_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ (?P<path>\S+?):\d+\] (?P<msg>.*)$")
#: torchrun's own code: its entry point, the launcher, the elastic agent and its rendezvous. A worker
#: runs none of it (torchrun starts each worker as a plain `python script.py` or `python -m mod`)
_LAUNCHER = re.compile(r"torch/distributed/(run\.py|launcher/|elastic/(agent|rendezvous)/|elastic/multiprocessing/api\.py)")
#: the banner torchrun's agent prints as it starts its workers
_BANNER = re.compile(r"^\*+$|^Setting OMP_NUM_THREADS")
_AGENT, _WORKER, _UNKNOWN = "agent", "worker", "unknown"


def _frame_file(ln: str) -> str | None:
    m = re.match(r'^\s+File "([^"]*)"', ln)
    return m.group(1).replace("\\", "/") if m else None


def whose_lines(text: str) -> list[tuple[str, str]]:
    """Each line of an agent's log (the harness's own notes, slurmstepd's lines and blank lines left
    out) with whose it is: the agent's (torchrun's logging from its own code, its banner, a
    traceback through its code or of one of its own exceptions, and that exception's message lines
    after it), a worker's
    (a ``[rankN]:`` line, a traceback through no code of torchrun's, logging from elsewhere), or
    unknown (a plain line: a worker's print or warning, or an agent that died before torchrun's
    code ran)."""
    lines = text.splitlines()
    out: list[tuple[str, str]] = []
    i, owner_after = 0, _UNKNOWN  # whose the plain lines after a traceback's exception line are
    while i < len(lines):
        ln = lines[i]
        if not ln.strip() or ln.startswith(_HARNESS_NOTE) or _SLURMSTEPD.match(ln):
            i += 1
            continue
        if _RANK_LINE.match(ln):
            out.append((_WORKER, ln))
            i += 1
            continue
        if ln.startswith(_TRACEBACK):
            j, files = i + 1, []
            while j < len(lines) and (not lines[j] or lines[j][0].isspace()):
                if (f := _frame_file(lines[j])) is not None:
                    files.append(f)
                j += 1
            exc = lines[j] if j < len(lines) else ""
            agent = any(_LAUNCHER.search(f) for f in files) or exc.startswith("torch.distributed.elastic.")
            owner = _AGENT if agent else _WORKER
            out += [(owner, x) for x in lines[i:j + 1] if x.strip()]
            owner_after = owner if agent else _UNKNOWN
            i = j + 1
            continue
        m = _LOG_LINE.match(ln)
        if m:
            out.append((_AGENT if _LAUNCHER.search(m["path"].replace("\\", "/")) else _WORKER, m["msg"]))
            owner_after = _UNKNOWN
        elif _BANNER.match(ln.strip()):
            out.append((_AGENT, ln))
        else:
            out.append((owner_after, ln))
        i += 1
    return out


def agent_said(stderr_path: Path, workers_ran: bool = False, max_bytes: int = 1 << 20, *,
               seen: AgentSeen | None = None) -> str | None:
    """The last error the agent itself reported (its exception, e.g. torchrun's
    ``...RendezvousTimeoutError``), else its own last line (``whose_lines``); never a worker's
    (a ``[rankN]:`` line, a worker's traceback printed before its process group, a worker's
    logging). Where no worker ran (``workers_ran`` False: none was seen under this agent) and the
    agent wrote nothing recognisably its own, the log's last line (an agent that died before
    torchrun's own code ran says why there); None for an empty log. Of its last attempt
    (``last_attempt``, ``seen``): an agent that started its workers again after a failure line and
    said nothing since said nothing of how the run ended."""
    text = _read(stderr_path, max_bytes)
    if text is None:
        return None
    text = last_attempt(text, seen)
    lines = whose_lines(text)
    own = [ln.strip() for who, ln in lines if who == _AGENT]
    if not own and not workers_ran and not any(who == _WORKER for who, _ in lines):
        own = [ln.strip() for who, ln in lines if who == _UNKNOWN]
    errors = [ln for ln in own if _EXC.match(ln)]
    return (errors or own or [None])[-1]


def worker_said(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None) -> str | None:
    """The exception of the last traceback in an agent's log that is a worker's and names no rank
    (no ``[rankN]:`` prefix: printed before the worker's process group, or by a handler of its own),
    of its last attempt (``last_attempt``, ``seen``); None where there is none. Whose it is, the log
    does not say."""
    text = _read(stderr_path, max_bytes)
    return None if text is None else next(reversed(_worker_exceptions(last_attempt(text, seen))), None)


def _worker_exceptions(text: str) -> list[str]:
    """The exception of each worker traceback in a log that names no rank, in order."""
    lines = [ln for who, ln in whose_lines(text) if who == _WORKER and not _RANK_LINE.match(ln)]
    raised = [next((x.strip() for x in lines[i + 1:] if x and not x[0].isspace()), None)
              for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)]
    return [e for e in raised if e]


def log_exception(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None) -> str | None:
    """``last_exception`` of a whole log (its last ``max_bytes``; of its last attempt, ``last_attempt``):
    a rank's traceback printed before its process group (no [rankN] prefix to attribute it by) lies far
    above torchrun's own."""
    text = _read(stderr_path, max_bytes)
    return None if text is None else last_exception(last_attempt(text, seen))


def log_has_traceback(stderr_path: Path, max_bytes: int = 1 << 20, *,
                      seen: AgentSeen | None = None) -> bool | None:
    """``has_traceback`` of a whole log (its last ``max_bytes``; of its last attempt, ``last_attempt``);
    None when it cannot be read."""
    text = _read(stderr_path, max_bytes)
    return None if text is None else has_traceback(last_attempt(text, seen))


def has_traceback(text: str) -> bool:
    """Whether ``text`` holds a Python traceback of the trainer's own (torchrun's report that a
    worker failed is none): a trainer that ends on a one-line error of its own prints none."""
    return bool(_raised(_unprefixed(text)))


def _unprefixed(text: str) -> list[str]:
    """The lines of a log, each without its '[rankN]: ' prefix."""
    return [m.group(2) if (m := _RANK_LINE.match(ln)) else ln for ln in text.splitlines()]


def _raised(lines: list[str]) -> list[str]:
    """The exception line of each Python traceback in ``lines`` but torchrun's ChildFailedError, in order."""
    raised = [next((ln.strip() for ln in lines[i + 1:] if ln and not ln[0].isspace()), None)
              for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)]
    return [e for e in raised if e and _CHILD_FAILED not in e.split(":")[0]]


def last_exception(text: str) -> str | None:
    """The exception of the last Python traceback in ``text`` ('pkg.Error: message', a '[rankN]: '
    prefix dropped) other than torchrun's report that a worker failed (ChildFailedError), else the
    last line that looks like an error (``_ERROR_LINE``, ``_SAID_ERROR``); None when there is neither."""
    lines = _unprefixed(text)
    own = _raised(lines)
    if own:
        return own[-1]
    for ln in reversed(lines):
        if _ERROR_LINE.match(ln) and _CHILD_FAILED not in ln:
            return ln.strip()
        if said := _SAID_ERROR.match(ln):
            return said["said"].strip()
    return None


def _read(path: Path, max_bytes: int) -> str | None:
    """The last ``max_bytes`` of a log as text; None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def gave_up(said: str | None) -> str | None:
    """The rendezvous error an agent's last word (``agent_said``) names when it gave up on the
    rendezvous ('RendezvousTimeoutError'), else None."""
    m = _GAVE_UP.search(said or "")
    return m.group(0) if m else None


def closed_rendezvous(said: str | None) -> bool:
    """The agent whose last word this is gave up on a rendezvous that no rank can start from any
    more (``_CLOSED``): it waited its join timeout for the others, or found it closed."""
    return bool(_CLOSED.search(said or ""))
