"""Training data: row sources, the byte tokenizer, rank sharding and a prefetching loader with
a timeout. Nothing is ever downloaded.

A source is a deterministic sequence of rows (LongTensor [seq_len + 1]). Global micro-batch g
holds rows [g*B*W, (g+1)*B*W); rank r takes rows g*B*W + r*B + [0, B). So the union over ranks
of one micro-batch is the same rows a single process with batch B*W reads, which is what makes
DDP/FSDP losses match one process, and the data position of a checkpoint is one integer (the
micro-batches consumed) that resumes under any world size of the same B*W (a checkpoint of
another B*W or seq_len is refused, nsa/train/checkpoint.py).
"""
from __future__ import annotations

import glob
import json
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from .config import DataConfig, TrainConfig
from .corpus import StdlibCorpus

SEPARATOR = 0
"""Byte inserted between documents (NUL never occurs in text)."""
PROGRESS_S = 10.0
"""The check of the records before the run says how far it got this often while it reads."""


class DataError(RuntimeError):
    """Missing, unreadable or unusable data; the message names the file (and key)."""


class DataTimeout(DataError):
    """The loader produced no batch within data.loader_timeout_s."""


@dataclass(frozen=True)
class DataSummary:
    """What a source reads, for env.json."""

    dataset: str
    text: str
    """describe(): what it is, for people."""
    root: str | None = None
    """Where the files are: data.path as given, or the standard library's directory for the
    default text corpus."""
    files: int | None = None
    """How many files are read (None: no files)."""


def byte_encode(text: str) -> torch.Tensor:
    """The byte tokenizer: UTF-8 bytes as token ids in [0, 256)."""
    return _byte_tokens(text.encode("utf-8"))


def _byte_tokens(data: bytes) -> torch.Tensor:
    if not data:  # torch.frombuffer refuses an empty buffer
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def run_tokens(train: TrainConfig, world: int) -> int:
    """The tokens a run's train.steps read from the start of the data: every rank reads every row
    of a stream (rank_rows), resumed or not."""
    return train.steps * train.grad_accum * train.batch_size * world * (train.seq_len + 1)


# --- sources -------------------------------------------------------------------------------


class RandomSource:
    """Uniform random bytes: loss stays at ln(vocab); for throughput runs."""

    def __init__(self, seq_len: int, vocab: int, seed: int):
        self.seq_len, self.vocab, self.seed = seq_len, vocab, seed

    def describe(self) -> str:
        return "synthetic random bytes"

    def summary(self) -> DataSummary:
        return DataSummary("synthetic", self.describe())

    def row(self, j: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        return torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)


