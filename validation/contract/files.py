"""Readers of the files a trainer leaves (the artifact contract, ``nsa.contract``).

Each reader takes an out_dir and returns plain data, or raises ArtifactError naming the file and
what is wrong with it. Nothing here interprets the numbers: validation/judge does.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsa.contract import (
    CSV_COLUMNS,
    CSV_NON_NEGATIVE,
    ENV_JSON,
    GPU_TIMELINE,
    HALT,
    HEARTBEAT_PATTERN,
    HEARTBEAT_STAGES_AFTER_STEP,
    JSON_NONFINITE,
    PROFILE_JSON,
    STACKDUMP_PATTERN,
    TRAINING_CSV,
)
from validation.contract.reruns import Rerun, latest
from validation.contract.stacks import (UNRANKED_DUMPS, StackDump, TakenStack, import_under_way, loader_wait,
                                        main_thread_frames, parse_faulthandler, parse_pyspy, read_index)
from validation.errors import ArtifactError

if TYPE_CHECKING:
    # pandas (most of a second to import) is imported where a frame is made: the commands and
    # processes that read no CSV (`nsa-validate phases`, --help, the pytest plugin in every pytest
    # process) never import it. Here it names types only (annotations are strings).
    import pandas as pd


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a (log) file, read from its last 64 KiB; '' when it is missing."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def torn_last_row(path: Path) -> str | None:
    """The last line of a text file when it has no line end (a row cut off mid-write: its last
    value may be cut short and still parse), else None."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64 * 1024))
        end = fh.read()
    if not end or end.endswith(b"\n"):
        return None
    return end.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TrainingLog:
    """training.csv as read: its rows, and the steps a resume in place wrote again (reruns.py)."""

    rows: pd.DataFrame
    """One row per step, sorted by step: of a step written twice, the row written later."""
    reruns: list[Rerun]
    logged: tuple[int, ...]
    """Every row's step in the file's order, the rows a rerun superseded included."""


def read_training_csv(out_dir: Path) -> pd.DataFrame:
    """training.csv's rows (read_training_log): a DataFrame of floats (step as int), one row per
    step, sorted by step."""
    return read_training_log(out_dir).rows


def read_training_log(out_dir: Path) -> TrainingLog:
    """training.csv as a DataFrame of floats (step as int), sorted by step, with the rows a resume
    in place superseded left out (validation/contract/reruns.py).

    The header must be exactly the contract's; every value must parse as a number (``nan`` and
    ``inf`` parse, and the loss gate catches them), a step as an integer from 1, and an amount
    (CSV_NON_NEGATIVE) must not be negative. A last row without a line end was cut off
    mid-write (torn_last_row) and is not read."""
    import pandas as pd

    path = Path(out_dir) / TRAINING_CSV
    try:
        if not path.is_file():
            raise ArtifactError(f"{path}: missing (the trainer wrote no {TRAINING_CSV})")
        data = path.read_bytes()
    except OSError as exc:  # no permission on it or its folder: an ArtifactError like any other reader's
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not data.endswith(b"\n"):  # a last row cut off mid-write (torn_last_row): not read
        data = data[:data.rfind(b"\n") + 1]
    df, lines = _cells(path, data)
    out = pd.DataFrame()
    for col in CSV_COLUMNS:
        values = pd.to_numeric(df[col].str.strip(), errors="coerce")
        _refuse(path, df, lines, col, values.isna() & ~df[col].str.strip().str.lower().isin(["nan"]), "is not a number")
        if col == "step":
            _refuse(path, df, lines, col, ~(values >= 1) | (values % 1 != 0), "is not a step (an integer from 1)")
        if col in CSV_NON_NEGATIVE:
            _refuse(path, df, lines, col, values < 0, "is negative")
        out[col] = values.astype(float)
    if out.empty:
        raise ArtifactError(f"{path}: header only, no steps logged")
    out["step"] = out["step"].astype(int)
    logged = out["step"].tolist()
    kept, reruns = latest(logged, one_per_step=True)
    return TrainingLog(out.iloc[kept].sort_values("step", kind="stable").reset_index(drop=True), reruns, tuple(logged))


