"""Whose each line of a torchrun log is: its agent's (torchrun's own logging, banner and
tracebacks) or a worker's; the agent's own lines, and the processes it says it signalled; the
exceptions of the workers' tracebacks that name no rank."""
from __future__ import annotations

import re

from validation.contract.torchrun_log.exceptions import exception_line, raised_in
from validation.contract.torchrun_log.patterns import AGENT_SIGNALLED, AGENT_TOLD, LOG_LINE, RANK_LINE, TRACEBACK

#: a line of torchrun's own logging in the formats of torch before 2.4, which whose_lines does not read
#: ('WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 59460 closing signal SIGTERM',
#: '[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 270
#: closing signal SIGTERM'): the module named is torchrun's, so the line is its agent's
_OLD_AGENT_LINE = re.compile(r"^(?:[A-Z]+:|\[[^\]]*\] )torch\.distributed\.elastic\.[\w.]+:"
                             r"(?: \[[A-Z]+\])? ?(?P<msg>.*)$")
#: the harness's own notes in a log (validation/launch/process.py)
_HARNESS_NOTE = "[nsa-validate]"
#: Slurm's step daemon writing into a task's stderr ('slurmstepd-vmn0: error: *** STEP 7.1 ON vmn0
#: CANCELLED AT ... ***', 'slurmstepd: error: ...'): neither the agent's word nor a worker's
_SLURMSTEPD = re.compile(r"^slurmstepd(-\S+)?: ")
#: torchrun's own code: its entry point, the launcher, the elastic agent and its rendezvous. A worker
#: runs none of it (torchrun starts each worker as a plain `python script.py` or `python -m mod`)
_LAUNCHER = re.compile(r"torch/distributed/(run\.py|launcher/|elastic/(agent|rendezvous)/|elastic/multiprocessing/api\.py)")
#: the banner torchrun's agent prints as it starts its workers
_BANNER = re.compile(r"^\*+$|^Setting OMP_NUM_THREADS")
AGENT, WORKER, UNKNOWN = "agent", "worker", "unknown"


def _frame_file(ln: str) -> str | None:
    m = re.match(r'^\s+File "([^"]*)"', ln)
    return m.group(1).replace("\\", "/") if m else None


def _traceback_end(lines: list[str], start: int) -> int:
    """The index after the traceback whose header is ``lines[start]``: its indented lines and its
    exception's line. Workers that print a traceback at the same moment interleave their lines (two
    ranks failing one import alike): a header met before the exception's line opens one more
    traceback in the same block, which then ends after as many exception lines. A line of torchrun's
    logging, a rank's or the harness's ends it where a traceback was cut short (its process killed)."""
    j, heads, ends = start + 1, 1, 0
    while j < len(lines) and ends < heads:
        x = lines[j]
        if LOG_LINE.match(x) or RANK_LINE.match(x) or x.startswith(_HARNESS_NOTE):
            break
        if x.startswith(TRACEBACK):
            heads += 1
        elif exception_line(x):
            ends += 1
        j += 1
    return j


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
    i, owner_after = 0, UNKNOWN  # whose the plain lines after a traceback's exception line are
    while i < len(lines):
        ln = lines[i]
        if not ln.strip() or ln.startswith(_HARNESS_NOTE) or _SLURMSTEPD.match(ln):
            i += 1
            continue
        if RANK_LINE.match(ln):
            out.append((WORKER, ln))
            i += 1
            continue
        if ln.startswith(TRACEBACK):
            j = _traceback_end(lines, i)
            block = lines[i:j]
            files = [f for x in block if (f := _frame_file(x)) is not None]
            agent = (any(_LAUNCHER.search(f) for f in files)
                     or any(x.startswith("torch.distributed.elastic.") for x in block))
            owner = AGENT if agent else WORKER
            out += [(owner, x) for x in block if x.strip()]
            owner_after = owner if agent else UNKNOWN
            i = j
            continue
        m = LOG_LINE.match(ln)
        if m:
            out.append((AGENT if _LAUNCHER.search(m["path"].replace("\\", "/")) else WORKER, m["msg"]))
            owner_after = UNKNOWN
        elif _BANNER.match(ln.strip()):
            out.append((AGENT, ln))
        else:
            out.append((owner_after, ln))
        i += 1
    return out


def agent_lines(text: str) -> list[str]:
    """torchrun's agent's own lines (``whose_lines``), and its logging in the formats of torch before
    2.4 (``_OLD_AGENT_LINE``), each as its message."""
    out = []
    for who, ln in whose_lines(text):
        if who == AGENT:
            out.append(ln)
        elif (old := _OLD_AGENT_LINE.match(ln)) is not None:
            out.append(old["msg"])
    return out


def agent_message(line: str) -> str | None:
    """The message of a line of torchrun's own logging (``LOG_LINE`` from its code, or
    ``_OLD_AGENT_LINE``); None of any other line."""
    if (m := LOG_LINE.match(line)) is not None:
        return m["msg"] if _LAUNCHER.search(m["path"].replace("\\", "/")) else None
    old = _OLD_AGENT_LINE.match(line)
    return old["msg"] if old is not None else None


def signalled_in(text: str) -> set[int]:
    """The process ids torchrun's agent says it signalled in ``text``, whether or not it was told to
    stop itself."""
    return {int(m.group(2)) for ln in agent_lines(text) if (m := AGENT_SIGNALLED.match(ln))}


def agent_signalled_in(text: str) -> set[int]:
    """The process ids torchrun's agent says it signalled (its own log lines, ``AGENT_SIGNALLED``);
    empty where it signalled none or was itself told to stop (``AGENT_TOLD``): then any worker's signal
    may have come from where the agent's did."""
    if any(AGENT_TOLD.match(ln) for ln in agent_lines(text)):
        return set()
    return signalled_in(text)


def worker_exceptions(text: str) -> list[str]:
    """The exception of each worker traceback in a log that names no rank, in order."""
    return raised_in([ln for who, ln in whose_lines(text) if who == WORKER and not RANK_LINE.match(ln)])
