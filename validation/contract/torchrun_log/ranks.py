"""How each rank of a torchrun launch ended (``rank_failures``): torchrun's summary, each rank's
exception and traceback, and, where a rank left no exception, what else the log shows of its end:
the agent's signal, its NCCL watchdog's word, a collective broken or timed out before it exited,
the C++ runtime's abort."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from validation.contract.torchrun_log.attempts import AgentSeen, last_attempt
from validation.contract.stacks import Frame, collective_of, main_thread_frames, parse_faulthandler
from validation.contract.torchrun_log.exceptions import own_frame, short_exception, traceback_of
from validation.contract.torchrun_log.failure import RankFailure
from validation.contract.torchrun_log.patterns import (ATTEMPT_FAILED, EXC, GLOO_TIMEOUT, LOG_LINE, MISMATCH, RANK_LINE,
                                                       TR_EXIT, TR_RANK, read_tail, signal_name)
from validation.contract.torchrun_log.whose import AGENT, agent_signalled_in, whose_lines, worker_exceptions
from validation.excerpt import EXCERPT_CHARS

#: a line a worker printed of its collective broken by a peer (a caught error, in the trainer's own words
#: around gloo's or NCCL's): stricter than ``VICTIM``, which reads a known exception, not any line
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
#: where gloo's enforce says it failed, before its words: '[enforce fail at ../gloo/transport/tcp/pair.cc:456] '
_ENFORCE_AT = re.compile(r"^.*?\[enforce fail at [^\]]*\]\s*")
#: of torch's check under TORCH_DISTRIBUTED_DEBUG=DETAIL: each rank's collective as it names it ('Rank 0 is running
#: collective: CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, TensorShape=[4], ...)'), and how they differ
_FINGERPRINT = re.compile(r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                          r"OpType=(?P<op>\w+)(?:, TensorShape=\[(?P<shape>[^\]]*)\])?")
_DIFFER = re.compile(r"Collectives differ in the following aspects:\s*(?P<how>.+)$")


def rank_failures(stderr_path: Path, max_bytes: int = 1 << 20, *, seen: AgentSeen | None = None
                  ) -> dict[int, RankFailure]:
    """Per rank: the exception its traceback ended with (an uncaught exception's lines carry
    ``[rankN]:``, from the sys.excepthook that torch.distributed installs with its process group;
    they are often far above the tail) and the exit code torchrun reported for it (negative:
    killed by that signal). Of the log's last attempt only (``last_attempt``, with what the harness
    ``seen`` of the agent): under ``--max-restarts`` an earlier attempt's exception is not how the
    run's ranks ended."""
    text = read_tail(stderr_path, max_bytes)
    if text is None:
        return {}
    text = last_attempt(text, seen)
    found: dict[int, dict] = {}
    said: dict[int, list[str]] = {}  # each rank's own lines, its prefix dropped
    rank = None
    for ln in text.splitlines():
        m = RANK_LINE.match(ln)
        if m:
            said.setdefault(int(m.group(1)), []).append(m.group(2))
        if m and EXC.match(m.group(2)):
            found.setdefault(int(m.group(1)), {})["exception"] = m.group(2).strip()
        t = TR_RANK.match(ln)
        if t:
            rank = int(t.group(1))
        e = TR_EXIT.match(ln)
        if e and rank is not None:
            code = int(e.group(1))
            entry = found.setdefault(rank, {})
            entry["exit_code"] = code
            if e.group(2) is not None:
                entry["pid"] = int(e.group(2))
            if code < 0:
                entry["signal"] = signal_name(-code)
            rank = None
    # an agent that gave up without its summary (it lost the rendezvous as it went to restart them) names
    # the failed worker in its failure line only, by its local rank counted from its node's first rank
    first = (seen or AgentSeen()).first_rank
    ended = list(ATTEMPT_FAILED.finditer(text))
    if ended and first is not None:
        f = ended[-1]
        rank, code = first + int(f["local"]), int(f["code"])
        if "exit_code" not in found.get(rank, {}):
            entry = found.setdefault(rank, {})
            entry.update(exit_code=code, pid=int(f["pid"]))
            if code < 0:
                entry["signal"] = signal_name(-code)
    for r, f in found.items():
        if f.get("exception"):
            f.update(traceback_of(said[r], f["exception"]))
            if MISMATCH.search(f["exception"]):
                f["mismatch"] = _checked(f["exception"])
    failures = {r: RankFailure(**f) for r, f in found.items()}
    signalled = agent_signalled_in(text)
    if signalled:
        failures = {r: replace(f, ended_by_agent=f.pid in signalled) if f.pid is not None else f
                    for r, f in failures.items()}
    for r, why in _watchdog_failures(text).items():
        if r in failures:
            failures[r] = replace(failures[r], nccl_watchdog=why)
    for r, found_so in _mismatch_aborts(text, failures).items():
        failures[r] = replace(failures[r], **found_so)
    for r, broken in _teardown_aborts(text, failures).items():
        failures[r] = replace(failures[r], broken_collective=broken)
    for r, (said, at_exit) in _own_aborts(text, failures).items():
        failures[r] = replace(failures[r], aborted=said, at_exit=at_exit)
    for r, caught in _caught_timeouts(text, failures).items():
        failures[r] = replace(failures[r], caught_timeout=caught)
    silent = [r for r, f in failures.items() if f.silent]
    raised = worker_exceptions(text)
    if len(silent) == 1 and len(set(raised)) == 1:
        failures[silent[0]] = replace(failures[silent[0]], unranked=raised[0], unranked_count=len(raised))
    return failures


