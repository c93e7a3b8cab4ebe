"""The artifact contract (``nsa.contract``, docs/artifact_contract.md), checked in this one place.

``read(out_dir)`` reads a run directory with the readers of files.py and says, file by file,
what is present, missing or malformed. The harness reads every train point through it (a
required file missing, or any file malformed, is the point's ERROR) and ``nsa-validate
check-artifacts`` prints it for trainer authors.

Ranks come from env.json's ``world_size``: a heartbeat or stack dump of a rank at or above it
is malformed (a rank that does not exist cannot have stalled). The processes the harness launched
(torchrun's nproc x nnodes) are ranks whatever env.json says: where it launched several, their
count is the world (torchrun fixes it), so a world_size other than it is env.json's error, and the
ranks read are the launched ones; one process (the python launcher) may start ranks of its own. An optional field the files lack
is named with the metrics it leaves UNMEASURED (the metric catalogue says which read it), so that
this check, the verdict and the report say the same.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from nsa.contract import (
    CSV_COLUMNS,
    ENV_JSON,
    ENV_RECOMMENDED,
    ENV_REQUIRED,
    GPU_TIMELINE,
    HALT,
    HEARTBEAT_REQUIRED,
    HEARTBEAT_STAGES_IN_STEP,
    PROFILE_JSON,
    STACKDUMP_PATTERN,
    TRAINING_CSV,
    heartbeat_name,
)
from validation.contract.files import (
    empty_stackdumps,
    halted,
    HeartbeatLog,
    TrainingLog,
    Writer,
    read_env_json,
    read_gpu_timeline,
    read_heartbeat_logs,
    read_profile,
    read_training_log,
    stackdumps,
    torn_last_row,
    unranked_stackdumps,
)
from validation.contract.reruns import Rerun, Restart
from validation.errors import ArtifactError
from validation.excerpt import EXCERPT_CHARS

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd

HEARTBEAT_GLOB = "heartbeat_rank{R}.jsonl"
#: training.csv columns every row must fill with a number; the others may be nan throughout (a
#: trainer that cannot measure memory), which leaves the metrics that read them UNMEASURED
CSV_VALUED = ("step", "loss", "toks_per_s")
#: training.csv columns whose every row must hold a finite number: a rate of nan or inf measured
#: nothing (a loss may be nan: the loss gate catches it). An inf tokens/s passed every throughput
#: floor, and a nan one outside a gate's window left the run GO. A column an adapter names in
#: ``adapter.unmeasured`` is exempt: its nan steps are ones its trainer's files do not time, and
#: every metric reading it is UNMEASURED (judge/metrics.py ``unprovided_by_files``).
CSV_FINITE = ("toks_per_s",)


class Presence(enum.StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    MALFORMED = "malformed"
    EMPTY = "empty"
    """An optional file that exists with nothing in it (a stack dump a rank opened and never
    wrote): counted as absent."""


@dataclass(frozen=True)
class Item:
    """One file (or field) of the contract as found in a run directory."""

    file: str
    presence: Presence
    detail: str = ""
    required: bool = True
    field: str | None = None
    """A key inside the file (env.json's world_size), when the item is about one."""

    @property
    def problem(self) -> bool:
        """A required item that is not there as the contract says, or any item that is malformed
        (an optional file written wrong, such as a stack dump of a rank that does not exist)."""
        return self.presence == Presence.MALFORMED or (self.required and self.presence != Presence.PRESENT)

    def line(self, tag: str | None = None) -> str:
        """``tag``: the word before the name where presence alone would mislead (check-artifacts
        says an adapter's key is 'derived', not 'present')."""
        if tag is None:
            optional = not self.required and self.presence == Presence.MISSING
            tag = f"{self.presence} (optional)" if optional else str(self.presence)
        name = f"{self.file} {self.field}" if self.field else self.file
        return f"{tag:<20} {name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class ContractRead:
    """A run directory's contract files, parsed, and what was found wrong with them."""

    out_dir: Path
    csv: pd.DataFrame | None = None
    heartbeats: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    halted: bool = False
    items: list[Item] = field(default_factory=list)
    reruns: dict[str, list[Rerun]] = field(default_factory=dict)
    """Per file (training.csv, heartbeat_rank{R}.jsonl), the steps a resume in place wrote again:
    the rows and records above are the latest occurrence (validation/contract/reruns.py)."""
    shared: dict[int, tuple[Writer, ...]] = field(default_factory=dict)
    """Per rank whose heartbeat file several processes wrote at once, those processes."""
    launched: int = 1
    """Processes the harness launched (1: not known, or one): each is a rank."""
    steps: int | None = None
    """The steps the run was asked for; None where not known (check-artifacts)."""

    @property
    def ok(self) -> bool:
        return not any(i.problem for i in self.items)

    @property
    def env_world_size(self) -> int | None:
        """env.json's world_size when it is a whole number >= 1."""
        world = (self.env or {}).get("world_size")
        return world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else None

    @property
    def world_size(self) -> int | None:
        """The run's ranks: env.json's world_size, and at least the processes launched (a trainer
        may start more itself; fewer is env.json's error). None when env.json says none."""
        world = self.env_world_size
        return None if world is None else max(world, self.launched)

    def world_text(self) -> str:
        """Where the world size comes from, for messages: 'env.json world_size 2'."""
        world = self.world_size
        return (f"env.json world_size {world}" if world == self.env_world_size
                else f"{world} processes launched")

    def problems(self) -> list[str]:
        """What breaks the contract, each naming the file: the harness's errors of the point."""
        return [f"{self.out_dir / i.file}{' ' + i.field if i.field else ''}: {i.presence}"
                + (f" ({i.detail})" if i.detail else "") for i in self.items if i.problem]


#: the metrics that read each optional field (the judge's metric catalogue, handed down: this stage
#: does not import the judge), so that an absent field is named with the metrics it leaves UNMEASURED
Costs = dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Unended:
    """A contract file whose last entry has no line end: cut off mid-write, or never ended."""

    path: Path
    entry: str
    """'row' (training.csv) or 'record' (a heartbeat file)"""
    text: str

    def why(self) -> str:
        return f"the last {self.entry} has no line end (every {self.entry} must end with one): {self.text[:EXCERPT_CHARS]!r}"


def unended(found: ContractRead) -> list[Unended]:
    """The files of ``found`` (training.csv, each rank's heartbeats) whose last entry has no line
    end; it is not read. A writer killed mid-write leaves one; a trainer that exits 0 must not."""
    written = ([(found.out_dir / TRAINING_CSV, "row")] if found.csv is not None else []) + \
        [(found.out_dir / heartbeat_name(rank), "record") for rank in sorted(found.heartbeats)]
    return [Unended(path, entry, torn) for path, entry in written if (torn := torn_last_row(path)) is not None]


def read(out_dir: Path, costs: Costs | None = None, launched: int = 1, steps: int | None = None) -> ContractRead:
    """Every contract file of ``out_dir``, checked. ``costs`` names, per optional field, the
    metrics its absence leaves UNMEASURED (validation/judge/metrics.py ``reading``); ``launched``:
    the processes the harness started, every one a rank; ``steps``: the steps the run was asked
    for, where known."""
    out_dir = Path(out_dir)
    costs = costs or {}
    found = ContractRead(out_dir, launched=max(launched, 1), steps=steps)
    log: TrainingLog | None = _file(found, TRAINING_CSV, (out_dir / TRAINING_CSV).is_file(), read_training_log,
                                    lambda log: _csv_detail(log, out_dir / TRAINING_CSV), _adapter_found_nothing(out_dir))
    if log is not None:
        found.csv = log.rows
        if log.reruns:
            found.reruns[TRAINING_CSV] = log.reruns
        _csv_columns(found, costs)
    beats = any(out_dir.glob("heartbeat_rank*.jsonl"))
    if not beats and HEARTBEATS in _adapter_unmeasured(out_dir):
        found.items.append(Item(HEARTBEAT_GLOB, Presence.MISSING, "UNMEASURED: rank_step_time_ratio, idle_ranks, "
                                "fallbacks_total (the trainer's format writes none; its adapter said so)", False))
    logs: dict[int, HeartbeatLog] = _file(found, HEARTBEAT_GLOB, beats, read_heartbeat_logs,
                                          lambda logs: _beats_detail(logs, out_dir)) \
        if beats or HEARTBEATS not in _adapter_unmeasured(out_dir) else {}
    logs = logs or {}
    found.heartbeats = {rank: hb.records for rank, hb in logs.items()}
    found.reruns.update({heartbeat_name(rank): hb.reruns for rank, hb in sorted(logs.items()) if hb.reruns})
    found.shared = {rank: hb.shared for rank, hb in logs.items() if hb.shared}
    if log is not None and TRAINING_CSV in found.reruns and not found.reruns.keys() - {TRAINING_CSV}:
        _rows_again_of_one_process(found, log, logs.get(0))
    found.env = _file(found, ENV_JSON, (out_dir / ENV_JSON).is_file(), read_env_json, lambda env: f"{len(env)} keys")
    if found.env is not None:
        _env_fields(found, costs)
        # a restart that wrote no step again leaves training.csv without a trace of it
        found.items += [Item(ENV_JSON, Presence.PRESENT, f"restarted into the same files: {r.text()}", False,
                             "adapter.restarts") for r in adapter_restarts(found.env)]
        if found.csv is not None:
            _global_rate(found)
    if found.heartbeats:
        _heartbeat_fields(found, costs)
    # written when the harness asks for a profile (CONTRACT_PROFILE_STEPS): checked where present,
    # by the readers a profile point's judgement uses
    for name, reader, detail in ((PROFILE_JSON, read_profile, lambda p: f"{p.profiled_steps} profiled steps"),
                                 (GPU_TIMELINE, read_gpu_timeline,
                                  lambda t: f"{len(t.intervals_us)} device intervals in its window")):
        if (out_dir / name).is_file():
            _file(found, name, True, reader, detail)
    found.halted = halted(out_dir)
    if found.halted:
        text = (out_dir / HALT).read_text(errors="replace").strip()
        found.items.append(Item(HALT, Presence.PRESENT, f"run stopped: {text[:EXCERPT_CHARS] or 'empty file'}", False))
    for rank, path in stackdumps(out_dir).items():
        found.items.append(_ranked(found, path.name, rank, "stack dump of rank"))
    for path in unranked_stackdumps(out_dir):
        found.items.append(Item(path.name, Presence.PRESENT, "stack dump of a rank the trainer's files do not name",
                                False))
    for path in empty_stackdumps(out_dir):
        found.items.append(Item(path.name, Presence.EMPTY, _empty_dump_detail(path), False))
    return found


def _empty_dump_detail(path: Path) -> str:
    """What an empty stack dump file is counted as, and what it was to hold."""
    m = STACKDUMP_PATTERN.match(path.name)
    whose = f"rank {m.group(1)}" if m else "a rank the trainer's files do not name"
    size = path.stat().st_size
    held = "0 bytes" if size == 0 else f"{size} bytes, whitespace only"
    return (f"{held}: counted as no stack dump of {whose}; expected Python faulthandler output of {whose}'s threads "
            "('Thread 0x... (most recent call first):' and its 'File \"...\", line N in func' lines). A trainer "
            "opens the file for faulthandler at start: a rank that never dumped, or was killed (SIGKILL) before it "
            "could, leaves it so")


def silent_ranks(found: ContractRead) -> list[Item]:
    """A missing item per rank below env.json's world_size that wrote no heartbeat file, or a file
    without a record (the contract: every rank beats). For check-artifacts: in an acceptance run
    such a rank is an idle rank (the idle_ranks gate, with its finding), not a broken file.
    Where no rank wrote a heartbeat file the file's own item is missing already; where every rank
    wrote an empty one, each is named here (the idle finding makes such a run NO-GO)."""
    world = found.world_size
    if world is None or not found.heartbeats:
        return []
    said = f"env.json says world_size {world}" if world == found.env_world_size else found.world_text()
    return [Item(heartbeat_name(r), Presence.MISSING,
                 f"{'no record written' if r in found.heartbeats else 'not written'} ({said})")
            for r in range(world) if not found.heartbeats.get(r)]


def _ranked(found: ContractRead, name: str, rank: int, what: str) -> Item:
    """A rank-numbered file: malformed when env.json says that rank does not exist."""
    world = found.world_size
    if world is not None and rank >= world:
        return Item(name, Presence.MALFORMED, f"rank {rank} does not exist ({found.world_text()})", False)
    return Item(name, Presence.PRESENT, f"{what} {rank}", False)


def _file(found: ContractRead, name: str, exists: bool, reader: Callable[[Path], Any],
          detail: Callable[[Any], str], why_missing: str | None = None) -> Any:
    if not exists:
        found.items.append(Item(name, Presence.MISSING, "not written" + (f": {why_missing}" if why_missing else "")))
        return None
    try:
        value = reader(found.out_dir)
    except ArtifactError as exc:  # the reader's message names the file; the item names it too
        where, said = _named_file(found.out_dir, str(exc))
        found.items.append(Item(where or name, Presence.MALFORMED, said))
        return None
    found.items.append(Item(name, Presence.PRESENT, detail(value)))
    return value


def _named_file(out_dir: Path, text: str) -> tuple[str | None, str]:
    """A reader's error split into the file it names (relative to the run directory) and what it
    says of it: ('heartbeat_rank1.jsonl', 'line 14 is not JSON'). The file is kept because an item
    of several files (heartbeat_rank{R}.jsonl) would otherwise not say which rank's file broke;
    (None, text) where the message names no file of the directory."""
    head, sep, said = text.partition(": ")
    if not sep or not head.startswith("/"):
        return None, text
    path = Path(head)
    return (path.name if path.parent == Path(out_dir) else None), said


def _csv_detail(log: TrainingLog, path: Path) -> str:
    df = log.rows
    torn = torn_last_row(path)
    cut = f"; the last row has no line end (cut off mid-write), not read: {torn[:EXCERPT_CHARS]!r}" if torn else ""
    dropped = sum(r.dropped for r in log.reruns)
    rows = f"{len(df)} rows read of {len(df) + dropped} in the file" if dropped else f"{len(df)} rows"
    return f"{rows}, steps {int(df['step'].min())}..{int(df['step'].max())}{_rerun_detail(log.reruns)}{cut}"


def _rerun_detail(reruns: list[Rerun]) -> str:
    """'; resumed in place: went back from step 10 to step 7 (...), the later occurrence read'."""
    if not reruns:
        return ""
    return f"; resumed in place: {'; '.join(r.text() for r in reruns)}, the later occurrence read"


#: what an absent optional field costs when the caller did not name the metrics (check-artifacts)
_METRICS_UNMEASURED = "the metrics that read this field are UNMEASURED"


def _unmeasured(costs: Costs, key: str, otherwise: str) -> str:
    return f"UNMEASURED: {', '.join(costs[key])}" if key in costs else otherwise


def _csv_columns(found: ContractRead, costs: Costs) -> None:
    df = found.csv
    underived = adapter_unmeasured(_adapter_env(found.out_dir))
    for col in CSV_COLUMNS:
        if df[col].isna().all() and col in CSV_VALUED and col not in underived:
            found.items.append(Item(TRAINING_CSV, Presence.MALFORMED, "no value in any row", field=col))
        elif df[col].isna().all():
            # the adapter's reason where it gave one (no TensorBoard events, no tokens per step): the
            # column alone does not tell a user which of their flags or files it lacks
            why = f": {underived[col]}" if col in underived else ""
            found.items.append(Item(TRAINING_CSV, Presence.MISSING,
                                    _unmeasured(costs, col, f"no value in any row{why} ({_METRICS_UNMEASURED})"),
                                    False, col))
        elif col in underived and (bad := _not_finite(df, col)):
            # steps whose value the trainer's own files do not hold, as its adapter says: evidence
            # missing (the metrics reading the column UNMEASURED), not a row the trainer wrote wrong
            found.items.append(Item(TRAINING_CSV, Presence.MISSING, f"{bad}: {underived[col]} "
                                    f"({_unmeasured(costs, col, _METRICS_UNMEASURED)})", False, col))
        elif col in CSV_FINITE and (bad := _not_finite(df, col)):
            found.items.append(Item(TRAINING_CSV, Presence.MALFORMED,
                                    f"{bad}: every logged step's {col} must be a finite number", field=col))


#: what an adapter names in ``adapter.unmeasured`` for a format without heartbeat files
HEARTBEATS = "heartbeats"
#: the one key of ``adapter.read`` where an adapter found none of its trainer's files; its value
#: says what it looked for
ADAPTER_READ_NOTHING = "(nothing)"


def adapter_unmeasured(env: dict | None) -> dict[str, str]:
    """What an adapter said its trainer's files could not give, and why (env.json's
    ``adapter.unmeasured``, validation/contract/adapters): training.csv columns (nan throughout is
    then no data, not a trainer's broken row) and ``heartbeats``; a trainer's own env.json carries
    no such key."""
    said = (env or {}).get("adapter")
    said = said.get("unmeasured") if isinstance(said, dict) else None
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}


