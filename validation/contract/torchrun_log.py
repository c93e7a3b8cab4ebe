"""How each rank of a torchrun launch ended, and what its agent itself last said, read from
torchrun's own log (its stderr)."""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

_RANK_LINE = re.compile(r"^\[rank(\d+)\]: (.*)$")
_TR_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank")
_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Fault|Interrupt|Failure)\b")
_TR_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+)")
#: the harness's own notes in a log (validation/launch/process.py)
_HARNESS_NOTE = "[nsa-validate]"
#: torchrun's agent gave up on its rendezvous: the others never came within its join timeout
#: (RendezvousTimeoutError), one that gave up had closed it (RendezvousClosedError), or the store
#: host never answered or went away (RendezvousConnectionError, DistNetworkError)
_GAVE_UP = re.compile(r"RendezvousTimeoutError|RendezvousConnectionError|DistNetworkError|RendezvousClosedError")
#: of those, the ones after which no rank can start under any agent of the rendezvous: the agent
#: waited in it (or found it closed) and, exiting on an error that is no signal, torchrun's
#: launch_agent shuts its rendezvous handler down, which closes the rendezvous for good; an agent
#: still in it sees that at its next sync (RendezvousClosedError, or RendezvousConnectionError
#: once the store went with the agent that held it: 1.0 s after, measured here). A connection
#: error alone may be the agent's own (it never reached the store): the others are not told.
_CLOSED = re.compile(r"RendezvousTimeoutError|RendezvousClosedError")
#: torchrun's own report that a worker failed (its agent's traceback, last in its log): it says
#: nothing of why
_CHILD_FAILED = "ChildFailedError"
_TRACEBACK = "Traceback (most recent call last):"
#: a line that looks like an error where no traceback says one
_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception|Interrupt)|RuntimeError|AssertionError)\b.*")
#: a rank's exception that is a peer's failure breaking its collective, not its own
_VICTIM = re.compile(r"Connection closed by peer|remote worker|Connection reset|DistBackendError|NCCL|"
                     r"ProcessGroup|Broken pipe|Timed out waiting", re.IGNORECASE)


@dataclass(frozen=True)
class RankFailure:
    """How one rank ended, from torchrun's log."""

    exception: str | None = None
    signal: str | None = None
    exit_code: int | None = None

    @property
    def own(self) -> bool:
        """Failed in its own right: killed by a signal other than torchrun's SIGTERM, or an
        exception that is not a peer's collective breaking under it."""
        if self.exception:
            return not _VICTIM.search(self.exception)
        return bool(self.signal) and self.signal != "SIGTERM"


def root_rank(failures: dict[int, RankFailure]) -> int | None:
    """The lowest rank that failed in its own right (RankFailure.own), else None."""
    return next((rank for rank, f in sorted(failures.items()) if f.own), None)


def rank_failures(stderr_path: Path, max_bytes: int = 1 << 20) -> dict[int, RankFailure]:
    """Per rank: the exception its traceback ended with (an uncaught exception's lines carry
    ``[rankN]:``, from the sys.excepthook that torch.distributed installs with its process group;
    they are often far above the tail) and the exit code torchrun reported for it (negative:
    killed by that signal)."""
    text = _read(stderr_path, max_bytes)
    if text is None:
        return {}
    found: dict[int, dict] = {}
    rank = None
    for ln in text.splitlines():
        m = _RANK_LINE.match(ln)
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
            if code < 0:
                entry["signal"] = _signal_name(-code)
            rank = None
    return {r: RankFailure(**f) for r, f in found.items()}


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def agent_said(stderr_path: Path, max_bytes: int = 1 << 20) -> str | None:
    """The last error the agent itself reported (its exception, e.g. torchrun's
    ``...RendezvousTimeoutError``, not a worker's ``[rankN]:`` line), else the log's last line
    (an agent that died before torchrun's own code ran says why there); None for an empty log."""
    text = _read(stderr_path, max_bytes)
    if text is None:
        return None
    lines = text.splitlines()
    own = [ln.strip() for ln in lines if ln.strip() and not _RANK_LINE.match(ln) and not ln.startswith(_HARNESS_NOTE)]
    errors = [ln for ln in own if _EXC.match(ln)]
    return (errors or own or [None])[-1]


def log_exception(stderr_path: Path, max_bytes: int = 1 << 20) -> str | None:
    """``last_exception`` of a whole log (its last ``max_bytes``): a rank's traceback printed before
    its process group (no [rankN] prefix to attribute it by) lies far above torchrun's own."""
    text = _read(stderr_path, max_bytes)
    return None if text is None else last_exception(text)


def last_exception(text: str) -> str | None:
    """The exception of the last Python traceback in ``text`` ('pkg.Error: message', a '[rankN]: '
    prefix dropped) other than torchrun's report that a worker failed (ChildFailedError), else the
    last line that looks like an error; None when there is neither."""
    lines = [m.group(2) if (m := _RANK_LINE.match(ln)) else ln for ln in text.splitlines()]
    raised = [next((ln.strip() for ln in lines[i + 1:] if ln and not ln[0].isspace()), None)
              for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)]
    own = [e for e in raised if e and _CHILD_FAILED not in e.split(":")[0]]
    if own:
        return own[-1]
    return next((ln.strip() for ln in reversed(lines) if _ERROR_LINE.match(ln) and _CHILD_FAILED not in ln), None)


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


def short_exception(text: str) -> str:
    """A rank's exception without gloo's source path: 'RuntimeError: Connection closed by peer [..]:1686'."""
    m = re.match(r"^(?P<name>[\w.]+): (\[[^\]]*\] )?(?P<msg>.*)$", text)
    if m is None:
        return text[:160]
    return f"{m['name'].split('.')[-1]}: {m['msg'].split('. ')[0][:160]}"