def _watchdog_failures(text: str) -> dict[int, str]:
    """Per rank, the first word of its NCCL watchdog on a collective that a peer failed (``_WATCHDOG``,
    ``_PEER_FAILED``): the line's ``[rankN]:`` prefix names the rank, else the default process group's
    rank in the message (a group's rank is the global one only there). A watchdog's exception of the
    rank's own (a CUDA error) is not taken."""
    out: dict[int, str] = {}
    for ln in text.splitlines():
        m = RANK_LINE.match(ln)
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
    words of it: where the log holds a worker's line of gloo's timeout (``GLOO_TIMEOUT``, not a
    ``[rankN]:`` exception line: a rank's own print of the error it caught) for each such rank. The log
    does not say whose line is whose: fewer such lines than silent ranks, and none is taken for a caught
    timeout (a silent exit stays a failure of the rank's own)."""
    silent = [r for r, f in failures.items() if f.silent]
    said = [ln for who, ln in whose_lines(text)
            if who != AGENT and not RANK_LINE.match(ln) and GLOO_TIMEOUT.search(ln)]
    if not silent or len(said) < len(silent):
        return {}
    words = short_exception(said[0][GLOO_TIMEOUT.search(said[0]).start():].strip())
    return {r: words for r in silent}


def _checked(exception: str) -> str:
    """torch's exception of a mismatch it detected (TORCH_DISTRIBUTED_DEBUG=DETAIL) in short: 'Detected mismatch
    between collectives on ranks: rank 0 ALLREDUCE [4], rank 1 ALLREDUCE [7]; they differ in Tensor Tensor
    shapes: 4vs 7' (its own words of how, spaces closed up)."""
    ran = [f"rank {m['rank']} {m['op']}" + (f" [{m['shape']}]" if m["shape"] is not None else "")
           for m in _FINGERPRINT.finditer(exception)]
    if not ran:
        return short_exception(exception)
    how = _DIFFER.search(exception)
    return (f"{MISMATCH.search(exception).group(0)} on ranks: {', '.join(ran)}"
            + (f"; they differ in {' '.join(how['how'].split())}" if how else ""))[:EXCERPT_CHARS]


def _mismatch_aborts(text: str, failures: dict[int, RankFailure]) -> dict[int, dict]:
    """The ranks killed by SIGABRT with no exception of theirs in the log that gloo's check of a
    collective's size aborted (``MISMATCH`` in a worker's line that names no rank: the C++ runtime's
    'what():' of the exception gloo's own thread threw, which nothing catches), each with the check's
    words; and where there is one such rank and the log one report of an abort (``_abort_reports``),
    the collective it was in and the trainer's frame that called it (RankFailure.raised_at). The log
    does not say whose line is whose: fewer such lines than such ranks, and none is taken (an abort
    may have come from elsewhere)."""
    aborted = [r for r, f in failures.items() if f.signal == "SIGABRT" and not f.exception]
    said = [ln for who, ln in whose_lines(text) if who != AGENT and not RANK_LINE.match(ln) and MISMATCH.search(ln)]
    if not aborted or len(said) < len(aborted):
        return {}
    line = said[0].strip()
    words = _ENFORCE_AT.sub("", line[:MISMATCH.search(line).end()])[:EXCERPT_CHARS]
    out: dict[int, dict] = {r: {"mismatch": words} for r in aborted}
    reports = _abort_reports(text)
    if len(aborted) == 1 and len(reports) == 1 and reports[0]:
        out[aborted[0]].update(raised_at=own_frame(reports[0]), collective=collective_of(reports[0]))
    return out


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
        line = m.group(2) if (m := RANK_LINE.match(ln)) else ln
        if who == AGENT:
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
    lines = [(m.group(2) if (m := RANK_LINE.match(ln)) else ln) for who, ln in whose_lines(text) if who != AGENT]
    if sum(_TERMINATE in ln for ln in lines) < len(aborted):
        return {}
    reports = _abort_reports(text)
    at_exit = len(reports) >= len(aborted) and not any(reports)
    return {r: (_TERMINATE, at_exit) for r in aborted}


def _abort_reports(text: str) -> list[list[Frame]]:
    """Python's reports of an abort in the log (``_FATAL_ABORT`` up to ``_FATAL_END`` or torchrun's next
    log line), in order, each as the frames of its thread that ran the trainer's code, most recent first
    (``main_thread_frames``; [] where it lists no Python frame). The log does not say whose is whose."""
    blocks: list[list[str]] = []
    inside = False
    for ln in text.splitlines():
        if ln.strip() == _FATAL_ABORT:
            blocks.append([])
            inside = True
        elif inside and (ln.startswith(_FATAL_END) or LOG_LINE.match(ln)):
            inside = False
        elif inside:
            blocks[-1].append(ln)
    return [main_thread_frames(parse_faulthandler("\n".join(b))) for b in blocks]