def adapter_name(env: dict | None) -> str | None:
    """The adapter that wrote the contract files from its trainer's own (env.json's ``adapter.name``);
    None of a trainer's own env.json, which carries no such key."""
    said = (env or {}).get("adapter")
    return str(said.get("name")) if isinstance(said, dict) else None


def adapter_summary_step(env: dict | None) -> int | None:
    """The step at which the trainer's own summary says its run ended (env.json's
    ``adapter.summary_step``: a Hugging Face Trainer's, as ``train()`` returns); None where an
    adapter read none, and of a trainer's own env.json."""
    said = (env or {}).get("adapter")
    step = said.get("summary_step") if isinstance(said, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass(frozen=True)
class TrainedSteps:
    """The steps that a run's own records show it trained, where its format writes no heartbeats
    (env.json's ``adapter.trained``, written by an adapter that can tell them): of a run resumed
    from another's checkpoint, its saved state also holds the earlier run's steps, which this run
    did not train (the adapter leaves them out of training.csv)."""

    first: int
    last: int
    records: str
    """What shows them: 'its TensorBoard events'."""
    files: tuple[str, ...] = ()
    """Those records' files, relative to the run directory where they lie in it."""


def adapter_trained(env: dict | None) -> TrainedSteps | None:
    """env.json's ``adapter.trained``; None where an adapter could not tell (or wrote none), and of
    a trainer's own env.json."""
    said = (env or {}).get("adapter")
    said = said.get("trained") if isinstance(said, dict) else None
    try:
        trained = TrainedSteps(**{**said, "files": tuple(said.get("files", ()))})
    except (TypeError, AttributeError):
        return None
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (trained.first, trained.last))
    return trained if ok else None


