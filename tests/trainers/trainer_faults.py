"""TEST_TRAINER_FAULT: the one fault switch of every test trainer in this directory
(native_train.py, seedlike_train.py, minimal_train.py), so that a harness's fault matrix drives
each of them the same way. Standard library only; each trainer acts on the fault in its own
format (its docstring says how).

    TEST_TRAINER_FAULT=KIND[:RANK][@STEP]        STEP: the 1-based optimizer step, default 3

    quit_early[@K]     exit 0 right after step K, no .HALT (a run that stops short and says nothing)
    hang_rank:R[@K]    rank R blocks forever as step K starts, writing nothing more (in
                       hang_forever); the other ranks stop in step K too, as in a collective: in a
                       real one where the trainer uses torch.distributed (native_train.py under
                       torchrun), else asleep in wait_for_peers()
    hang_all[@K]       every rank blocks forever as step K starts (in hang_forever)
    kill_rank:R[@K]    rank R is SIGKILLed as step K starts (it sends the signal to itself, as the
                       kernel's OOM killer would; in kill_self): no traceback, no exit code of its own
    term_rank:R[@K]    rank R is sent SIGTERM as step K starts (it sends the signal to itself, as a
                       person's kill of one process or a scheduler preempting it would; in term_self):
                       torchrun reports its -15 as it does the SIGTERMs of its own agent
    quit_rank:R[@K]    rank R exits 0 as step K starts, writing nothing more (in quit_self): a rank
                       whose own stop condition ends it early; the other ranks stop in step K as
                       for hang_rank (a real collective fails without it, else wait_for_peers())
    quit_in_step:R[@K] rank R exits 0 inside step K, after its first record of the step (a stage
                       record: step K in progress, not completed), writing nothing more (in
                       quit_self): a stop condition checked inside the step; at the last step,
                       the rank whose last heartbeat carries the last step's number without having
                       completed it. The other ranks stop in step K as for quit_rank
    mute_rank:R[@K]    rank R writes no heartbeat from step K on and trains on, in every collective,
                       to the last step (native_train.py; a heartbeat writer that went quiet)
    quit_swallowed:R[@K]  rank R leaves as step K starts, as for quit_rank, but slowly, and the others
                       swallow it: a trainer with a real collective (native_train.py under torchrun)
                       destroys R's process group, then R spends EXIT_S in its exit before exit 0 (as
                       an interpreter's exit with a slow atexit hook would: torchrun, seeing another
                       rank fail first, ends it with SIGTERM), and each other rank catches its broken
                       collective, prints one line and exits 1 (no traceback); elsewhere as quit_rank
    slow_rank:R[@K]    rank R is a straggler: from step K on it spends SLOW_S more on each step, as
                       it starts (in straggle), before anything of the step is written
    nan[@K]            the loss of step K is NaN on every rank: logged, then the trainer's own
                       non-finite handling
    crash[@K]          every rank raises RuntimeError in step K: a traceback, exit 1
    malformed[@K]      rank 0's training.csv row of step K has a non-number in its loss column
                       (MALFORMED_CELL); the run goes on
    missing_optional   env.json without its optional keys (git_sha, attention_backends,
                       tokens_per_step)

Unset or empty: no fault. A step past the run's last never comes, so its fault never fires (a
quit_early at or after the last step is a clean run). A spec that does not parse, or a rank the
run does not have, is exit 2 with a one-line message, before anything is written.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "TEST_TRAINER_FAULT"
DEFAULT_STEP = 3
KINDS = ("quit_early", "hang_rank", "hang_all", "kill_rank", "term_rank", "quit_rank", "quit_in_step", "quit_swallowed",
         "mute_rank", "slow_rank", "nan", "crash", "malformed", "missing_optional")
#: the kinds that name a rank (KIND:R)
RANKED = ("hang_rank", "kill_rank", "term_rank", "quit_rank", "quit_in_step", "quit_swallowed", "mute_rank",
          "slow_rank")
#: the extra seconds a slow_rank spends on each step
SLOW_S = 0.2
#: the seconds a quit_swallowed rank spends in its exit once its process group is gone
EXIT_S = 5.0
#: what malformed writes where a number belongs
MALFORMED_CELL = "garbled"
#: the optional env.json keys that missing_optional leaves out
OPTIONAL_ENV_KEYS = ("git_sha", "attention_backends", "tokens_per_step")
EXIT_USAGE = 2

_SPEC = re.compile(r"^(?P<kind>[a-z_]+)(?::(?P<rank>\d+))?(?:@(?P<step>\d+))?$")


@dataclass(frozen=True)
class Fault:
    kind: str = ""
    """One of KINDS, or '' for none."""
    rank: int | None = None
    """The rank of a RANKED kind."""
    step: int = DEFAULT_STEP

    def at(self, kind: str, step: int) -> bool:
        """This fault is ``kind`` and fires in ``step``."""
        return self.kind == kind and self.step == step

    def hangs(self, rank: int, step: int) -> bool:
        """``rank`` blocks forever as ``step`` starts."""
        return step == self.step and (self.kind == "hang_all" or (self.kind == "hang_rank" and rank == self.rank))

    def kills(self, rank: int, step: int) -> bool:
        """``rank`` is SIGKILLed as ``step`` starts."""
        return self.kind == "kill_rank" and rank == self.rank and step == self.step

    def terms(self, rank: int, step: int) -> bool:
        """``rank`` is sent SIGTERM as ``step`` starts."""
        return self.kind == "term_rank" and rank == self.rank and step == self.step

    def quits(self, rank: int, step: int) -> bool:
        """``rank`` exits 0 as ``step`` starts."""
        return self.kind in ("quit_rank", "quit_swallowed") and rank == self.rank and step == self.step

    def quits_in_step(self, rank: int, step: int) -> bool:
        """``rank`` exits 0 inside ``step``, after its first record of it (the trainer calls
        ``in_step`` there)."""
        return self.kind == "quit_in_step" and rank == self.rank and step == self.step

    def mutes(self, rank: int, step: int) -> bool:
        """``rank`` writes no heartbeat in ``step``."""
        return self.kind == "mute_rank" and rank == self.rank and step >= self.step

    def slows(self, rank: int, step: int) -> bool:
        """``rank`` straggles in ``step``."""
        return self.kind == "slow_rank" and rank == self.rank and step >= self.step

    def start_step(self, rank: int, step: int) -> None:
        """What ``rank`` does as ``step`` starts: hang forever, die, or straggle (else nothing)."""
        if self.hangs(rank, step):
            hang_forever()
        if self.kills(rank, step):
            kill_self()
        if self.terms(rank, step):
            term_self()
        if self.quits(rank, step):
            quit_self()
        if self.slows(rank, step):
            straggle()

    def in_step(self, rank: int, step: int) -> None:
        """What ``rank`` does once it has written its first record of ``step``: exit 0 (else nothing)."""
        if self.quits_in_step(rank, step):
            quit_self()

    def peer_hangs(self, rank: int, step: int) -> bool:
        """Another rank blocks or quits in ``step``: this one stops there too (in a collective)."""
        return (step == self.step and self.kind in ("hang_rank", "quit_rank", "quit_in_step", "quit_swallowed")
                and rank != self.rank)


def parse(spec: str, world_size: int) -> Fault:
    """The fault a spec names; ValueError with the reason when it names none."""
    spec = spec.strip()
    if not spec:
        return Fault()
    m = _SPEC.match(spec)
    if not m or m["kind"] not in KINDS:
        raise ValueError(f"{ENV}={spec!r}: expected KIND[:RANK][@STEP] with KIND one of {', '.join(KINDS)}")
    kind, rank, step = m["kind"], m["rank"], m["step"]
    if (kind in RANKED) != (rank is not None):
        raise ValueError(f"{ENV}={spec!r}: a rank goes with {', '.join(RANKED)}, and only with them ({kind}:R)")
    if kind == "missing_optional" and step is not None:
        raise ValueError(f"{ENV}={spec!r}: missing_optional takes no step")
    if rank is not None and int(rank) >= world_size:
        raise ValueError(f"{ENV}={spec!r}: rank {rank} does not exist (WORLD_SIZE={world_size})")
    if step is not None and int(step) < 1:
        raise ValueError(f"{ENV}={spec!r}: steps count from 1")
    return Fault(kind, None if rank is None else int(rank), DEFAULT_STEP if step is None else int(step))


def from_env(world_size: int) -> Fault:
    """The fault set in the environment; exit 2 with the reason on a bad spec."""
    try:
        return parse(os.environ.get(ENV, ""), world_size)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE) from None


def hang_forever() -> None:
    """Where a hung rank stays (its stack names this function)."""
    while True:
        time.sleep(1.0)


def kill_self() -> None:
    """Where a killed rank ends: SIGKILL, which no handler sees."""
    os.kill(os.getpid(), signal.SIGKILL)


def term_self() -> None:
    """Where a rank sent SIGTERM from outside ends: as the trainer handles SIGTERM (its default action:
    killed by it, no traceback; seedlike_train.py's handler dumps its stacks and exits 143)."""
    os.kill(os.getpid(), signal.SIGTERM)
    hang_forever()  # the signal is delivered before this returns; never reached


def quit_self() -> None:
    """Where a rank that leaves early ends: exit 0, no traceback."""
    os._exit(0)


def straggle() -> None:
    """Where a slow rank spends its extra time each step."""
    time.sleep(SLOW_S)


def await_halt(out: Path, limit_s: float = 60.0) -> None:
    """A rank other than 0 leaves a non-finite halt after rank 0 has written its row and .HALT, as
    the ranks of a real trainer halt together after one collective: one that left first had
    torchrun SIGTERM rank 0 before it wrote either (a 2-core CI run read 'ended before its first
    step'; reproduced with rank 0 made 1 s late)."""
    deadline = time.monotonic() + limit_s
    while not (Path(out) / ".HALT").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_for_peers() -> None:
    """Where a rank waits for a hung peer, as in a collective that never completes."""
    while True:
        time.sleep(1.0)