class PatternSource:
    """Repeating ramps of length ``period`` with a random phase, starting at one of four bases
    (65, 81, 97, 113) per row. Every token but a row's first determines the next, so a model
    that learns anything drives the loss far below ln(256) within tens of steps."""

    def __init__(self, seq_len: int, period: int, seed: int):
        self.seq_len, self.period, self.seed = seq_len, period, seed

    def describe(self) -> str:
        return f"synthetic pattern (period {self.period})"

    def summary(self) -> DataSummary:
        return DataSummary("pattern", self.describe())

    def row(self, j: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        phase = int(torch.randint(0, self.period, (1,), generator=g))
        base = 65 + 16 * int(torch.randint(0, 4, (1,), generator=g))
        return (phase + torch.arange(self.seq_len + 1)) % self.period + base


#: the file names (lower case) each dataset takes from a directory or a glob; text takes every file
SUFFIXES = {"parquet": (".parquet",), "jsonl": (".jsonl", ".json"), "fineweb_edu": (".parquet", ".jsonl", ".json")}


def expand_paths(spec: str, dataset: str = "text") -> list[Path]:
    """A file, a directory (its files, sorted) or a glob; an error when nothing matches. Of a
    directory or a glob, only the files of the dataset's kind (SUFFIXES): a stray
    ``a.parquet.bak`` beside jsonl files was read as jsonl. A file named alone is read whatever
    its suffix."""
    p = Path(spec).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    elif any(c in spec for c in "*?["):
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    elif p.is_file():
        return [p]
    else:
        raise DataError(f"data.path={spec!r}: no such file or directory; expected a local file, a directory of "
                        "files or a glob")
    if not files:
        raise DataError(f"data.path={spec!r}: matched no files; expected a local file, a directory of files or a glob")
    suffixes = SUFFIXES.get(dataset)
    if suffixes is None:
        return files
    kept = [f for f in files if f.name.lower().endswith(suffixes)]
    if not kept:
        where = "the directory" if p.is_dir() else "the glob"
        names = ", ".join(f.name for f in files[:5]) + (f" (+{len(files) - 5} more)" if len(files) > 5 else "")
        raise DataError(f"data.path={spec!r}: {where} holds no {' or '.join(suffixes)} file, which "
                        f"data.dataset={dataset} reads (it holds {names}); name a file to read it whatever its suffix")
    return kept


def _kind_of(path: Path, dataset: str) -> str:
    if dataset in ("text", "parquet", "jsonl"):
        return dataset
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise DataError(f"{path}: data.dataset={dataset} expects .parquet or .jsonl files")


def _records(n: int) -> str:
    return f"{n:,} record{'' if n == 1 else 's'}"


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def _jsonl_document(path: Path, lineno: int, line: bytes, col: str) -> bytes:
    """The UTF-8 bytes of one jsonl record's document: its ``col`` key (data.text_column), a string."""
    expected = f"expected one JSON object per line with a string {col!r} (data.text_column)"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:  # past the line's only line end: the record stopped short
        where = f"column {exc.colno}" if exc.lineno == 1 else "at the end of the line"
        raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}, {where}); {expected}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {exc.start + 1} of the line); {expected}") from None
    if not isinstance(rec, dict):
        raise DataError(f"{path}:{lineno}: a JSON {_JSON_TYPES[type(rec)].split()[-1]}; {expected}")
    if col not in rec:
        raise DataError(f"{path}:{lineno}: no key {col!r} (the record's keys: {', '.join(map(str, rec))}); {expected}")
    text = rec[col]
    if not isinstance(text, str):
        raise DataError(f"{path}:{lineno}: {col!r} is {_JSON_TYPES[type(text)]}; {expected}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON's \ud800 escapes decode to lone surrogates
        raise DataError(f"{path}:{lineno}: {col!r} holds a lone surrogate (\\u{ord(text[exc.start]):04x}), which "
                        f"UTF-8 cannot encode; {expected}") from None


class DocumentStream:
    """Documents from local text / jsonl / parquet files, byte-tokenised, separated by NUL and
    cut into rows of seq_len + 1; loops over the files forever (epochs). Text without data.path
    reads the Python standard library's sources (nsa/train/corpus.py)."""

    def __init__(self, cfg: DataConfig, seq_len: int):
        self.cfg, self.seq_len = cfg, seq_len
        self.corpus = StdlibCorpus.find() if cfg.dataset == "text" and not cfg.path else None
        self.files = self.corpus.paths() if self.corpus is not None else expand_paths(cfg.path, cfg.dataset)
        if not self.files:
            raise DataError(f"{self.describe()}: no files to read")
        self.kinds = [_kind_of(f, cfg.dataset) for f in self.files]
        for f, kind in zip(self.files, self.kinds):
            self._check(f, kind)

    def describe(self) -> str:
        if self.corpus is not None:
            return f"text: {self.corpus.describe()}"
        more = f" (+{len(self.files) - 1} more)" if len(self.files) > 1 else ""
        return f"{self.cfg.dataset} files {self.files[0]}{more}"

    def summary(self) -> DataSummary:
        root = str(self.corpus.root) if self.corpus is not None else self.cfg.path
        return DataSummary(self.cfg.dataset, self.describe(), root, len(self.files))

    def _check(self, path: Path, kind: str) -> None:
        """Fail at once on unreadable files or a parquet file without its text column (the records
        themselves: ``check``)."""
        col = self.cfg.text_column
        if kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                schema = pq.ParquetFile(path).schema_arrow
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{path}: cannot read as parquet ({exc})") from None
            if col not in schema.names:
                raise DataError(
                    f"{path}: no column {col!r} (data.text_column); columns: {', '.join(schema.names)}"
                )
            typ = schema.field(col).type
            if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                raise DataError(f"{path}: column {col!r} (data.text_column) holds {typ}; expected a string column")
        else:
            try:
                with open(path, "rb") as fh:
                    fh.read(1)
            except OSError as exc:
                raise DataError(f"{path}: cannot read ({exc.strerror})") from None

    def check(self, tokens: int, say: Callable[[str], None]) -> None:
        """Read what a run of ``tokens`` tokens reads (run_tokens), as its loader will, before it
        starts: a record the loader cannot use fails now, naming its file and line, not when the
        loader reaches it hours into the run. At most one pass over the files: a long run's
        epochs read them again, and a short run's pass costs what its own reading costs, never a
        whole corpus it does not reach. Says how far it read, and every PROGRESS_S while it reads."""
        start = shown = time.monotonic()
        records = read = 0
        for i, (path, kind) in enumerate(zip(self.files, self.kinds), 1):
            for doc in self._documents(path, kind):
                records, read = records + 1, read + len(doc) + 1
                if read >= tokens:
                    say(f"[data] checked {_records(records)} ({read:,} tokens) in {time.monotonic() - start:.2f} s: "
                        f"what the run reads (its first {tokens:,} tokens) of {self.describe()}")
                    return
                if records % 1024 == 0 and time.monotonic() - shown > PROGRESS_S:
                    shown = time.monotonic()
                    say(f"[data] checking the records the run reads: {_records(records)} ({read:,} of {tokens:,} "
                        f"tokens), file {i} of {len(self.files)}, {shown - start:.0f} s")
        if read < self.seq_len + 1:
            raise self._too_little()
        say(f"[data] checked {_records(records)} ({read:,} tokens) in {time.monotonic() - start:.2f} s: every record "
            f"of {self.describe()}")

    def _too_little(self) -> DataError:
        """Raised once every file has been read and they hold less than one row: reading them again
        to name the empty ones costs less than a row."""
        tokens, hollow = 0, []
        for path, kind in zip(self.files, self.kinds):
            n = sum(len(doc) for doc in self._documents(path, kind))
            tokens += n
            if n == 0:
                hollow.append(f"{path.name} is empty" if path.stat().st_size == 0 else f"{path.name} holds no text")
        files = len(self.files)
        where = f"data.path={self.cfg.path}" if self.cfg.path else self.describe()
        why = ""
        if hollow:
            shown = ", ".join(hollow[:5]) + (f" (+{len(hollow) - 5} more)" if len(hollow) > 5 else "")
            why = f" ({shown})" if len(hollow) == files or files == 1 else f" ({len(hollow)} of them: {shown})"
        return DataError(f"{where}: {tokens:,} token{'' if tokens == 1 else 's'} of text in {files:,} "
                         f"file{'' if files == 1 else 's'}{why}; a run needs at least train.seq_len+1="
                         f"{self.seq_len + 1} (with one separator token after each document)")

    def _documents(self, path: Path, kind: str) -> Iterator[bytes]:
        """The UTF-8 bytes of each document of one file."""
        col = self.cfg.text_column
        if kind == "text":
            yield path.read_text(encoding="utf-8", errors="replace").encode("utf-8")
        elif kind == "jsonl":
            with open(path, "rb") as fh:
                for lineno, line in enumerate(fh, 1):
                    if line.strip():
                        yield _jsonl_document(path, lineno, line, col)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                for batch in pq.ParquetFile(path).iter_batches(columns=[col], batch_size=1024):
                    for text in batch.column(0).to_pylist():
                        if text:
                            yield text.encode("utf-8")
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{path}: cannot read as parquet ({exc})") from None

    def rows(self) -> Iterator[torch.Tensor]:
        n = self.seq_len + 1
        buf = torch.empty(0, dtype=torch.long)
        while True:
            produced = False
            for path, kind in zip(self.files, self.kinds):
                for doc in self._documents(path, kind):
                    buf = torch.cat([buf, _byte_tokens(doc), torch.tensor([SEPARATOR])])
                    while buf.numel() >= n:
                        produced = True
                        yield buf[:n].clone()
                        buf = buf[n:]
            if not produced and buf.numel() < n:
                raise self._too_little()


def build_source(cfg: DataConfig, seq_len: int, vocab: int, seed: int):
    if cfg.dataset == "synthetic":
        return RandomSource(seq_len, vocab, seed)
    if cfg.dataset == "pattern":
        return PatternSource(seq_len, cfg.pattern_period, seed)
    return DocumentStream(cfg, seq_len)


def rank_rows(source, start_micro: int, batch: int, rank: int, world: int) -> Iterator[torch.Tensor]:
    """This rank's micro-batches [B, seq_len + 1], from global micro-batch start_micro on."""
    per_micro = batch * world
    if hasattr(source, "row"):
        g = start_micro
        while True:
            first = g * per_micro + rank * batch
            yield torch.stack([source.row(j) for j in range(first, first + batch)])
            g += 1
    # a stream: read every row, keep ours (skipping the rows before start_micro)
    lo, hi = rank * batch, (rank + 1) * batch
    skip = start_micro * per_micro
    pending: list[torch.Tensor] = []
    for i, row in enumerate(source.rows()):
        if i < skip:
            continue
        if lo <= (i - skip) % per_micro < hi:
            pending.append(row)
            if len(pending) == batch:
                yield torch.stack(pending)
                pending = []


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Loader:
    """Prefetches this rank's micro-batches in a daemon thread. ``next()`` returns (x, y) as
    [B, seq_len] LongTensors on the device, or raises DataTimeout / the producer's error.
    ``position`` is the number of global micro-batches consumed (the checkpointed data state)."""

    def __init__(self, source, cfg: DataConfig, batch: int, rank: int, world: int,
                 device: torch.device, start_micro: int = 0):
        self.source, self.cfg, self.device = source, cfg, device
        self.position = start_micro
        self._q: queue.Queue = queue.Queue(maxsize=cfg.prefetch)
        self._stop = threading.Event()
        self._rows = rank_rows(source, start_micro, batch, rank, world)
        self._thread = threading.Thread(target=self._produce, name="nsa-data-loader", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for rows in self._rows:
                if not self._hand_over(rows):
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._hand_over(_Failure(exc))

    def _hand_over(self, item) -> bool:
        """Queue ``item``, checking the stop flag while the queue is full; False once stopped."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            item = self._q.get(timeout=self.cfg.loader_timeout_s)
        except queue.Empty:
            raise DataTimeout(
                f"data loader produced no batch within data.loader_timeout_s="
                f"{self.cfg.loader_timeout_s:g}s from {self.source.describe()} "
                f"(at micro-batch {self.position}); the files may be on a slow or hung filesystem"
            ) from None
        if isinstance(item, _Failure):
            if isinstance(item.exc, DataError):
                raise DataError(str(item.exc)) from item.exc
            raise DataError(f"data loader failed reading {self.source.describe()}: {item.exc!r}") from item.exc
        self.position += 1
        rows = item.to(self.device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]

    def close(self, join_timeout_s: float = 10.0) -> None:
        """Stop the producer and wait for it: a daemon thread still inside a torch op while the
        interpreter shuts down aborts the process ("terminate called without an active
        exception", exit -6) after a run that otherwise finished cleanly."""
        self._stop.set()
        self._thread.join(timeout=join_timeout_s)
        if self._thread.is_alive():
            print(f"[data] the loader thread was still reading {self.source.describe()} "
                  f"{join_timeout_s:g}s after the stop; leaving it", file=sys.stderr, flush=True)