def adapter_restarts(env: dict | None) -> list[Restart]:
    """env.json's ``adapter.restarts``: the later processes of a run restarted into the same files, as
    its adapter read them; [] where it read none (or wrote no such key), and of a trainer's own env.json."""
    said = (env or {}).get("adapter")
    said = said.get("restarts") if isinstance(said, dict) else None
    try:
        return [Restart(**r) for r in said] if isinstance(said, list) else []
    except TypeError:
        return []


def _adapter_env(out_dir: Path) -> dict | None:
    """``out_dir``'s env.json, where it is readable (None otherwise: its own item says why)."""
    try:
        env = read_env_json(out_dir)
    except (ArtifactError, OSError):
        return None
    return env if isinstance(env, dict) else None


def adapter_unreadable(env: dict | None) -> dict[str, str]:
    """The trainer's files its adapter found and could not read, and why (env.json's
    ``adapter.unreadable``: a trainer_state.json cut off): said beside what it read, never listed
    as read; the rows are then what its other files hold."""
    said = (env or {}).get("adapter")
    said = said.get("unreadable") if isinstance(said, dict) else None
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}


def _adapter_unmeasured(out_dir: Path) -> frozenset[str]:
    """adapter_unmeasured's keys, of ``out_dir``'s env.json."""
    return frozenset(adapter_unmeasured(_adapter_env(out_dir)))