def _cells(path: Path, data: bytes) -> tuple[pd.DataFrame, list[int]]:
    """training.csv's rows as strings under the contract's header, and each row's line in the file.
    Blank lines are skipped (and counted); a row of more or fewer fields than the header is named
    by its line and step ('line 6 (step 5): 7 of 8 fields'). It was read with pandas, which filled
    a short row's missing fields with '' ("column mem_reserved_gb: '' is not a number", of a value
    the row never had) and numbered lines after a blank one a line too early."""
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""), strict=True)
        rows = [(reader.line_num, fields) for fields in reader if "".join(fields).strip() or len(fields) > 1]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not a readable CSV ({str(exc).strip()})") from None
    if not rows:
        raise ArtifactError(f"{path}: empty file, expected header {','.join(CSV_COLUMNS)}")
    (_, header), body = rows[0], rows[1:]
    if tuple(header) != CSV_COLUMNS:
        raise ArtifactError(f"{path}: header is {','.join(header)}; expected {','.join(CSV_COLUMNS)}")
    for line, fields in body:
        if len(fields) != len(header):
            raise ArtifactError(f"{path}: line {line}{_step_of(fields[0])}: {len(fields)} of {len(header)} fields")
    import pandas as pd

    return pd.DataFrame([f for _, f in body], columns=list(CSV_COLUMNS), dtype=str), [line for line, _ in body]


def _step_of(value: str) -> str:
    """' (step 5)' where a row's step reads as one, else ''."""
    return f" (step {value.strip()})" if value.strip().isdigit() else ""


def _refuse(path: Path, df: pd.DataFrame, lines: list[int], col: str, bad: pd.Series, what: str) -> None:
    """An ArtifactError naming the first row of ``bad`` by its line in the file and, where that row's
    step reads as one, its step ('line 3 (step 2), column grad_norm'), and its value. It said 'row 3',
    which a reader took for the third row of steps (step 3) as readily as for line 3 (step 2)."""
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        said = _step_of(df["step"].iloc[row]) if col != "step" else ""
        raise ArtifactError(f"{path}: line {lines[row]}{said}, column {col}: {df[col].iloc[row]!r} {what}")


def window_rows(df: pd.DataFrame, last: int | None) -> pd.DataFrame:
    """The rows of the last ``last`` steps, counted in step numbers, not rows: a trainer that
    logs every 20 steps has 3 rows in 'last 50 steps' (all rows when last is None)."""
    return df if last is None or df.empty else df[df["step"] > df["step"].max() - last]


