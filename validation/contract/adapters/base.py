"""The adapter interface, and the one for trainers that write the contract natively."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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


def given_commit(facts: RunFacts) -> dict[str, str | None]:
    """env.json's ``git_sha`` and ``git_sha_source`` where the harness gives them (a trainer whose
    files name no commit of their own): the commit found at the trainer's root, or none with why
    (``nsa.provenance.source_revision``'s answer, as this project's trainer writes it), never a
    commit 'found' of nothing; both None where the harness looked nowhere (check-artifacts)."""
    source = facts.trainer_sha_source
    if source is not None:
        source = f"{'found' if facts.trainer_sha else 'looked for'} by the harness at its root: {source}"
    return {"git_sha": facts.trainer_sha, "git_sha_source": source}


class Origin(enum.StrEnum):
    """Where a key of the env.json an adapter writes, or a file it writes, came from: a user reading
    ``check-artifacts`` or the report must not take what the adapter made up, or the harness gave
    it, for what their trainer wrote. The value is the word ``check-artifacts`` prints before it."""

    TRAINER = "present"
    """The trainer's own files hold it: the adapter copied it as written."""
    DERIVED = "derived"
    """The adapter computed it from the trainer's files (a log line, a rank's file)."""
    GIVEN = "given"
    """The harness gave it to the adapter (``RunFacts``: the launch, the runbook, the trainer's checkout)."""
    FILLED = "filled in"
    """The adapter filled it in with a value of its own: nothing measured it."""
    BOOKKEEPING = "adapter's own"
    """The adapter's record of its own reading (env.json's ``adapter``): no fact the trainer stated."""

    def said(self, adapter: str) -> str:
        """What it is called, without its source: 'derived by the torchtitan adapter'."""
        return {Origin.TRAINER: "as the trainer wrote it",
                Origin.DERIVED: f"derived by the {adapter} adapter",
                Origin.GIVEN: f"given the {adapter} adapter by the harness, not read from the trainer's files",
                Origin.FILLED: f"filled in by the {adapter} adapter: not measured",
                Origin.BOOKKEEPING: f"the {adapter} adapter's own record, not the trainer's"}[self]


@dataclass(frozen=True)
class KeyOrigin:
    """Where one env.json key came from, and from what."""

    origin: Origin
    source: str = ""
    """From what, for people, as it follows the origin's words: "from train.log's 'global batch size
    ... sequence length ...' line", "(the runbook's trainer.name)"."""

    def text(self, adapter: str) -> str:
        """What ``check-artifacts`` says of the key: 'derived by the torchtitan adapter from ...'."""
        return _with_source(self.origin.said(adapter), self.source)


@dataclass(frozen=True)
class FileOrigin:
    """Where one file an adapter wrote into the run directory came from, and from what: a
    training.csv it built from a Trainer's state is no file the trainer wrote, though the contract
    check finds it present."""

    origin: Origin
    source: str = ""
    """From what, for people, as it follows the origin's words: "from trainer_state.json's
    log_history and the TensorBoard events under runs/"."""

    def text(self, adapter: str) -> str:
        """What ``check-artifacts`` and the report say of the file: 'derived by the hf_trainer adapter from ...'."""
        return _with_source(self.origin.said(adapter), self.source)


@dataclass(frozen=True)
class WrittenBy:
    """The files an adapter wrote into a run directory, each by where it came from: what a run's
    record keeps of its ``Converted``, so that the report does not show a file the adapter built
    as one the trainer wrote."""

    adapter: str
    files: dict[str, FileOrigin] = field(default_factory=dict)

    def built(self) -> dict[str, str]:
        """Each file it wrote that is not the trainer's own (copied unchanged), by name: what
        people are told of it ('derived by the hf_trainer adapter from ...')."""
        return {name: said.text(self.adapter) for name, said in sorted(self.files.items())
                if said.origin != Origin.TRAINER}

    def said(self, name: str) -> str | None:
        """Whose the file ``name`` is, in short, where the adapter built it ('derived by the hf_trainer
        adapter'); None for one it copied unchanged, or did not write."""
        said = self.files.get(name)
        return None if said is None or said.origin == Origin.TRAINER else said.origin.said(self.adapter)

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> WrittenBy | None:
        """A stored record's (None: a trainer that writes the contract itself, or a record of an
        older harness)."""
        if not data:
            return None
        return WrittenBy(str(data["adapter"]), {name: FileOrigin(Origin(said["origin"]), str(said.get("source") or ""))
                                                for name, said in (data.get("files") or {}).items()})


def _with_source(said: str, source: str) -> str:
    return f"{said} {source}" if source else said


#: the trainer's name ``check-artifacts`` gives an adapter: it reads no runbook, whose trainer.name an
#: acceptance run gives
BY_HAND = "(checked by hand)"
#: the env.json keys every adapter takes from ``RunFacts``, and from what
GIVEN = {
    "world_size": KeyOrigin(Origin.GIVEN, "(the processes it launched; check-artifacts: --world-size)"),
    "trainer": KeyOrigin(Origin.GIVEN, f"(the runbook's trainer.name; check-artifacts: the placeholder {BY_HAND!r}, "
                                       "as it reads no runbook)"),
    "git_sha": KeyOrigin(Origin.GIVEN, "(the commit it found at the trainer's root)"),
    "git_sha_source": KeyOrigin(Origin.GIVEN, "(where it found that commit)"),
    "tokens_per_step": KeyOrigin(Origin.GIVEN, "(the runbook's trainer.tokens_per_step times the world size; "
                                               "check-artifacts: --tokens-per-step)"),
}
#: env.json's ``adapter``: what the adapter read, and what nothing gave
BOOKKEEPING = {"adapter": KeyOrigin(Origin.BOOKKEEPING, "(the files it read, what they could not give)")}


@dataclass(frozen=True)
class Converted:
    """What an adapter says of the files it wrote: where each key of its env.json, and each file,
    came from."""

    env: dict[str, KeyOrigin] = field(default_factory=dict)
    """By key; a dotted one for a key inside another (``adapter.restarts``: read from the
    trainer's log, inside the adapter's own record)."""
    files: dict[str, FileOrigin] = field(default_factory=dict)
    """By the name of each file it wrote into the run directory (``heartbeat_rank0.jsonl``)."""

    def origin(self, key: str) -> KeyOrigin:
        """The origin of ``key`` (dotted), else of the nearest key it lies in. A key the adapter
        names no origin of is its own doing, never the trainer's."""
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            if (said := self.env.get(".".join(parts[:n]))) is not None:
                return said
        return KeyOrigin(Origin.DERIVED)

    def file(self, name: str) -> FileOrigin:
        """The origin of the file ``name``, as the contract check names it: ``heartbeat_rank{R}.jsonl``
        stands for every rank's file, whose one origin it is where they share one. A file the adapter
        names no origin of is its own doing, never the trainer's."""
        pattern = re.escape(name).replace(re.escape("{R}"), r"\d+")
        found = {said for written, said in self.files.items() if re.fullmatch(pattern, written)}
        return found.pop() if len(found) == 1 else FileOrigin(Origin.DERIVED)


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

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> Converted:
        """Write the contract files into ``out_dir``; a file the trainer did not write stays
        missing, and a row it wrote malformed stays malformed, for the contract check to name.
        Returns where each key of the env.json it wrote, and each file, came from."""
        return Converted()
