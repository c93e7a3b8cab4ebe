"""Ranks of a run of several that exited 0 before the run's last step while the others ran on
(sharing no collective with them after they left, so nothing failed), or that trained on and
stopped writing their heartbeats (their files cannot tell which): found by their heartbeats, in any
format the contract accepts.

- A rank whose records mark each step's end (a ``step`` record, nsa/contract.py
  HEARTBEAT_STAGES_AFTER_STEP) says by its last one which step it completed: short of the steps
  asked for is short (``short_of``; the contract asks for a ``step`` record of the last step).
- A rank whose records mark no step's end (no stage at all, or only stages within a step: the seed's
  ranks beat as each step starts) says only how far it got. Its last record may lag the run's last
  step (training.csv's, the other ranks' heartbeats') by less than its own heartbeat interval, as
  its records show it (``Beat.every``: the contract and env.json name no cadence); lagging by that
  interval or more, it stopped writing before the run ended. A rank of fewer than two steps shows
  no interval: it made no step progress, which the idle-rank metric judges.

Which of the two it was, the files cannot say. The harness's own watch of the process tree can say
one of them, where the rank's heartbeats carry its ``pid`` and the harness saw that process
(``ProcessSeen``: torchrun's workers on this host): gone before the run got past a step short of
its last, it left early. Seen running once the run had reached its last step, it did not exit
early, but running is not training: a rank that left its loop and then waited for the others (a
barrier, destroy_process_group) or took long to end (an interpreter and process group's teardown,
which can outlast a fast run's last steps) is running too, so the finding
says it had not exited and names both. Otherwise (it ended about when the run did, or the harness
never saw it), it says both, as the files do.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.judge.record import Beat
from validation.judge.seen import ProcessSeen


class Shortfall(enum.StrEnum):
    """How a rank's heartbeats say that it stopped early."""

    ENDS = "ends"
    """Its records of a step's end stop before the last step asked for."""
    LAGS = "lags"
    """Its records (of no step's end) stop behind the run's last step by its own interval or more."""


@dataclass(frozen=True)
class ShortRank:
    rank: int
    beat: Beat
    """Its last heartbeat (with the interval its records show)."""
    how: Shortfall
    ran_to: int | None = None
    """The last step the run completed, as training.csv and the other ranks' heartbeats say."""
    process: ProcessSeen | None = None
    """Its process (the pid of its heartbeats) as the harness saw it; None where it saw none."""

    def text(self, steps: int) -> str:
        b = self.beat
        if self.how == Shortfall.ENDS:
            went = ("no other file of the run goes further" if self.ran_to is None or self.ran_to <= (b.done or 0)
                    else f"the run completed step {self.ran_to}")
            return (f"rank {self.rank}'s heartbeats stop after step {b.done} of {steps} (its last heartbeat: step "
                    f"{b.step}, stage {b.stage or '?'}; {went}): {self._which(steps)}")
        every = "every step" if b.every == 1 else f"every {b.every} steps"
        return (f"rank {self.rank}'s heartbeats end at step {b.step} while the run completed step {self.ran_to} of "
                f"{steps} (it wrote one {every}): {self._which(self.ran_to)}")

    def _which(self, last: int) -> str:
        """Whether it left or trained on, by its process (``last``: the run's last step), else both."""
        p = self.process
        if p is not None and p.gone_at is not None and p.gone_at < last:
            # the harness sees a process gone only at its next look, steps later: the rank's own last
            # record says where it left
            return (f"it left early: it started no step after {self._own_last()}, and its process (pid {p.pid}, its "
                    f"heartbeats') had exited by the time the run reached step {p.gone_at}")
        if p is not None and p.alive_at >= last:  # running is not training: a process may take long to end
            return (f"its process (pid {p.pid}, its heartbeats') had not exited when the run reached step "
                    f"{p.alive_at}: it trained on without writing them, or stopped and took that long to end")
        # the files cannot tell a rank that left from one that trained on and stopped writing its
        # heartbeats (a DDP rank must have trained on: the others' collectives needed it): say both
        return "it left early or trained on without writing them"


    def _own_last(self) -> str:
        """The last step of its own records: 'step 6, the last it completed (its last heartbeat marks
        that step's end)'."""
        b = self.beat
        if not b.ends_steps:
            return f"step {b.step}, the last it started (its heartbeats mark no step's end)"
        if b.done == b.step:
            return f"step {b.step}, the last it completed (its last heartbeat marks that step's end)"
        return f"step {b.step} (its last heartbeat: stage {b.stage or '?'}, within that step)"