def read_heartbeats(out_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Per rank, the heartbeat records in file order (read_heartbeat_logs)."""
    return {rank: log.records for rank, log in read_heartbeat_logs(out_dir).items()}


@dataclass(frozen=True)
class Writer:
    """A process that wrote heartbeat records, as its records say: its ``pid`` and ``rank`` (each
    None where its records carry none), its first record's ``node`` and ``host``."""

    pid: int | None
    rank: int | None
    node: int | None
    host: str | None

    def text(self) -> str:
        """'pid 8308 (rank 1, node 1, host vm)', 'rank 1 (node 1)' (no pid said)."""
        said = [f"rank {self.rank}" if self.pid is not None and self.rank is not None else "",
                f"node {self.node}" if self.node is not None else "", f"host {self.host}" if self.host else ""]
        said = [x for x in said if x]
        return (f"pid {self.pid}" if self.pid is not None else f"rank {self.rank}") + (
            f" ({', '.join(said)})" if said else "")


@dataclass(frozen=True)
class HeartbeatLog:
    """One rank's heartbeat file as read: its records, and the steps a resume in place wrote again."""

    records: list[dict[str, Any]]
    """In file order, without those a resume in place superseded (reruns.py)."""
    reruns: list[Rerun]
    shared: tuple[Writer, ...] = ()
    """The processes that wrote into the file at once (``_writers``), in the order of their first
    record; empty where one process at a time did. Their records interleave, so none supersedes
    another: ``records`` holds them all, and ``reruns`` is empty."""


def read_heartbeat_logs(out_dir: Path) -> dict[int, HeartbeatLog]:
    """Per rank, the heartbeat records in file order, less those a resume in place superseded
    (validation/contract/reruns.py), or all of them where several processes wrote the file at once
    (``HeartbeatLog.shared``). A torn last line (a killed writer) is skipped; any other
    undecodable line is an error naming file and line."""
    beats: dict[int, HeartbeatLog] = {}
    for path in sorted(Path(out_dir).glob("heartbeat_rank*.jsonl")):
        m = HEARTBEAT_PATTERN.match(path.name)
        if not m:
            continue
        lines = path.read_text(errors="replace").splitlines()
        records = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break
                raise ArtifactError(f"{path}: line {i + 1} is not JSON") from None
            if isinstance(rec, dict):
                records.append(rec)
        beats[int(m.group(1))] = _latest_records(records)
    return beats


def _latest_records(records: list[dict[str, Any]]) -> HeartbeatLog:
    shared = _writers(records)
    if shared:
        return HeartbeatLog(records, [], shared)
    steps = [r["step"] if _whole(r.get("step")) else None for r in records]
    pids = [r.get("pid") if _whole(r.get("pid")) else None for r in records]
    new_process, last_pid = [], None
    for pid in pids:
        new_process.append(pid is not None and last_pid is not None and pid != last_pid)
        last_pid = pid if pid is not None else last_pid
    # a record of a step done may come late, once: the same stage of the same step written again is a rerun
    late, seen = [], set()
    for step, rec in zip(steps, records):
        stage = rec.get("stage") if isinstance(rec.get("stage"), str) else None
        late.append(stage in HEARTBEAT_STAGES_AFTER_STEP and (step, stage) not in seen)
        seen.add((step, stage))
    kept, reruns = latest(steps, one_per_step=False, new_process=new_process, late=late)
    return HeartbeatLog([records[i] for i in kept], reruns)


def _writers(records: list[dict[str, Any]]) -> tuple[Writer, ...]:
    """The processes that wrote ``records`` at once: two or more, told apart by the ``pid``,
    ``rank`` and ``host`` their records say, where one of them wrote again after another had
    begun (two ranks writing one file, such as the file of their LOCAL_RANK on two nodes); () where
    each process wrote only before the next began (a resume in place), or nothing tells them apart.
    Records of neither a pid nor a rank are of no writer told."""
    first: dict[tuple, dict[str, Any]] = {}
    ended: set[tuple] = set()
    last: tuple | None = None
    interleaved = False
    for rec in records:
        pid, rank = (rec.get(k) if _whole(rec.get(k)) else None for k in ("pid", "rank"))
        if pid is None and rank is None:
            continue
        key = (pid, rank, rec.get("host") if isinstance(rec.get("host"), str) else None)
        if key != last and last is not None:
            ended.add(last)
        interleaved |= key in ended
        first.setdefault(key, rec)
        last = key
    if not interleaved:
        return ()
    return tuple(Writer(pid, rank, rec.get("node") if _whole(rec.get("node")) else None, host)
                 for (pid, rank, host), rec in first.items())


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_env_json(out_dir: Path) -> dict[str, Any] | None:
    path = Path(out_dir) / ENV_JSON
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def blank(path: Path) -> bool:
    """A file with nothing but whitespace in it (or nothing at all): what a trainer leaves of a
    stack dump it opened for faulthandler and never wrote (a rank SIGKILLed, or one that never
    dumped). Such a file is no stack dump."""
    with open(path, "rb") as fh:
        return not fh.read().strip()


def stackdumps(out_dir: Path) -> dict[int, Path]:
    """The trainer's stack dumps by rank (``stackdump_rank{R}.txt``), those that hold something:
    an empty or whitespace-only file is no stack dump (``empty_stackdumps`` lists them)."""
    return {rank: path for rank, path in _ranked_dumps(out_dir).items() if not blank(path)}


def _ranked_dumps(out_dir: Path) -> dict[int, Path]:
    out = {}
    for path in sorted(Path(out_dir).glob("stackdump_rank*.txt")):
        m = STACKDUMP_PATTERN.match(path.name)
        if m:
            out[int(m.group(1))] = path
    return out


_UNRANKED = re.compile(r"^stackdump_unranked(\d+)\.txt$")


def unranked_stackdumps(out_dir: Path) -> list[Path]:
    """The trainer's stack dumps whose rank its files do not tell (``stacks.UNRANKED_DUMP``, written
    by an adapter rather than guess a rank), in their order; empty ones are none (``blank``)."""
    return [p for p in _unranked_dumps(out_dir) if not blank(p)]


def _unranked_dumps(out_dir: Path) -> list[Path]:
    found = [p for p in Path(out_dir).glob(UNRANKED_DUMPS) if _UNRANKED.match(p.name)]
    return sorted(found, key=lambda p: int(_UNRANKED.match(p.name).group(1)))


def empty_stackdumps(out_dir: Path) -> list[Path]:
    """The stack dump files (of a rank, or of a rank unknown) that hold nothing but whitespace:
    counted as absent everywhere, and named by the contract check."""
    return [p for p in [*_ranked_dumps(out_dir).values(), *_unranked_dumps(out_dir)] if blank(p)]


def read_stacks(out_dir: Path, max_frames: int) -> tuple[list[TakenStack], dict[int, StackDump], list[StackDump]]:
    """What the harness did for each process's stack when it stopped the run (its index), each
    rank's stack (the one the harness took, else the trainer's own dump), and the stacks of
    processes whose rank cannot be told, each with its main thread's innermost ``max_frames``
    frames. A dump file with nothing but whitespace in it, the trainer's or the harness's, is no
    stack (``blank``)."""
    taken = read_index(out_dir)
    ranked, unranked_paths = stackdumps(out_dir), unranked_stackdumps(out_dir)
    empty = {t.path for t in taken if t.path is not None and blank(out_dir / t.path)}
    dumps = {rank: _stack(out_dir, path.name, "trainer", parse_faulthandler, max_frames)
             for rank, path in ranked.items()}
    unranked = [_stack(out_dir, p.name, "trainer", parse_faulthandler, max_frames) for p in unranked_paths]
    for t in taken:
        if t.method == "SIGUSR1" and t.rank in dumps:  # the trainer's own dump, written when the harness asked
            dumps[t.rank] = _stack(out_dir, dumps[t.rank].path, "SIGUSR1", parse_faulthandler, max_frames)
        if t.path is None or t.path in empty:
            continue  # no dump of its own, or an empty one (py-spy wrote nothing): no stack of the process
        dump = _stack(out_dir, t.path, t.method, parse_pyspy, max_frames, t.pid)
        if t.rank is None:
            unranked.append(dump)
        else:
            dumps[t.rank] = dump
    return taken, dumps, unranked


def read_helper_stacks(out_dir: Path, max_frames: int) -> dict[int, list[StackDump]]:
    """The stacks the harness took of ranks' helpers (processes below a rank: data loader or compile
    workers), by the rank they help, in pid order; each with its main thread's innermost ``max_frames``."""
    out: dict[int, list[StackDump]] = {}
    for t in read_index(out_dir, helpers=True):
        if t.path is not None and not blank(out_dir / t.path):
            out.setdefault(t.helper_of, []).append(_stack(out_dir, t.path, t.method, parse_pyspy, max_frames, t.pid))
    return out


def _stack(out_dir: Path, rel: str, source: str, parse, max_frames: int, pid: int | None = None) -> StackDump:
    text = (out_dir / rel).read_text(errors="replace")
    frames = main_thread_frames(parse(text))
    header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
    return StackDump(rel, frames[:max_frames], header, source, pid, import_under_way(frames), loader_wait(frames))


def halted(out_dir: Path) -> bool:
    return (Path(out_dir) / HALT).exists()


@dataclass(frozen=True)
class HaltInfo:
    """The .HALT file: who wrote it and, for the non-finite guard, where and what."""

    source: str | None = None
    """'watchdog', 'nonfinite', an operator's own word, or None (an empty or free-text file)."""
    step: int | None = None
    losses: list[float | None] | None = None
    """Loss per rank; None for an entry that is no number."""
    grad_norm: float | None = None
    text: str = ""
    """The file's content as written (a JSON record's own ``text`` field, when it has one)."""
    torn: bool = False
    """A JSON record cut short (a writer stopped mid-record): source and step, when set, were read
    from its beginning."""


def read_halt(out_dir: Path) -> HaltInfo | None:
    """The .HALT file: a JSON record (the trainer's watchdog and NaN guard; its ``text``, when it
    has one, is what the trainer said) or free text (an operator's); None when there is none.
    A record cut short (a trainer that writes it in place and died, or is read, mid-write) is
    not an operator's text: its source and step are read from what is there."""
    path = Path(out_dir) / HALT
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        if rec is None and text.lstrip().startswith("{"):
            source = re.search(r'"source"\s*:\s*"([^"\\]*)"', text)
            step = re.search(r'"step"\s*:\s*(\d+)', text)
            return HaltInfo(source=source and source.group(1), step=step and int(step.group(1)),
                            text=text.strip(), torn=True)
        return HaltInfo(text=text.strip())
    losses = rec.get("losses")
    return HaltInfo(source=rec.get("source"), step=rec.get("step") if isinstance(rec.get("step"), int) else None,
                    losses=[json_number(v) for v in losses] if isinstance(losses, list) else None,
                    grad_norm=json_number(rec.get("grad_norm")),
                    text=rec["text"] if isinstance(rec.get("text"), str) else text.strip())


@dataclass(frozen=True)
class ProfileRead:
    """profile.json (nsa/contract.py PROFILE_FIELDS): what the trainer measured when the harness
    asked for a profile."""

    profiled_steps: int
    nsa_ranges: list[str]
    top_ops: list[str]
    """'name ms/step', most device (CPU on CPU) time first."""
    gpu_busy_frac: float | None = None
    python_overhead_frac: float | None = None
    cuda_graphs: bool = False
    device: str = "?"


def read_profile(out_dir: Path) -> ProfileRead | None:
    """profile.json, or None when the trainer wrote none (it was not asked, or it does not
    honour the contract's profile request); ArtifactError when it is malformed."""
    path = Path(out_dir) / PROFILE_JSON
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        steps = data["profiled_steps"]
        if not isinstance(steps, int) or isinstance(steps, bool):
            raise TypeError(f"profiled_steps is {steps!r}, expected an integer")
        ops = [f"{op['name'][:60]} {float(op['ms_per_step']):.2f} ms/step" for op in data.get("top_ops") or []]
        return ProfileRead(steps, [str(n) for n in data.get("nsa_ranges") or []], ops,
                           json_number(data.get("gpu_busy_frac")), json_number(data.get("python_overhead_frac")),
                           bool(data.get("cuda_graphs")), str(data.get("device") or "?"))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{path}: not a profile record ({exc})") from None


@dataclass(frozen=True)
class TimelineRead:
    """gpu_timeline.json.gz: the profiled window and every device activity interval in it
    (microseconds, the profiler's clock)."""

    window_us: tuple[float, float]
    intervals_us: list[tuple[float, float]]


def read_gpu_timeline(out_dir: Path) -> TimelineRead | None:
    """gpu_timeline.json.gz, or None when the trainer wrote none (a CPU run, or a trainer that
    leaves only profile.json); ArtifactError when it is malformed."""
    path = Path(out_dir) / GPU_TIMELINE
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rt") as fh:
            data = json.load(fh)
        lo, hi = (float(x) for x in data["window_us"])
        intervals = [(float(s), float(e)) for s, e in data["device_intervals_us"]]
        if hi <= lo:
            raise ValueError(f"window_us [{lo}, {hi}] is empty")
        return TimelineRead((lo, hi), intervals)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a GPU timeline ({exc})") from None


@dataclass(frozen=True)
class BareNonfinite:
    """A bare ``NaN`` / ``Infinity`` / ``-Infinity`` in a contract JSON file: not JSON (jq,
    JavaScript's JSON.parse and Go's encoding/json refuse the file), though Python's json and the
    harness read it as the number it names."""

    file: str
    key: str
    """Where in the record: 'loss_scale', 'losses[0]', 'env.NSA_X' ('(the whole record)' at the top)."""
    token: str
    line: int | None = None
    """The line of a heartbeat file (JSON Lines); None for a file of one record."""
    more: int = 0
    """Further lines of the file with a bare value under the same key."""

    def text(self) -> str:
        where = f" (line {self.line}" + (f"; {self.more} more line(s)" if self.more else "") + ")" if self.line else ""
        return (f"{self.file} {self.key}: a bare {self.token}{where}, which strict JSON has not (jq, JSON.parse and "
                f"Go's encoding/json refuse the file): write the string \"{_CONTRACT_WORD[self.token]}\" "
                f"(json.dumps(..., allow_nan=False) finds one left over); the harness reads it all the same")


#: the contract's string for each bare token Python's json writes (JSON_NONFINITE)
_CONTRACT_WORD = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


class _Bare:
    def __init__(self, token: str):
        self.token = token


def _bare_keys(value: Any, key: str = "") -> list[tuple[str, str]]:
    """(key, token) of every bare non-finite constant in a record parsed with ``_Bare`` for them."""
    if isinstance(value, _Bare):
        return [(key or "(the whole record)", value.token)]
    if isinstance(value, dict):
        return [b for k, v in value.items() for b in _bare_keys(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, list):
        return [b for i, v in enumerate(value) for b in _bare_keys(v, f"{key}[{i}]")]
    return []


def _bare_in(text: str) -> list[tuple[str, str]] | None:
    """The bare non-finite constants of one JSON text; None where it is no JSON at all (the
    contract check says so where it matters)."""
    try:
        return _bare_keys(json.loads(text, parse_constant=_Bare))
    except (json.JSONDecodeError, RecursionError):
        return None


def bare_nonfinite(out_dir: Path) -> list[BareNonfinite]:
    """Every key of the contract's JSON files (env.json, .HALT, profile.json, each rank's
    heartbeats) that holds a bare NaN / Infinity rather than the contract's string: per key of a
    heartbeat file, its first line and how many more."""
    out_dir = Path(out_dir)
    found = []
    for name in (ENV_JSON, HALT, PROFILE_JSON):
        path = out_dir / name
        if path.is_file():
            found += [BareNonfinite(name, key, token)
                      for key, token in _bare_in(path.read_text(errors="replace")) or []]
    beats = sorted((int(m.group(1)), p) for p in out_dir.glob("heartbeat_rank*.jsonl")
                   if (m := HEARTBEAT_PATTERN.match(p.name)))
    for _, path in beats:
        first: dict[str, tuple[int, str]] = {}
        count: dict[str, int] = {}
        with open(path, errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                for key, token in (_bare_in(line) or []) if "N" in line or "I" in line else []:
                    first.setdefault(key, (n, token))
                    count[key] = count.get(key, 0) + 1
        found += [BareNonfinite(path.name, key, token, n, count[key] - 1) for key, (n, token) in first.items()]
    return found


def json_number(v: Any) -> float | None:
    """A number of a trainer's JSON file: an integer or a float (a bare NaN / Infinity, which
    Python's json reads, among them), or the contract's string of a non-finite one
    (``JSON_NONFINITE``: "nan", "inf", "-inf"); None for anything else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, str) and v in JSON_NONFINITE else None
