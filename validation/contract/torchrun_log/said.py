"""What a whole torchrun log says of its last attempt, read from the file: its agent's last
word (``agent_said``) and whether that gave up on the rendezvous (``gave_up``,
``closed_rendezvous``), a worker's exception that names no rank (``worker_said``), the log's last
exception and whether it holds a traceback, and the processes the agent signalled."""
from __future__ import annotations

import re
from pathlib import Path

from validation.contract.torchrun_log.attempts import AgentSeen, last_attempt
from validation.contract.torchrun_log.exceptions import has_traceback, last_exception
from validation.contract.torchrun_log.patterns import AGENT_STOPPED, EXC, GAVE_UP, read_tail
from validation.contract.torchrun_log.whose import (AGENT, UNKNOWN, WORKER, agent_signalled_in, whose_lines,
                                                    worker_exceptions)

#: of those (``GAVE_UP``), the ones after which no rank can start under any agent of the rendezvous:
#: the agent waited in it (or found it closed) and, exiting on an error that is no signal, torchrun's
#: launch_agent shuts its rendezvous handler down, which closes the rendezvous for good; an agent
#: still in it sees that at its next sync (RendezvousClosedError, or RendezvousConnectionError
#: once the store went with the agent that held it, about a second after). A connection
#: error alone may be the agent's own (it never reached the store): the others are not told.
_CLOSED = re.compile(r"RendezvousTimeoutError|RendezvousClosedError")


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
    text = read_tail(stderr_path, max_bytes)
    if text is None:
        return None
    text = last_attempt(text, seen)
    lines = whose_lines(text)
    own = [ln.strip() for who, ln in lines if who == AGENT]
    if not own and not workers_ran and not any(who == WORKER for who, _ in lines):
        own = [ln.strip() for who, ln in lines if who == UNKNOWN]
    errors = [ln for ln in own if EXC.match(ln)]
    return (errors or own or [None])[-1]


def worker_said(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None) -> str | None:
    """The exception of the last traceback in an agent's log that is a worker's and names no rank
    (no ``[rankN]:`` prefix: printed before the worker's process group, or by a handler of its own),
    of its last attempt (``last_attempt``, ``seen``); None where there is none. Whose it is, the log
    does not say."""
    text = read_tail(stderr_path, max_bytes)
    return None if text is None else next(reversed(worker_exceptions(last_attempt(text, seen))), None)


def agent_signalled(stderr_path: Path, max_bytes: int = 1 << 20) -> list[int]:
    """The process ids torchrun's agent says in its log that it signalled (``agent_signalled_in``),
    lowest first."""
    text = read_tail(stderr_path, max_bytes)
    return [] if text is None else sorted(agent_signalled_in(text))


def log_exception(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None) -> str | None:
    """``last_exception`` of a whole log (its last ``max_bytes``; of its last attempt, ``last_attempt``):
    a rank's traceback printed before its process group (no [rankN] prefix to attribute it by) lies far
    above torchrun's own."""
    text = read_tail(stderr_path, max_bytes)
    return None if text is None else last_exception(last_attempt(text, seen))


def log_has_traceback(stderr_path: Path, max_bytes: int = 1 << 20, *,
                      seen: AgentSeen | None = None) -> bool | None:
    """``has_traceback`` of a whole log (its last ``max_bytes``; of its last attempt, ``last_attempt``);
    None when it cannot be read."""
    text = read_tail(stderr_path, max_bytes)
    return None if text is None else has_traceback(last_attempt(text, seen))


def agent_stopped(exception: str | None) -> int | None:
    """The signal that told torchrun's agent to stop (SIGTERM, SIGINT), where ``exception`` (a log's last,
    ``log_exception``) is the one the agent raises for it; else None."""
    m = AGENT_STOPPED.search(exception or "")
    return int(m.group(1)) if m else None


def gave_up(said: str | None) -> str | None:
    """The rendezvous error an agent's last word (``agent_said``) names when it gave up on the
    rendezvous ('RendezvousTimeoutError'), else None."""
    m = GAVE_UP.search(said or "")
    return m.group(0) if m else None


def closed_rendezvous(said: str | None) -> bool:
    """The agent whose last word this is gave up on a rendezvous that no rank can start from any
    more (``_CLOSED``): it waited its join timeout for the others, or found it closed."""
    return bool(_CLOSED.search(said or ""))