@dataclass(frozen=True)
class CsvAhead:
    """training.csv logs a step that no rank's heartbeats reach, the heartbeats of rank 0 (which
    writes it) among them: the files disagree, and neither is taken for the truth (a CSV whose step
    numbers are not the steps run reads the same as heartbeats that stopped while the ranks trained on)."""

    logged: int
    """training.csv's last step."""
    reached: int
    """The furthest step any rank's heartbeats say."""
    writer: Beat
    """Rank 0's last heartbeat."""

    def text(self, steps: int) -> str:
        b = self.writer
        return (f"training.csv logs steps beyond what the heartbeats show: its last row says step {self.logged} of "
                f"{steps}, and no rank's heartbeats go past step {self.reached} (rank 0, which writes it, at step "
                f"{b.step}, stage {b.stage or '?'}, as it wrote row {self.logged})")


def csv_ahead(beats: Mapping[int, Beat], world: int, logged: int | None) -> CsvAhead | None:
    """``CsvAhead`` of a run of several ranks whose every rank wrote heartbeats, where training.csv's
    last step (``logged``) is beyond the furthest of them; None otherwise."""
    mine = {k: b for k, b in beats.items() if k < world}
    if world < 2 or logged is None or 0 not in mine or len(mine) < world:
        return None
    reached = max((b.done if b.ends_steps else b.step) or 0 for b in mine.values())
    return CsvAhead(logged, reached, mine[0]) if logged > reached else None


def short_of(beat: Beat, steps: int) -> bool:
    """Whether a rank whose heartbeats record each step's end (``ends_steps``) says by its last
    record that it did not complete ``steps``: a record of an earlier step, or one of a stage within
    the last step. A rank whose records say no step's end (the seed's format) tells nothing here."""
    if not beat.ends_steps or beat.step is None:
        return False
    return beat.step < steps or (beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP)


def short_ranks(beats: Mapping[int, Beat], world: int, steps: int | None, logged: int | None,
                processes: Mapping[int, ProcessSeen] | None = None) -> tuple[ShortRank, ...]:
    """The ranks below ``world`` (of several) whose last heartbeat says they stopped before the run
    did. ``steps``: the steps asked for (None: not a trainer run); ``logged``: training.csv's last
    step; ``processes``: per rank, its process as the harness saw it (Evidence.rank_processes)."""
    if steps is None or world < 2:
        return ()
    processes = processes or {}
    out = []
    for r, b in sorted(beats.items()):
        if r >= world:
            continue
        ran = _ran_to(r, beats, logged)
        if short_of(b, steps) and (b.done or 0) >= 1:  # a rank that completed none is an idle rank
            out.append(ShortRank(r, b, Shortfall.ENDS, ran, processes.get(r)))
            continue
        if not b.ends_steps and b.step is not None and b.every is not None and ran is not None \
                and ran - b.step >= b.every:
            out.append(ShortRank(r, b, Shortfall.LAGS, ran, processes.get(r)))
    return tuple(out)


def _ran_to(rank: int, beats: Mapping[int, Beat], logged: int | None) -> int | None:
    """The furthest step that training.csv or a rank other than ``rank`` says the run reached: a
    record of a step's end says that step, one of no stage or of a stage within a step only the
    step it began (taken as completed where it is the last: the contract's rule)."""
    reached = [b.done if b.ends_steps else b.step for k, b in beats.items() if k != rank]
    return max((n for n in [logged, *reached] if n is not None), default=None)