def _adapter_found_nothing(out_dir: Path) -> str | None:
    """'hf_trainer found no trainer_state.json, ...': where an adapter wrote the contract from a
    trainer's output folder that held none of its files (env.json's ``adapter.read`` names nothing),
    what it looked for; None otherwise."""
    said = (_adapter_env(out_dir) or {}).get("adapter")
    read = said.get("read") if isinstance(said, dict) else None
    if not isinstance(read, dict) or set(read) != {ADAPTER_READ_NOTHING}:
        return None
    return f"its adapter ({said.get('name')}) found {read[ADAPTER_READ_NOTHING]}"


def _not_finite(df: pd.DataFrame, col: str) -> str:
    """'step 7 holds nan (1 of 8 rows)': the first logged step whose ``col`` is not a finite
    number, or '' when every row's is."""
    bad = df[~df[col].map(math.isfinite)]
    if bad.empty:
        return ""
    first = bad.iloc[0]
    return f"step {int(first['step'])} holds {first[col]} ({len(bad)} of {len(df)} rows)"


def _beats_detail(logs: dict[int, HeartbeatLog], out_dir: Path) -> str:
    def one(rank: int, hb: HeartbeatLog) -> str:
        torn = torn_last_row(out_dir / heartbeat_name(rank))
        cut = f"; its last record has no line end (cut off mid-write?): {torn[:EXCERPT_CHARS]!r}" if torn else ""
        return f"rank {rank}: {len(hb.records)} records{_rerun_detail(hb.reruns)}{cut}"

    return ", ".join(one(r, hb) for r, hb in sorted(logs.items()))


