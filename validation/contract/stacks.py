"""Python stacks of a trainer's processes as typed frames: the trainer's own faulthandler dumps
(``stackdump_rank{R}.txt``) and the ones the harness takes itself with py-spy
(validation/launch/stacks.py). Findings show where each rank was from these.

A trainer whose dumps do not say their rank (the seed's) has them converted to
``stackdump_unranked{i}.txt`` by its adapter: "rank unknown", never a rank guessed from their order.

The stacks the harness takes when it stops a run (a stall or the phase timeout) lie in the run
directory under ``harness_stacks/``: one py-spy dump per process (``rank{R}.txt``, or
``pid{P}.txt`` for a process whose rank cannot be told) and ``index.json``, a list of
``TakenStack`` records saying which process each is, how its rank was known and how its stack
was taken.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool = False
    """faulthandler's 'Current thread' (the one that wrote the dump)."""
    frames: list[Frame] = field(default_factory=list)
    """Most recent first."""


#: the files of Python's import machinery as stacks name them: a stack with a frame of theirs was
#: running an import
IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
#: importlib.import_module's file, the machinery's entry for an import by name
IMPORT_MODULE = "/importlib/__init__.py"
#: torch's own package: its frames are torch's code, not the trainer's
TORCH_PACKAGE = "/torch/"


@dataclass(frozen=True)
class Import:
    """An import under way in a stack (a frame of Python's import machinery among its frames),
    read from the whole stack: a dump keeps only its innermost frames (``StackDump.frames``)."""

    module: Frame | None
    """The innermost module body running (a ``<module>`` frame above the machinery: its file is the
    module being imported); None where the machinery itself ran (finding, reading or compiling a
    module, loading an extension)."""
    origin: Frame | None
    """Where the trainer's code began it: the innermost frame outside torch's package below the
    outermost machinery frame (``import torch`` at train.py:2, or the line whose call into torch
    imported a module of torch's lazily); else the frame just below that machinery; None where the
    stack has none."""
    torch_code: bool
    """Every frame above the innermost machinery frame is torch's: torch's own code running as one of
    its modules is imported (a torch.distributed module registering its ops), which waits for no peer
    whatever package it lies in."""


def import_under_way(frames: list[Frame]) -> Import | None:
    """The import ``frames`` (a whole stack, most recent first) were running; None where none was."""
    machinery = [i for i, fr in enumerate(frames) if _machinery(fr)]
    if not machinery:
        return None
    inner, outer = machinery[0], machinery[-1]
    above = frames[:inner]
    module = next((fr for fr in above if fr.func == "<module>"), None)
    below = frames[outer + 1:]
    origin = next((fr for fr in below if not _torch(fr) and not _machinery(fr)), below[0] if below else None)
    return Import(module, origin, bool(above) and all(map(_torch, above)))


def _machinery(fr: Frame) -> bool:
    """A frame of Python's import machinery: importlib's bootstrap, or importlib.import_module."""
    return fr.file in IMPORT_MACHINERY or fr.file.replace("\\", "/").endswith(IMPORT_MODULE)


def _torch(fr: Frame) -> bool:
    return TORCH_PACKAGE in fr.file.replace("\\", "/")


#: torch's DataLoader iterator over worker processes: a thread inside it waits for a worker's batch
LOADER_FILE, LOADER_ITER = "torch/utils/data/dataloader.py", "_MultiProcessingDataLoaderIter."


def loader_wait(frames: list[Frame]) -> Frame | None:
    """The frame of torch's DataLoader in which ``frames`` (a whole stack, most recent first) waited for the
    loader's worker processes (its multi-process iterator), innermost; None where they did not."""
    return next((fr for fr in frames if fr.file.replace("\\", "/").endswith(LOADER_FILE)
                 and fr.func.startswith(LOADER_ITER)), None)


@dataclass(frozen=True)
class StackDump:
    """Where one rank was: the training thread's frames and how the stack was taken."""

    path: str
    frames: list[Frame]
    """The training thread's frames, most recent first."""
    header: str | None = None
    source: str = "trainer"
    """'trainer' (its own stackdump_rank{R}.txt), 'py-spy' or 'SIGUSR1' (taken by the harness)."""
    pid: int | None = None
    """The process, where known (the harness's own dumps); for a dump of unknown rank it names
    which process it was."""
    importing: Import | None = None
    """The import the thread was running, read from all its frames (``import_under_way``); None where
    none was."""
    loader: Frame | None = None
    """Where the thread waited for its DataLoader's worker processes, read from all its frames
    (``loader_wait``); None where it did not."""


#: the run directory's folder of the stacks the harness took, and its index
HARNESS_STACKS = "harness_stacks"
STACKS_INDEX = "index.json"
#: a rank's helper processes (Python processes below it) the harness dumps, at most: those of the lowest
#: pids, the workers a data loader starts first (a compiler's pool of workers would otherwise add a dump each)
HELPERS_PER_RANK = 4
#: a trainer's own dump whose rank its files do not say (an adapter writes these rather than guess)
UNRANKED_DUMP = "stackdump_unranked{i}.txt"
UNRANKED_DUMPS = "stackdump_unranked*.txt"


