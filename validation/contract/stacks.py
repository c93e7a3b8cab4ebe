"""Python stacks of a trainer's processes as typed frames: the trainer's own faulthandler dumps
(``stackdump_rank{R}.txt``) and the ones the harness takes itself with py-spy
(validation/launch/stacks.py). Findings show where each rank was from these."""
from __future__ import annotations

import re
from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class StackDump:
    """Where one rank was: the training thread's frames and how the stack was taken."""

    path: str
    frames: list[Frame]
    """The training thread's frames, most recent first."""
    header: str | None = None
    source: str = "trainer"
    """'trainer' (its own stackdump_rank{R}.txt), 'py-spy' or 'SIGUSR1' (taken by the harness)."""


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


def main_thread_frames(threads: list[Thread]) -> list[Frame]:
    """The frames of the thread that ran the training loop: the one whose outermost frame is
    a module's top level (``<module>``), else the longest stack. Watchdog threads are skipped."""
    if not threads:
        return []
    with_module = [t for t in threads if t.frames and t.frames[-1].func == "<module>"]
    pool = with_module or threads
    return max(pool, key=lambda t: len(t.frames)).frames