def _heartbeat_fields(found: ContractRead, costs: Costs) -> None:
    for rank, recs in sorted(found.heartbeats.items()):
        name = heartbeat_name(rank)
        ranked = _ranked(found, name, rank, "heartbeats of rank")
        if ranked.problem:
            found.items.append(ranked)
            continue
        if rank in found.shared:
            found.items.append(Item(name, Presence.MALFORMED, _shared_detail(found.shared[rank])))
            continue
        for i, rec in enumerate(recs):
            lacking = [f for f in HEARTBEAT_REQUIRED if not _number(rec.get(f))]
            said = rec.get("rank")
            if lacking:
                found.items.append(Item(name, Presence.MALFORMED,
                                        f"record {i + 1} has no numeric {', '.join(repr(f) for f in lacking)} "
                                        f"({_held(rec, lacking)}) (keys: {', '.join(sorted(rec))})"))
                break
            if _number(said) and said != rank:
                found.items.append(Item(name, Presence.MALFORMED, f"record {i + 1} says rank {said} in the file of "
                                                                  f"rank {rank}"))
                break
        else:
            skipped = _steps_never_started(recs)
            if skipped:
                found.items.append(Item(name, Presence.MALFORMED, skipped, field="step"))
    if not any("fallbacks" in r or any(k.startswith("fb_") for k in r) for recs in found.heartbeats.values()
               for r in recs):
        found.items.append(Item(HEARTBEAT_GLOB, Presence.MISSING,
                                _unmeasured(costs, "fallbacks", f"no fallback counters ({_METRICS_UNMEASURED})"),
                                False, "fallbacks"))


