"""A trainer that stopped on a non-finite loss: with the contract's exit code for it and no .HALT
(``NonfiniteExit``), or with its .HALT, the ranks whose own loss was not finite or whose heartbeats
say they halted on it; and the diagnosis of such a stop (``nonfinite``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nsa.contract import EXIT_NONFINITE, HEARTBEAT_STAGE_HALT
from validation.contract.files import HaltInfo
from validation.contract.torchrun_log import RankFailure
from validation.judge.diagnosis.blame import Diagnosis, Kind, RankAt, diagnosis_of
from validation.judge.record import TRAINER_KINDS, PhaseRecord


@dataclass(frozen=True)
class NonfiniteExit:
    """A trainer that exited with the contract's code for a non-finite loss (EXIT_NONFINITE) and left
    no .HALT (``nonfinite_exit``): under torchrun, whose own exit is 1, the ranks its log says exited
    so, lowest first; () where the harness saw the code itself (a trainer run as one process)."""

    ranks: tuple[int, ...] = ()

    def text(self, exit_code: int | None) -> str:
        """The verdict: 'trainer stopped on a non-finite loss, with no .HALT: rank 1 exited with code 4,
        the contract's code for it (exit code 1)'; '... with no .HALT (exit code 4, the contract's code
        for it)' of the one process."""
        head = "trainer stopped on a non-finite loss, with no .HALT"
        if not self.ranks:
            return f"{head} (exit code {exit_code}, the contract's code for it)"
        who = f"rank{'s' * (len(self.ranks) > 1)} {', '.join(map(str, self.ranks))}"
        return f"{head}: {who} exited with code {EXIT_NONFINITE}, the contract's code for it (exit code {exit_code})"


def nonfinite_exit(exit_code: int | None, failures: Mapping[int, RankFailure], halt: HaltInfo | None
                   ) -> NonfiniteExit | None:
    """The trainer stopped on a non-finite loss with the contract's exit code for it and wrote no .HALT:
    its ranks that exited so (RankFailure.stopped_nonfinite), else its one process's own exit code.
    None where it left a .HALT (that decides: the guard's, or one of no source, cut short), or a rank
    failed in its own right (an exception, a signal: that is the crash, whatever the others' guard saw
    after it)."""
    return None if halt is not None else exited_nonfinite(exit_code, failures)


def exited_nonfinite(exit_code: int | None, failures: Mapping[int, RankFailure]) -> NonfiniteExit | None:
    """``nonfinite_exit`` whatever .HALT the run left: the exit code says the trainer's non-finite guard
    stopped it, where a .HALT cut short before its source cannot say whose it is."""
    if any(f.own for f in failures.values()):
        return None
    ranks = tuple(sorted(k for k, f in failures.items() if f.stopped_nonfinite))
    return NonfiniteExit(ranks) if ranks or (exit_code == EXIT_NONFINITE and not failures) else None


def nonfinite_exit_of(rec: PhaseRecord) -> NonfiniteExit | None:
    """``nonfinite_exit`` of a trainer's stored record."""
    ev = rec.evidence
    return nonfinite_exit(rec.exit_code, ev.rank_failures, ev.halt) if rec.kind in TRAINER_KINDS else None


def halted_ranks(r: PhaseRecord) -> list[int]:
    """Of a run of several ranks that its trainer halted on a non-finite loss: the ranks whose last
    heartbeat is a halt record of the .HALT's step where some rank's is not (that one went on, into
    its next collective); [] where every rank's is or none's (nothing singles a rank out)."""
    halt, beats = r.evidence.halt, r.evidence.last_heartbeat
    if halt is None or r.world_size < 2:
        return []
    halted = [k for k in range(r.world_size) if (b := beats.get(k)) is not None and b.stage == HEARTBEAT_STAGE_HALT
              and b.step == halt.step]
    return halted if len(halted) < r.world_size else []


def nonfinite_ranks(r: PhaseRecord) -> list[int]:
    """The ranks whose own loss the trainer's non-finite .HALT says was not finite, by their place
    in its list of losses per rank."""
    losses = r.evidence.halt.losses or [] if r.evidence.halt is not None else []
    return [i for i, v in enumerate(losses) if not (isinstance(v, (int, float)) and abs(v) < float("inf"))]


def nonfinite(r: PhaseRecord) -> Diagnosis | None:
    """The trainer stopped on a non-finite loss (.HALT source nonfinite): the ranks whose own loss
    was (the .HALT's losses per rank), else those whose heartbeats say they halted on it where the
    others did not; no rank where nothing singles one out."""
    ev = r.evidence
    if r.kind not in TRAINER_KINDS or ev.halt is None or ev.halt.source != "nonfinite":
        return None
    step, losses, world = ev.halt.step, ev.halt.losses or [], max(r.world_size or 1, 1)
    bad = nonfinite_ranks(r)
    files = (f"{r.out_dir}/.HALT",)
    if len(losses) != world:  # no loss of every rank: the heartbeats may say which rank halted
        halted = halted_ranks(r)
        return diagnosis_of(Kind.HALTED if halted else Kind.NONFINITE, tuple(RankAt.of(r, k) for k in halted), r,
                            step=step, files=files)
    if not bad or (world > 1 and len(bad) == world):
        return diagnosis_of(Kind.NONFINITE, (), r, step=step, files=files)
    return diagnosis_of(Kind.NONFINITE, tuple(RankAt.of(r, k, cause=f"loss {losses[k]} at step {step}") for k in bad),
                        r, step=step, files=files)
