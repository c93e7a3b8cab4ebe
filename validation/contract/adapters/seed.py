"""The seed system's trainer (seconds-0/nsa-vibe ``scripts/train_showcase.py``) -> the contract.

What it writes into the ``train.out_dir`` of its YAML config, and what becomes of it here:

- ``training.csv``: no header, ``step,loss,lr,toks_per_s`` every ``log_every`` steps from rank 0,
  appended across runs -> the contract's header, the last run's rows only (a step number that
  does not grow starts a new run), ``nan`` in the columns it lacks (step time, grad norm,
  memory: their metrics are UNMEASURED).
- ``heartbeat_rank{R}.jsonl`` with ``ts`` and ``msg``/``phase`` -> ``time`` and ``stage``; other
  ranks beat per step only with ``NSA_HEARTBEAT_EVERY=1`` (the runbook sets it).
- ``env.json`` (every rank writes it; no world size, commit or attention backends) -> plus
  ``world_size`` and the trainer's commit, as the harness knows them.
- ``.HALT`` as text (``halt: nan_loss``; ``.anomaly_type`` names the reason) -> the contract's JSON
  ``.HALT`` with its source (``nonfinite`` for a NaN, ``watchdog`` for a stall).
- ``stackdump_<epoch>.txt`` / ``watchdog_stackdump_<epoch>.txt`` (``traceback.format_stack`` per
  thread, no rank, no pid; two ranks dumping in one second share a file) -> faulthandler's format,
  each header naming the original file: for one process the latest is ``stackdump_rank0.txt``
  (the only rank); under torchrun each is ``stackdump_unranked{i}.txt``, rank unknown: the order
  of the files says nothing about whose they are.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nsa.contract import CSV_COLUMNS, ENV_JSON, HALT, TRAINING_CSV
from validation.contract.adapters.base import Adapter, RunFacts
from validation.contract.stacks import UNRANKED_DUMP

SEED_COLUMNS = ("step", "loss", "lr", "toks_per_s")
_DUMP = re.compile(r"^(watchdog_)?stackdump_(\d+)\.txt$")
_BEAT = re.compile(r"^heartbeat_rank(\d+)\.jsonl$")
_THREAD = re.compile(r"^--- Thread: (?P<name>.*) \((?P<ident>\d+|None)\) ---$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
#: the seed's signal handler, whose own frame tops every stack it dumps: not where the rank was
_HANDLER = "dump_stack"
#: the seed's anomaly words -> the contract's .HALT sources
_HALT_SOURCES = {"nan_loss": "nonfinite", "heartbeat_stall": "watchdog", "throughput_flatline": "watchdog"}


class SeedAdapter(Adapter):
    name = "seed"
    converts = True
    lacks = frozenset({"step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb", "attention_backends",
                       "tokens_per_step", "fallbacks"})

    def trainer_dir(self, out_dir: Path) -> Path:
        return out_dir / "trainer_out"

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        last_step = _csv(trainer_dir / TRAINING_CSV, out_dir / TRAINING_CSV)
        beat_step = _heartbeats(trainer_dir, out_dir)
        _env(trainer_dir / ENV_JSON, out_dir / ENV_JSON, facts)
        _halt(trainer_dir, out_dir / HALT, beat_step if beat_step is not None else last_step)
        _stackdumps(trainer_dir, out_dir, facts.world_size)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _csv(src: Path, dst: Path) -> int | None:
    """The last run's rows under the contract's header; returns the last step logged."""
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
    _atomic(dst, "\n".join([",".join(CSV_COLUMNS), *lines]) + "\n")
    return prev


def _heartbeats(trainer_dir: Path, out_dir: Path) -> int | None:
    """Each rank's records with ``time``/``stage``; returns the highest step any rank reached."""
    top = None
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
            rec = {"time": rec.get("ts"), "rank": int(m.group(1)), "stage": rec.get("phase") or rec.get("msg"), **rec}
            if isinstance(rec.get("step"), int) and rec["step"] > 0:
                top = max(top or 0, rec["step"])
            out.append(json.dumps(rec))
        _atomic(out_dir / src.name, "".join(line + "\n" for line in out))
    return top


def _env(src: Path, dst: Path, facts: RunFacts) -> None:
    if not src.is_file():
        return
    try:
        env = json.loads(src.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        _atomic(dst, src.read_text(errors="replace"))  # malformed stays malformed, for the check to name
        return
    if isinstance(env, dict):
        seen = env.get("env") if isinstance(env.get("env"), dict) else {}
        # the toggles it saw; not CONFIG (a per-run path) nor torchrun's RANK/WORLD_SIZE
        env = {**env, "env": {k: v for k, v in seen.items() if k.startswith("NSA_")},
               "world_size": facts.world_size, "trainer": facts.trainer,
               "git_sha": facts.trainer_sha, "git_sha_source": facts.trainer_sha_source}
    _atomic(dst, json.dumps(env, indent=2))


def _halt(trainer_dir: Path, dst: Path, step: int | None) -> None:
    src = trainer_dir / HALT
    if not src.exists():
        return
    text = src.read_text(errors="replace").strip()
    anomaly = trainer_dir / ".anomaly_type"
    word = anomaly.read_text(errors="replace").strip() if anomaly.is_file() else text.removeprefix("halt:").strip()
    record: dict[str, Any] = {"source": _HALT_SOURCES.get(word, word or "operator"), "step": step, "text": text}
    _atomic(dst, json.dumps(record))


def _stackdumps(trainer_dir: Path, out_dir: Path, world_size: int) -> None:
    found = []
    for p in trainer_dir.iterdir():
        m = _DUMP.match(p.name)
        if m:
            found.append((int(m.group(2)), p.name, p))
    found.sort()
    if world_size == 1 and found:  # one process: its latest dump is rank 0's
        _, name, path = found[-1]
        _atomic(out_dir / "stackdump_rank0.txt", _faulthandler_text(name, path.read_text(errors="replace"),
                                                                    "the only process: rank 0"))
        return
    for i, (_, name, path) in enumerate(found):
        _atomic(out_dir / UNRANKED_DUMP.format(i=i), _faulthandler_text(
            name, path.read_text(errors="replace"), "rank unknown: the trainer does not record its rank"))


def _faulthandler_text(name: str, text: str, rank: str) -> str:
    """``--- Thread: NAME (IDENT) ---`` + ``traceback.format_stack`` (oldest first) -> faulthandler's
    ``Thread 0x.. (most recent call first):`` + ``File "f", line N in func`` lines."""
    first = text.splitlines()[0] if text else ""
    out = [f"=== {name} ({first.strip()}); {rank} ==="]
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