#: steps named of those a rank never started
LISTED_STEPS = 6


def _steps_never_started(recs: list[dict[str, Any]]) -> str:
    """What a rank's records say of steps it counts but never started, '' where none: a process
    that records the stages within its steps records them for every step it runs, so a step
    between two it records stages of, with none of its own, never started (a step counter that
    moves by two each step: the CSV and the heartbeats then claim twice the steps the run did)."""
    by_pid: dict[Any, set[int]] = {}
    for rec in recs:
        step = rec.get("step")
        if rec.get("stage") in HEARTBEAT_STAGES_IN_STEP and _number(step) and float(step).is_integer():
            by_pid.setdefault(rec.get("pid"), set()).add(int(step))
    for pid, steps in by_pid.items():
        missing = sorted(set(range(min(steps), max(steps) + 1)) - steps)
        if missing:
            named = ", ".join(map(str, missing[:LISTED_STEPS])) + (
                f" and {len(missing) - LISTED_STEPS} more" if len(missing) > LISTED_STEPS else "")
            who = f" (pid {pid})" if pid is not None else ""
            return (f"stages{who} of {len(steps)} steps from {min(steps)} to {max(steps)}, but of none of steps "
                    f"{named}: those steps were counted and never started (the step number moves by more than one "
                    "a step?). A record of a stage within a step is written for every step the rank runs")
    return ""


