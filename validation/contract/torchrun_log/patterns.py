"""What the lines of torchrun's log (its stderr) look like, where more than one module of the
package reads them: a rank's own prefixed line, an exception's, torchrun's summary as it gives up,
its agent's failure lines, signals and logging, gloo's timeout and a peer's failure in a rank's
exception; and the two readings every module shares: a log's tail, and the signal a negative exit
code names."""
from __future__ import annotations

import re
import signal
from pathlib import Path

#: a line a rank wrote with its prefix: Python's '[rank1]: Traceback ...' (the excepthook torch.distributed
#: installs), C++ logging's '[rank1]:[E1128 04:58:52.554 ProcessGroupNCCL.cpp:689] ...' (no space)
RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
#: a rank's entry in torchrun's summary as it gives up ('  rank      : 1 (local_rank: 0)'): its global rank
#: and its local one, on its agent's node
TR_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank(?:: (?P<local>\d+))?")
EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Fault|Interrupt|Failure)\b")
TR_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+)(?: \(pid: (\d+)\))?")
#: torchrun's agent signalling a worker still running, once one had failed (or it was told to stop):
#: 'Sending process 4149 closing signal SIGTERM' (workers it started as subprocesses), 'Closing process
#: 4149 via signal SIGTERM' (as multiprocessing's), 'Unable to shutdown process 4149 via Signals.SIGTERM,
#: forcefully exiting via Signals.SIGKILL' (one that outlived its SIGTERM)
AGENT_SIGNALLED = re.compile(r"^(Sending process|Closing process|Unable to shutdown process) (\d+) "
                             r"(closing signal|via)")
#: torchrun's agent itself told to stop (SIGTERM, SIGINT): it signals its workers as it goes, and any of
#: them may have had the signal from where the agent did
AGENT_TOLD = re.compile(r"^Received \S+ death signal, shutting down workers")
#: the exception torchrun's agent raises once a signal told it to stop, having ended its workers: 'torch.
#: distributed.elastic.multiprocessing.api.SignalException: Process 5253 got signal: 15'
AGENT_STOPPED = re.compile(r"\bSignalException: Process \d+ got signal: (\d+)")
#: torchrun's agent gave up on its rendezvous: the others never came within its join timeout
#: (RendezvousTimeoutError), one that gave up had closed it (RendezvousClosedError), or the store
#: host never answered or went away (RendezvousConnectionError, DistNetworkError)
GAVE_UP = re.compile(r"RendezvousTimeoutError|RendezvousConnectionError|DistNetworkError|RendezvousClosedError")
TRACEBACK = "Traceback (most recent call last):"
#: a rank's exception that is a peer's failure breaking its collective, not its own
VICTIM = re.compile(r"Connection closed by peer|remote worker|Connection reset|DistBackendError|NCCL|"
                    r"ProcessGroup|Broken pipe|Timed out waiting", re.IGNORECASE)
#: of a rank's error of a peer gone under its collective, the words of a peer whose own process closed their
#: connection: gloo's read met an orderly close ('[../gloo/transport/tcp/pair.cc:553] Connection closed by peer
#: [127.0.0.1]:20401'), which the peer's process makes as it destroys its process group or ends, and a network
#: failing between them never does
PEER_CLOSED = re.compile(r"Connection closed by peer")
#: of a rank's error of a peer gone under its collective, the words that a network failing between them writes as
#: well: gloo's reset ('Read error [10.0.0.2]:4020: Connection reset by peer') or write to a closed connection
#: ('Broken pipe'), NCCL's 'remote process exited or there was a network error' (ncclRemoteError)
PEER_LOST = re.compile(r"Connection reset by peer|Broken pipe|remote process exited|ncclRemoteError", re.IGNORECASE)
#: gloo's collective that gave up waiting for a peer, in the exception it raised in the rank that waited
#: ('[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete')
GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (recv|send) operation")
#: a check that found a rank's collective not matching the other ranks' (another size, type or op, or a
#: collective the others did not call): gloo's check of a message's size against the buffer of the collective
#: the receiving rank is in, which throws in gloo's own thread and so aborts that rank (SIGABRT, its words in
#: the C++ runtime's 'what():' line: '[enforce fail at ../gloo/transport/tcp/pair.cc:456] op.preamble.length <=
#: op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there a distributed collective mismatch
#: in your code?'), and torch's own check of every collective under TORCH_DISTRIBUTED_DEBUG=DETAIL, which raises
#: in each rank it ran in ('RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running
#: collective: CollectiveFingerPrint(...)'; NCCL's runs too, NCCL itself checks no size)
MISMATCH = re.compile(r"Received data size doesn't match expected size|Detected mismatch between collectives")
#: torchrun's agent on a failed attempt of its workers, once an attempt: the first of them to fail
#: ('failed (exitcode: -9) local_rank: 0 (pid: 703) of binary: ...'); under ``--max-restarts`` it then
#: starts them all again, as long as restarts are left. It names the worker by its local rank, its
#: place on the agent's node, not by its global rank
ATTEMPT_FAILED = re.compile(r"\bfailed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
#: a line of Python's logging in torchrun's (glog-like) format: level, date, time, pid, source path
LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ (?P<path>\S+?):\d+\] (?P<msg>.*)$")


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def read_tail(path: Path, max_bytes: int) -> str | None:
    """The last ``max_bytes`` of a log as text; None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
