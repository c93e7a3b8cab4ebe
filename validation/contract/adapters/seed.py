"""The seed system's trainer (seconds-0/nsa-vibe ``scripts/train_showcase.py``) -> the contract.

What it writes into the ``train.out_dir`` of its YAML config, and what becomes of it here:

- ``training.csv``: no header, ``step,loss,lr,toks_per_s`` every ``log_every`` steps from rank 0,
  appended across runs -> the contract's header, the last run's rows only (a step number that
  does not grow starts a new run), ``nan`` in the columns it lacks (step time, grad norm,
  memory: their metrics are UNMEASURED).
- ``heartbeat_rank{R}.jsonl`` with ``ts`` and ``msg``/``phase`` -> ``time`` and ``stage``; other
  ranks beat per step only with ``NSA_HEARTBEAT_EVERY=1`` (the runbook sets it). A record of a
  step's own takes the contract's stage (``_STAGES``), so that its ``step`` says whether that step
  was in progress or done; the seed's words stay in ``msg`` and ``phase``.
- ``env.json`` (every rank writes it; no world size, commit or attention backends) -> plus
  ``world_size``, and the trainer's commit as the harness found it where the file names none
  (a commit it names is kept: the trainer's own word).
- ``.HALT`` as text (``halt: nan_loss``; ``.anomaly_type`` names the reason) -> the contract's JSON
  ``.HALT`` with its source (``nonfinite`` for a NaN, ``watchdog`` for a stall).
- ``stackdump_<epoch>.txt`` (its SIGUSR1/SIGTERM handler) and ``watchdog_stackdump_<epoch>.txt``
  (its own watchdog), ``traceback.format_stack`` per thread, no rank or pid in them ->
  faulthandler's format, each header naming the original file. A rank only where the files say
  it: a watchdog dump is announced in the writer's own heartbeat file (``watchdog_dump`` with its
  path), and a run of one process has only rank 0. Any other dump is ``stackdump_unranked{i}``
  (rank unknown), never numbered by time. Ranks that dump in the same second write one file
  name: a file holding more than one dump is split, and its header says so. Of several dumps of
  one rank the latest is the rank's file; its header names the earlier ones (still in the
  trainer's directory).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsa.atomic import write_atomic
from nsa.contract import CSV_COLUMNS, ENV_JSON, HALT, TRAINING_CSV, stackdump_name
from validation.contract.adapters.base import (
    GIVEN,
    Adapter,
    Converted,
    FileOrigin,
    KeyOrigin,
    Origin,
    RunFacts,
    given_commit,
)
from validation.contract.stacks import UNRANKED_DUMP

SEED_COLUMNS = ("step", "loss", "lr", "toks_per_s")
_DUMP = re.compile(r"^(watchdog_)?stackdump_(\d+)\.txt$")
_BEAT = re.compile(r"^heartbeat_rank(\d+)\.jsonl$")
_THREAD = re.compile(r"^--- Thread: (?P<name>.*) \((?P<ident>\d+|None)\) ---$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
#: the seed's signal handler, whose own frame tops every stack it dumps: not where the rank was
_HANDLER = "dump_stack"
#: the seed's heartbeat words (``msg``) of a step's own records -> the contract's stages
#: (nsa/contract.py): its ``beat`` (phase ``step_start``) is written as a step starts, before the
#: batch is loaded, so the step is in progress (``data``); ``progress`` and ``step_end`` (phase
#: ``end``) once a logged step is done (``step``). Its other words (``boot``, ``watchdog_dump``, the
#: loader's) are of no step and stay as they are: the contract names no such stage.
_STAGES = {"beat": "data", "progress": "step", "step_end": "step"}
#: the seed's anomaly words -> the contract's .HALT sources
_HALT_SOURCES = {"nan_loss": "nonfinite", "heartbeat_stall": "watchdog", "throughput_flatline": "watchdog"}


class SeedAdapter(Adapter):
    name = "seed"
    converts = True
    lacks = frozenset({"step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb", "attention_backends",
                       "tokens_per_step", "fallbacks"})

    def in_format(self, trainer_dir: Path) -> bool:
        """The seed's training.csv has no header: one that begins with the contract's is not the
        seed's (read as the seed's, its rows would be split into 'runs' wherever a step repeats)."""
        csv = trainer_dir / TRAINING_CSV
        if not csv.is_file():
            return True
        with open(csv, errors="replace") as fh:
            return fh.readline().strip() != ",".join(CSV_COLUMNS)

    def trainer_dir(self, out_dir: Path) -> Path:
        return out_dir / "trainer_out"

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> Converted:
        out_dir.mkdir(parents=True, exist_ok=True)
        files: dict[str, FileOrigin] = {}
        last_step = _csv(trainer_dir / TRAINING_CSV, out_dir / TRAINING_CSV, files)
        beats = _heartbeats(trainer_dir, out_dir, files)
        world_size, origins = _env(trainer_dir / ENV_JSON, out_dir / ENV_JSON, facts, files)
        beat_step = max((r["step"] for recs in beats.values() for r in recs
                         if isinstance(r.get("step"), int) and r["step"] > 0), default=None)
        _halt(trainer_dir, out_dir / HALT, beat_step if beat_step is not None else last_step, files)
        _stackdumps(trainer_dir, out_dir, world_size, beats, files)
        return Converted(origins, files)


def _csv(src: Path, dst: Path, files: dict[str, FileOrigin]) -> int | None:
    """The last run's rows under the contract's header, and where they came from (into ``files``);
    returns the last step logged."""
    if not src.is_file():
        return None
    runs: list[list[list[str]]] = [[]]
    prev = None
    for line in src.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        step = int(cells[0]) if cells[0].isdigit() else None
        if step is not None and prev is not None and step <= prev:
            runs.append([])  # the step went back: a new run appended to the same file
        prev = step if step is not None else prev
        runs[-1].append(cells)
    rows = runs[-1]
    pad = ["nan"] * (len(CSV_COLUMNS) - len(SEED_COLUMNS))
    # a row of another width is kept as is: the contract check names it, rather than this guess
    lines = [",".join(r + pad if len(r) == len(SEED_COLUMNS) else r) for r in rows]
    write_atomic(dst, "\n".join([",".join(CSV_COLUMNS), *lines]) + "\n")
    files[dst.name] = FileOrigin(Origin.DERIVED, f"from the trainer's {src.name}: the contract's header over its last "
                                                 "run's rows, nan in the columns it lacks")
    return prev


def _heartbeats(trainer_dir: Path, out_dir: Path, files: dict[str, FileOrigin]) -> dict[int, list[dict[str, Any]]]:
    """Each rank's records with ``time``/``stage`` added, written out (where each file came from
    into ``files``) and returned by rank."""
    beats: dict[int, list[dict[str, Any]]] = {}
    for src in sorted(trainer_dir.glob("heartbeat_rank*.jsonl")):
        m = _BEAT.match(src.name)
        if not m:
            continue
        out = []
        for line in src.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line of a killed writer
            if not isinstance(rec, dict):
                continue
            stage = _STAGES.get(rec.get("msg")) or rec.get("phase") or rec.get("msg")
            rec = {"time": rec.get("ts"), "rank": int(m.group(1)), "stage": stage, **rec}
            out.append(rec)
        beats[int(m.group(1))] = out
        write_atomic(out_dir / src.name, "".join(json.dumps(rec) + "\n" for rec in out))
        # one origin for every rank's file, as check-artifacts lists them as one item
        files[src.name] = FileOrigin(Origin.DERIVED, "from the trainer's file of that name: time and stage added from "
                                                     "its ts and msg/phase")
    return beats


def _env(src: Path, dst: Path, facts: RunFacts, files: dict[str, FileOrigin]) -> tuple[int, dict[str, KeyOrigin]]:
    """env.json with world_size and the trainer's commit added (where it came from into ``files``);
    returns the world size: the WORLD_SIZE the trainer itself recorded (torchrun's), else the
    processes the harness started; and where each key of the env.json written came from (none
    where it is not an object)."""
    if not src.is_file():
        return facts.world_size, {}
    try:
        env = json.loads(src.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        write_atomic(dst, src.read_text(errors="replace"))  # malformed stays malformed, for the check to name
        files[dst.name] = FileOrigin(Origin.TRAINER, f"(copied unchanged from the trainer's {src.name})")
        return facts.world_size, {}
    world = facts.world_size
    origins: dict[str, KeyOrigin] = {}
    files[dst.name] = FileOrigin(Origin.TRAINER, f"(the trainer's {src.name}, not an object: nothing added)")
    if isinstance(env, dict):
        seen = env.get("env") if isinstance(env.get("env"), dict) else {}
        recorded = str(seen.get("WORLD_SIZE", "")).isdigit()
        world = int(seen["WORLD_SIZE"]) if recorded else world
        own_commit = _names_commit(env)
        origins = _env_origins(env, recorded, own_commit)
        # the toggles it saw; not CONFIG (a per-run path) nor torchrun's RANK/WORLD_SIZE
        env = {**env, "env": {k: v for k, v in seen.items() if k.startswith("NSA_")},
               "world_size": world, "trainer": facts.trainer}
        if not own_commit:  # the commit the trainer recorded is its own word, over what the harness found
            env.update(given_commit(facts))
        files[dst.name] = FileOrigin(Origin.DERIVED, f"from the trainer's {src.name}: world_size and trainer set"
                                                     + ("" if own_commit else ", the commit added")
                                                     + ", its env kept to the NSA_* variables")
    write_atomic(dst, json.dumps(env, indent=2))
    return world, origins


def _names_commit(trainer_env: dict[str, Any]) -> bool:
    """Whether the trainer's own env.json records its commit (``git_sha``, any text: what it is, a
    revision or not, is the record's to judge, validation/judge/provenance.py)."""
    sha = trainer_env.get("git_sha")
    return isinstance(sha, str) and bool(sha.strip())


def _env_origins(trainer_env: dict[str, Any], world_recorded: bool, own_commit: bool) -> dict[str, KeyOrigin]:
    """Where each key of the env.json ``_env`` writes from the trainer's own ``trainer_env`` came
    from: the trainer's keys as it wrote them, its ``env`` kept to NSA_* (an empty one where it
    wrote none), the world size from the WORLD_SIZE it recorded (``world_recorded``) or the harness,
    and the commit from the harness where the trainer recorded none (``own_commit``)."""
    own = KeyOrigin(Origin.TRAINER, "in its env.json")
    origins = {key: own for key in trainer_env}
    origins["env"] = (KeyOrigin(Origin.TRAINER, "in its env.json's env, kept to the NSA_* variables")
                      if isinstance(trainer_env.get("env"), dict)
                      else KeyOrigin(Origin.FILLED, "(an empty mapping: the trainer's env.json has no env)"))
    origins["trainer"] = GIVEN["trainer"]
    if not own_commit:
        origins.update({key: GIVEN[key] for key in ("git_sha", "git_sha_source")})
    origins["world_size"] = (KeyOrigin(Origin.DERIVED, "from the trainer's env.json's env.WORLD_SIZE (torchrun's)")
                             if world_recorded else GIVEN["world_size"])
    return origins


def _halt(trainer_dir: Path, dst: Path, step: int | None, files: dict[str, FileOrigin]) -> None:
    """The contract's JSON .HALT of the trainer's text one, at ``step`` (where it came from into ``files``)."""
    src = trainer_dir / HALT
    if not src.exists():
        return
    text = src.read_text(errors="replace").strip()
    anomaly = trainer_dir / ".anomaly_type"
    word = anomaly.read_text(errors="replace").strip() if anomaly.is_file() else text.removeprefix("halt:").strip()
    record: dict[str, Any] = {"source": _HALT_SOURCES.get(word, word or "operator"), "step": step, "text": text}
    write_atomic(dst, json.dumps(record))
    reason = f"{anomaly.name}'s reason" if anomaly.is_file() else "the reason in it"
    files[dst.name] = FileOrigin(Origin.DERIVED, f"from the trainer's text {src.name}: as JSON, with {reason} as "
                                                 "its source and the step of its last heartbeat or row")


@dataclass(frozen=True)
class _Dump:
    """One stack dump found in the trainer's directory."""

    file: str
    epoch: int
    text: str
    shared: int = 1
    """How many dumps the file held (ranks dumping in the same second share a file name)."""


def _stackdumps(trainer_dir: Path, out_dir: Path, world_size: int, beats: dict[int, list[dict[str, Any]]],
                files: dict[str, FileOrigin]) -> None:
    """Each rank's latest dump, and those of no known rank, in faulthandler's format (where each
    came from into ``files``)."""
    announced = {Path(str(rec["path"])).name: rank for rank, recs in beats.items() for rec in recs
                 if rec.get("msg") == "watchdog_dump" and rec.get("path")}
    dumps = []
    for path in trainer_dir.iterdir():
        m = _DUMP.match(path.name)
        if m:
            parts = _split(path.read_text(errors="replace"))
            dumps += [_Dump(path.name, int(m.group(2)), part, len(parts)) for part in parts]
    by_rank: dict[int, list[_Dump]] = {}
    unranked: list[_Dump] = []
    for d in sorted(dumps, key=lambda d: (d.epoch, d.file)):
        rank = _rank_of(d, announced, world_size)
        if rank is None:
            unranked.append(d)
        else:
            by_rank.setdefault(rank, []).append(d)
    for rank, ds in by_rank.items():
        *earlier, latest = ds
        how = f"announced in heartbeat_rank{rank}" if latest.file in announced else "the only process"
        said = f"rank {rank} ({how})"
        if earlier:
            said += "; earlier dumps of this rank: " + ", ".join(e.file for e in earlier)
        write_atomic(out_dir / stackdump_name(rank), _faulthandler_text(latest, said))
        files[stackdump_name(rank)] = _dump_origin(latest)
    for i, d in enumerate(unranked):
        # the file is named by the second: ranks dumping in the same second truncate each other's
        said = ("rank unknown: the trainer's signal dumps record neither rank nor pid, and ranks dumping in the "
                "same second write one file (a dump overwritten there is lost)")
        write_atomic(out_dir / UNRANKED_DUMP.format(i=i), _faulthandler_text(d, said))
        files[UNRANKED_DUMP.format(i=i)] = _dump_origin(d)


def _dump_origin(dump: _Dump) -> FileOrigin:
    return FileOrigin(Origin.DERIVED, f"from the trainer's {dump.file}: its traceback.format_stack text in "
                                      "faulthandler's format")


def _rank_of(d: _Dump, announced: dict[str, int], world_size: int) -> int | None:
    """The rank the trainer's files give a dump: the heartbeat file that announced it (unless
    several dumps share the file: which one it announced is unknown), or 0 in a run of one
    process; None otherwise."""
    if d.file in announced and d.shared == 1:
        return announced[d.file]
    return 0 if world_size == 1 else None


#: the first line of every dump the seed writes ('Signal 10 at ...', 'Watchdog at ...')
_DUMP_HEADER = re.compile(r"^(Signal \d+ at |Watchdog at )")


def _split(text: str) -> list[str]:
    """The dumps in one file: a new one starts at each header line, and at a second MainThread
    section (one process has one main thread: the rest of the file is another's)."""
    parts: list[list[str]] = [[]]
    main_seen = False
    for line in text.splitlines():
        t = _THREAD.match(line)
        second_main = t is not None and t["name"] == "MainThread" and main_seen
        if (_DUMP_HEADER.match(line) or second_main) and any(x.strip() for x in parts[-1]):
            parts.append([])
            main_seen = False
        main_seen = main_seen or (t is not None and t["name"] == "MainThread")
        parts[-1].append(line)
    return ["\n".join(p) for p in parts if any(x.strip() for x in p)]


def _faulthandler_text(dump: _Dump, rank: str) -> str:
    """``--- Thread: NAME (IDENT) ---`` + ``traceback.format_stack`` (oldest first) -> faulthandler's
    ``Thread 0x.. (most recent call first):`` + ``File "f", line N in func`` lines, under a header
    naming the original file and how its rank is known."""
    text = dump.text
    first = text.splitlines()[0].strip() if text else ""
    shared = (f"; one of {dump.shared} dumps in that file (processes dumping in the same second)"
              if dump.shared > 1 else "")
    out = [f"=== {dump.file} ({first}): {rank}{shared} ==="]
    frames: list[str] = []

    def flush() -> None:
        while frames and frames[-1].endswith(f" in {_HANDLER}"):
            frames.pop()
        out.extend(reversed(frames))
        frames.clear()

    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            flush()
            ident = int(t["ident"]) if t["ident"].isdigit() else 0
            out.append(f"\nThread {ident:#x} (most recent call first):")
            continue
        f = _FRAME.match(line)
        if f:
            frames.append(f'  File "{f["file"]}", line {f["line"]} in {f["func"]}')
    flush()
    return "\n".join(out) + "\n"