def _shared_detail(writers: tuple[Writer, ...]) -> str:
    """What a heartbeat file several processes wrote at once is, and what the contract asks."""
    ranks = {w.rank for w in writers}
    who = "ranks" if len(ranks) == len(writers) and None not in ranks else "processes"
    return (f"{len(writers)} {who} wrote this one file at once, their records interleaved: "
            f"{'; '.join(w.text() for w in writers)}. Every rank writes its own heartbeat_rank{{R}}.jsonl, R its "
            "global rank (torchrun's RANK; LOCAL_RANK repeats on every node)")


def _env_fields(found: ContractRead, costs: Costs) -> None:
    env = found.env or {}
    for key in ENV_REQUIRED:
        if found.world_size is None:
            found.items.append(Item(ENV_JSON, Presence.MISSING if key not in env else Presence.MALFORMED,
                                    f"expected an integer >= 1, got {env.get(key)!r}", field=key))
        elif found.launched > 1 and found.env_world_size != found.launched:
            found.items.append(Item(ENV_JSON, Presence.MALFORMED,
                                    f"{found.env_world_size}, but {found.launched} processes were launched, "
                                    "and every one is a rank", field=key))
    for key, cost in ENV_RECOMMENDED.items():
        if env.get(key) is None:
            found.items.append(Item(ENV_JSON, Presence.MISSING, _unmeasured(costs, key, cost), False, key))


#: how far toks_per_s x step_time_s may lie from env.json's tokens_per_step (a factor either way)
#: before the rate is not the global one: timing where the two are taken differs by far less, and
#: a per-rank rate of two ranks is off by 2
RATE_FACTOR = 1.5