@dataclass(frozen=True)
class TakenStack:
    """One process whose stack the harness took (or tried to) before it killed the run."""

    pid: int
    rank: int | None
    """None: the rank cannot be told (reported as 'rank unknown', never guessed)."""
    rank_from: str
    """How the rank is known: 'RANK' (the process's environment), 'heartbeat pid' (the pid a rank's
    heartbeats carry), 'single process' (the one process a python launcher started is rank 0), or
    '' when unknown."""
    method: str
    """'py-spy' (``path`` holds its dump), 'SIGUSR1' (py-spy could not attach; the signal asked
    the trainer's own handler for a dump, which lands wherever the trainer writes it) or 'none'."""
    path: str | None = None
    """The dump, relative to the run directory (``harness_stacks/rank1.txt``); None when the
    harness holds no dump of its own."""
    note: str = ""
    """Why py-spy could not, and what was done instead."""
    node: int | None = None
    """The launch's node index the process ran on (a launch of several nodes); None otherwise."""
    state: str = ""
    """The process's state as the harness came to take its stack (psutil's: 'stopped' for a process
    halted by SIGSTOP or a debugger, which runs nothing, no dump handler either); '' where unread."""
    helper_of: int | None = None
    """Of a rank's helper (a process below it: a data loader or compile worker; ``rank`` None): that
    rank; None for a rank's own process or one of rank unknown."""

    @property
    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"rank unknown (pid {self.pid})"


def write_index(run_dir: Path, taken: list[TakenStack]) -> None:
    folder = run_dir / HARNESS_STACKS
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STACKS_INDEX + ".tmp")
    tmp.write_text(json.dumps([asdict(t) for t in taken], indent=2))
    tmp.replace(folder / STACKS_INDEX)


def read_index(run_dir: Path, helpers: bool = False) -> list[TakenStack]:
    """The stacks the harness took in this run directory of ranks and of processes of rank unknown (with
    ``helpers``, of ranks' helpers instead); [] when it took none. The index is the harness's own file: one
    that does not parse is a harness bug, and raises."""
    path = run_dir / HARNESS_STACKS / STACKS_INDEX
    if not path.is_file():
        return []
    taken = [TakenStack(**rec) for rec in json.loads(path.read_text())]
    return [t for t in taken if (t.helper_of is not None) == helpers]


_FAULTHANDLER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_FAULTHANDLER_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
#: py-spy dump: 'Thread 0x7F (idle): "MainThread"' then '    func (file.py:12)'
_PYSPY_THREAD = re.compile(r'^Thread (?P<ident>\S+) \((?P<state>[^)]*)\)(: "(?P<name>[^"]*)")?')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>.+):(?P<line>\d+)\)\s*$")


def parse_faulthandler(text: str) -> list[Thread]:
    """faulthandler output -> its threads, frames most recent first (faulthandler's order)."""
    threads: list[Thread] = []
    for line in text.splitlines():
        t = _FAULTHANDLER_THREAD.match(line)
        if t:
            threads.append(Thread(t.group(2), t.group(1) == "Current thread"))
            continue
        f = _FAULTHANDLER_FRAME.match(line)
        if f:
            if not threads:
                threads.append(Thread("?"))
            threads[-1].frames.append(Frame(f["file"], int(f["line"]), f["func"]))
    return threads


def parse_pyspy(text: str) -> list[Thread]:
    """``py-spy dump`` output -> its threads, frames most recent first (py-spy's order); the
    thread named MainThread is marked current."""
    threads: list[Thread] = []
    for line in text.splitlines():
        t = _PYSPY_THREAD.match(line)
        if t:
            threads.append(Thread(t["ident"], t["name"] == "MainThread"))
            continue
        f = _PYSPY_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["file"], int(f["line"]), f["func"]))
    return threads


#: a frame of a collective: the rank waits there for the others (c10d's collectives, FSDP's, the
#: functional collectives; accelerate, transformers' Trainer and DeepSpeed reach theirs through them)
COLLECTIVE = "torch/distributed/"
#: what lies under torch/distributed/ and waits for no peer: torchrun's error recording
#: (``@record`` wraps a user's main, so its frame is at the bottom of every rank's stack) and its
#: process launch
NOT_COLLECTIVE = ("torch/distributed/elastic/multiprocessing/", "torch/distributed/run.py",
                  "torch/distributed/launcher/")


def collective_of(frames: list[Frame]) -> str | None:
    """The collective ``frames`` (most recent first) were in: the function of their innermost frame of
    torch.distributed's (``COLLECTIVE``, not ``NOT_COLLECTIVE``), 'all_reduce'; None where none is."""
    for fr in frames:
        path = fr.file.replace("\\", "/")
        if COLLECTIVE in path and not any(n in path for n in NOT_COLLECTIVE):
            return fr.func
    return None


def main_thread_frames(threads: list[Thread]) -> list[Frame]:
    """The frames of the thread that ran the training loop: the one that runs a module's top
    level (``<module>``, below runpy's frames for ``python -m``), else the longest stack.
    Watchdog threads are skipped."""
    if not threads:
        return []
    with_module = [t for t in threads if any(f.func == "<module>" for f in t.frames)]
    pool = with_module or threads
    return max(pool, key=lambda t: len(t.frames)).frames
