"""The adapter interface, and the one for trainers that write the contract natively."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nsa.contract import TRAINING_CSV


@dataclass(frozen=True)
class RunFacts:
    """What the harness knows about a run that the trainer's own files may not say."""

    world_size: int
    trainer: str
    trainer_sha: str | None = None
    trainer_sha_source: str | None = None
    tokens_per_step: int | None = None
    """Global tokens of one optimizer step, where the runbook says them (trainer.tokens_per_step)."""


class Adapter:
    """The trainer writes the contract itself ('native'): nothing to convert, nothing lacking."""

    name = "native"
    converts = False
    """Whether the trainer's files differ from the contract (and live in a directory of their own)."""
    takes_tokens_per_step = False
    """Whether it derives tokens/s from the run's tokens per step the harness gives it
    (``RunFacts.tokens_per_step``: a runbook's ``trainer.tokens_per_step``, ``check-artifacts
    --tokens-per-step``); a format whose files say their own rate, or none, reads none."""
    lacks: frozenset[str] = frozenset()
    """Contract fields (training.csv columns, env.json keys, 'fallbacks') the format cannot
    carry; metrics reading them are UNMEASURED (the catalogue's inputs, validation/judge/metrics.py)."""

    def in_format(self, trainer_dir: Path) -> bool:
        """Whether ``trainer_dir`` is written in this format at all (``check-artifacts`` hints at
        an adapter only for a directory of its format): any directory may be the contract's."""
        return True

    def trainer_dir(self, out_dir: Path) -> Path:
        """Where the trainer writes its files (the run directory itself, for the contract)."""
        return out_dir

    def progress_csv(self, trainer_dir: Path) -> Path:
        """The file the harness watches while the trainer runs (its stall watch and progress line)."""
        return trainer_dir / TRAINING_CSV

    def live_steps(self, trainer_dir: Path) -> Callable[[], int | None] | None:
        """For a format with no line per step to watch: a reader of the highest step the trainer's
        files show now, called at each look of the stall watch; None: its CSV and heartbeats say it."""
        return None

    def progress(self, line: str, world_size: int = 1) -> tuple[int, float | None] | None:
        """The step, and global tokens/s (all ranks, as training.csv holds them) where it says them,
        that one line of ``progress_csv`` shows, of a run of ``world_size`` ranks; None for a line of
        no step (a header, a torn row). A CSV row: its first and fourth cells."""
        cells = line.strip().split(",")
        if not cells[0].strip().isdigit():
            return None
        try:
            rate = float(cells[3]) if len(cells) > 3 else None
        except ValueError:
            rate = None
        return int(cells[0]), rate

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> None:
        """Write the contract files into ``out_dir``; a file the trainer did not write stays
        missing, and a row it wrote malformed stays malformed, for the contract check to name."""