@dataclass(frozen=True)
class LoggedAgain:
    """A step training.csv logs more than once while one process wrote the run (no resume in place)."""

    step: int
    """The first step logged again."""
    rows: int
    """The rows of that step in the file."""
    later: int | None
    """The highest step the file logs after that step's first row; None where it logs none above
    it: the run never got past that step."""
    again: int
    """The rows in all that log a step again (of this step or any other)."""
    steps: int | None
    """The steps the run was asked for, where known."""
    pid: int
    beats: tuple[int, int]
    """The first and last step of rank 0's heartbeats, all of process ``pid``."""

    def text(self) -> str:
        """What the file shows, the repeated step first, then what tells that one process wrote it
        and what can make it so."""
        asked = f" of the {self.steps} asked" if self.steps else ""
        if self.later is None:
            head = (f"step {self.step} logged {_times(self.rows)} and no step after it: the run never got past step "
                    f"{self.step}{asked}")
            cause = ("a loop that logs its step again without moving on (a step counter not advanced, the same step "
                     "retried), or a second writer (every rank appending its rows?)")
        else:
            head = f"step {self.step} logged {_times(self.rows)}, then steps up to {self.later}"
            cause = "a second writer (every rank appending its rows?) or a step logged twice"
        others = f" ({self.again} rows log a step again in all)" if self.again != self.rows - 1 else ""
        first, last = self.beats
        return (f"{head}{others}, yet one process wrote the run: rank 0's heartbeats, every one from pid {self.pid}, "
                f"cover steps {first}..{last} and never go back. Only a resume in place (a new process) may log a "
                f"step again; training.csv is rank 0's alone, one row per step: {cause}")


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def _rows_again_of_one_process(found: ContractRead, log: TrainingLog, rank0: HeartbeatLog | None) -> None:
    """training.csv went back (a step logged again) while rank 0's heartbeats, each carrying the
    same pid, show one process from before the step it went back to through it, and no heartbeat
    file went back: no resume in place, which starts a new process and writes the steps after its
    checkpoint again. Malformed (``LoggedAgain``): a second writer (every rank appending its rows),
    a step logged twice, or a loop that logs its step again and never moves on, whose later rows
    the readers would take for what happened. Without pids, nothing is said."""
    if rank0 is None:
        return
    pids = {r.get("pid") for r in rank0.records if "step" in r}
    steps = [r["step"] for r in rank0.records if isinstance(r.get("step"), int)]
    (pid,) = pids if len(pids) == 1 else (None,)
    if not isinstance(pid, int) or isinstance(pid, bool) or not steps:
        return
    reruns = found.reruns[TRAINING_CSV]
    seen = [r for r in reruns if min(steps) < r.first <= max(steps)]
    if not seen:
        return
    del found.reruns[TRAINING_CSV]
    # its line says no resume in place either
    found.items = [dataclasses.replace(i, detail=_csv_detail(dataclasses.replace(log, reruns=[]),
                                                             found.out_dir / TRAINING_CSV))
                   if i.file == TRAINING_CSV and i.presence == Presence.PRESENT else i for i in found.items]
    step = seen[0].first
    after = log.logged[log.logged.index(step):]
    later = max(after) if max(after) > step else None
    again = LoggedAgain(step, log.logged.count(step), later, len(reruns), found.steps, pid, (min(steps), max(steps)))
    found.items.append(Item(TRAINING_CSV, Presence.MALFORMED, again.text(), field="step"))


def _global_rate(found: ContractRead) -> None:
    """training.csv's toks_per_s against env.json's tokens_per_step (global tokens per optimizer
    step) over each row's step_time_s: a rate of one rank (or one micro-batch) beside the global
    step size is malformed; where either is not written nothing is said."""
    per_step = (found.env or {}).get("tokens_per_step")
    df = found.csv
    if not _number(per_step) or per_step <= 0 or df is None:
        return
    rows = df[df["step_time_s"].map(math.isfinite) & (df["step_time_s"] > 0) & df["toks_per_s"].map(math.isfinite)]
    if rows.empty:
        return
    ratio = float((rows["toks_per_s"] * rows["step_time_s"]).median()) / per_step
    if 1 / RATE_FACTOR <= ratio <= RATE_FACTOR:
        return
    world = found.world_size or 1
    hint = (f"; {world} ranks: it reads as one rank's rate" if world > 1 and abs(ratio * world - 1) < 0.2 else "")
    found.items.append(Item(TRAINING_CSV, Presence.MALFORMED, (
        f"toks_per_s x step_time_s is {ratio:.3g}x env.json's tokens_per_step {per_step:g} (the median over "
        f"{len(rows)} rows): toks_per_s is global, all ranks' tokens of all micro-batches over the step's wall "
        f"time{hint}"), field="toks_per_s"))


def _held(rec: dict[str, Any], fields: list[str]) -> str:
    """What a record holds in each of ``fields``: "no 'time'; 'step' is '2', a str"."""
    return "; ".join(f"{f!r} is {rec[f]!r}, a {type(rec[f]).__name__}" if f in rec else f"no {f!r}" for f in fields)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
