"""Data: byte tokenizer, rank sharding, file sources, clear errors, the loader timeout."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from nsa.train.config import DataConfig
from nsa.train.data import (
    DataError,
    DataTimeout,
    DocumentStream,
    Loader,
    PatternSource,
    RandomSource,
    build_source,
    byte_encode,
    rank_rows,
)

T = 16


def take(it, n):
    return [next(it) for _ in range(n)]


def test_byte_tokenizer_is_utf8_bytes():
    ids = byte_encode("hé!")
    assert ids.tolist() == list("hé!".encode()) and ids.dtype == torch.long


@pytest.mark.parametrize("source", [RandomSource(T, 256, 3), PatternSource(T, 7, 3)], ids=["random", "pattern"])
def test_ranks_together_read_what_one_process_reads(source):
    one = torch.cat(take(rank_rows(source, 0, batch=4, rank=0, world=1), 3))
    r0 = take(rank_rows(source, 0, batch=2, rank=0, world=2), 3)
    r1 = take(rank_rows(source, 0, batch=2, rank=1, world=2), 3)
    both = torch.cat([torch.cat([a, b]) for a, b in zip(r0, r1)])
    assert torch.equal(one, both)
    assert not torch.equal(r0[0], r1[0])


def test_stream_sharding_and_resume_position(tmp_path: Path):
    (tmp_path / "a.txt").write_text("abcdefghijklmnopqrstuvwxyz" * 40)
    cfg = DataConfig(dataset="text", path=str(tmp_path))
    src = DocumentStream(cfg, T)
    one = torch.cat(take(rank_rows(src, 0, batch=4, rank=0, world=1), 4))
    r0 = take(rank_rows(src, 0, batch=2, rank=0, world=2), 4)
    r1 = take(rank_rows(src, 0, batch=2, rank=1, world=2), 4)
    assert torch.equal(one, torch.cat([torch.cat([a, b]) for a, b in zip(r0, r1)]))
    # resuming at micro-batch 2 continues exactly where an uninterrupted reader is
    assert torch.equal(torch.cat(take(rank_rows(src, 2, 2, 1, 2), 2)), torch.cat(r1[2:]))
    assert torch.equal(torch.cat(take(rank_rows(PatternSource(T, 5, 0), 3, 2, 0, 1), 1)),
                       take(rank_rows(PatternSource(T, 5, 0), 0, 2, 0, 1), 4)[3])


def test_pattern_rows_are_deterministic_ramps():
    row = PatternSource(T, 7, 0).row(5)
    assert torch.equal(row, PatternSource(T, 7, 0).row(5))
    assert all(((b - a) % 7 in (1, -6 % 7)) for a, b in zip(row.tolist(), row[1:].tolist()))


def test_jsonl_and_parquet_text_column(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = ["first document " * 5, "second one " * 5]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)))
    pq.write_table(pa.table({"text": docs, "id": [0, 1]}), tmp_path / "d.parquet")
    expected = torch.cat([torch.cat([byte_encode(d), torch.tensor([0])]) for d in docs])
    for name in ("d.jsonl", "d.parquet"):
        src = build_source(DataConfig(dataset="fineweb_edu", path=str(tmp_path / name)), T, 256, 0)
        rows = take(src.rows(), 3)
        assert torch.equal(torch.cat(rows), expected[: 3 * (T + 1)])


def test_missing_and_unreadable_files_name_the_file(tmp_path: Path):
    with pytest.raises(DataError, match="nope.parquet.*no such file"):
        DocumentStream(DataConfig(dataset="parquet", path=str(tmp_path / "nope.parquet")), T)
    with pytest.raises(DataError, match="matched no files"):
        DocumentStream(DataConfig(dataset="parquet", path=str(tmp_path / "*.parquet")), T)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all")
    with pytest.raises(DataError, match="bad.parquet: cannot read as parquet"):
        DocumentStream(DataConfig(dataset="parquet", path=str(bad)), T)


def test_missing_column_and_bad_json_line_are_named(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match="no column 'text'.*content"):
        DocumentStream(DataConfig(dataset="parquet", path=str(tmp_path / "c.parquet")), T)
    (tmp_path / "e.jsonl").write_text('{"text": "ok"}\n{broken\n')
    src = DocumentStream(DataConfig(dataset="jsonl", path=str(tmp_path / "e.jsonl")), T)
    with pytest.raises(DataError, match=r"e\.jsonl:2: not valid JSON"):
        take(src.rows(), 1)


@pytest.mark.parametrize("text, message", [
    ('\n{"content": "a document"}\n', r"c\.jsonl:2: no key 'text' \(the record's keys: content\)"),
    ("id,text\n1,a document\n", r"c\.jsonl:1: not valid JSON"),
])
def test_a_jsonl_file_whose_first_record_cannot_be_read_is_refused_at_start(tmp_path: Path, text, message):
    """Records without data.text_column (a dataset whose column is 'content'), or a CSV named
    .jsonl, were found only by the loader in step 1: after the model was built and the out_dir's
    earlier training.csv replaced. (The check runs before the model is built: test_train_loop.py.)"""
    (tmp_path / "c.jsonl").write_text(text)
    with pytest.raises(DataError, match=message):
        DocumentStream(DataConfig(dataset="jsonl", path=str(tmp_path / "c.jsonl")), T).check(T + 1, say=print)


def test_too_little_data_is_an_error_not_a_hang(tmp_path: Path):
    (tmp_path / "s.txt").write_text("short")
    src = DocumentStream(DataConfig(dataset="text", path=str(tmp_path / "s.txt")), T)
    with pytest.raises(DataError) as err:
        take(src.rows(), 1)
    assert str(err.value) == (f"data.path={tmp_path / 's.txt'}: 5 tokens of text in 1 file; a run needs at least "
                              "train.seq_len+1=17 (with one separator token after each document)")


class _SlowSource:
    def describe(self):
        return "a slow test source"

    def row(self, j):
        time.sleep(1)
        return torch.zeros(T + 1, dtype=torch.long)


class _BrokenSource:
    def describe(self):
        return "a broken test source"

    def row(self, j):
        raise OSError("disk on fire")


def test_loader_times_out_with_a_clear_error():
    loader = Loader(_SlowSource(), DataConfig(loader_timeout_s=0.3), 1, 0, 1, torch.device("cpu"))
    t0 = time.monotonic()
    with pytest.raises(DataTimeout, match=r"no batch within data.loader_timeout_s=0.3s from a slow test source"):
        loader.next()
    assert time.monotonic() - t0 < 3
    loader.close()


def test_loader_reraises_producer_errors_and_tracks_position():
    loader = Loader(_BrokenSource(), DataConfig(), 1, 0, 1, torch.device("cpu"))
    with pytest.raises(DataError, match="disk on fire"):
        loader.next()
    loader.close()
    ok = Loader(PatternSource(T, 7, 0), DataConfig(), 2, 0, 1, torch.device("cpu"), start_micro=5)
    x, y = ok.next()
    assert x.shape == (2, T) and torch.equal(x[:, 1:], y[:, :-1]) and ok.position == 6
    ok.close()


def test_close_waits_for_the_producer_thread():
    """A producer left running (here: blocked on a full queue, or mid-row) when the interpreter
    exits aborts a finished run with exit -6; close() must stop and join it."""
    full = Loader(PatternSource(T, 7, 0), DataConfig(prefetch=1), 1, 0, 1, torch.device("cpu"))
    full.next()
    time.sleep(0.3)  # the producer refills the queue and blocks on the next row
    full.close()
    assert not full._thread.is_alive()
    slow = Loader(_SlowSource(), DataConfig(), 1, 0, 1, torch.device("cpu"))
    slow.close()  # the producer is inside row(): close waits for it to return
    assert not slow._thread.is_alive()
    stuck = Loader(_SlowSource(), DataConfig(), 1, 0, 1, torch.device("cpu"))
    t0 = time.monotonic()
    stuck.close(join_timeout_s=0.2)  # bounded: a hung filesystem cannot hang the trainer's exit
    assert time.monotonic() - t0 < 0.9 and stuck._thread.is_alive()


def _corpus(path: Path, n: int, bad: dict[int, bytes] | None = None) -> Path:
    """A jsonl file of ``n`` small records (line i holds 'doc i'), with ``bad`` lines replaced."""
    lines = [json.dumps({"id": i, "text": f"doc {i}"}).encode() for i in range(1, n + 1)]
    for lineno, raw in (bad or {}).items():
        lines[lineno - 1] = raw
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("raw, said", [
    (b'{"text": "doc", ', r"not valid JSON \(Expecting property name enclosed in double quotes, at the end of the line\)"),
    (b'{"content": "doc"}', r"no key 'text' \(the record's keys: content\)"),
    (b'{"text": null}', r"'text' is null"),
    (b'{"text": 7}', r"'text' is a number"),
    (b'{"text": ["doc"]}', r"'text' is an array"),
    (b'["doc"]', r"a JSON array"),
    (b'{"text": "d\xffoc"}', r"not valid UTF-8 \(byte 12 of the line\)"),
    (b'{"text": "d\\ud800oc"}', r"'text' holds a lone surrogate \(\\ud800\), which UTF-8 cannot encode"),
], ids=["json", "key", "null", "number", "array", "not-an-object", "utf8", "surrogate"])
def test_the_check_names_the_first_bad_record_the_run_would_read_with_its_line(tmp_path: Path, raw, said):
    """A malformed record at line N of a large file surfaced only when the loader reached it, mid-run
    (a non-string text was even trained on as 'None', and bad UTF-8 or a lone surrogate failed
    without a line number). The check before the run reads what the run reads, as the loader does."""
    path = _corpus(tmp_path / "c.jsonl", 2000, {1500: raw})
    src = DocumentStream(DataConfig(dataset="jsonl", path=str(path)), T)  # the first record is fine
    expected = r"; expected one JSON object per line with a string 'text' \(data\.text_column\)"
    with pytest.raises(DataError, match=re.escape(f"{path}:1500: ") + said + ".*" + expected):
        src.check(10**9, say=lambda _: None)
    with pytest.raises(DataError, match=re.escape(f"{path}:1500: ") + said):  # the loader says the same
        take(src.rows(), 10**9)


def test_the_check_reads_only_what_the_run_reads_and_says_how_far(tmp_path: Path):
    """The pass costs what the run's own reading costs, never a whole corpus that a short run does
    not reach: a bad record past the run's tokens is no error of this run."""
    path = _corpus(tmp_path / "c.jsonl", 2000, {1500: b"{broken"})
    src = DocumentStream(DataConfig(dataset="jsonl", path=str(path)), T)
    said: list[str] = []
    src.check(1000, say=said.append)  # 'doc 1' .. 'doc 9': 6 tokens each with the separator, 7 to 'doc 99', then 8
    assert len(said) == 1 and re.fullmatch(
        r"\[data\] checked 139 records \(1,004 tokens\) in \d+\.\d\d s: what the run reads \(its first 1,000 "
        r"tokens\) of " + re.escape(src.describe()), said[0]), said
    good = _corpus(tmp_path / "good.jsonl", 20)
    said.clear()
    DocumentStream(DataConfig(dataset="jsonl", path=str(good)), T).check(10**9, say=said.append)
    assert re.fullmatch(r"\[data\] checked 20 records \(\d+ tokens\) in \d+\.\d\d s: every record of .*good\.jsonl",
                        said[0]), said


def test_too_little_data_is_found_by_the_check(tmp_path: Path):
    path = _corpus(tmp_path / "c.jsonl", 1)
    with pytest.raises(DataError, match=r"c\.jsonl: 5 tokens of text in 1 file; a run needs at least "
                                        r"train\.seq_len\+1=17 "):
        DocumentStream(DataConfig(dataset="jsonl", path=str(path)), T).check(10**9, say=lambda _: None)


def test_an_empty_document_is_a_separator_not_a_crash(tmp_path: Path):
    """A record whose text is '' (or an empty text file) stopped the loader with 'both buffer
    length (0) and count (-1) must not be 0', mid-run."""
    path = _corpus(tmp_path / "c.jsonl", 40, {2: b'{"text": ""}'})
    src = DocumentStream(DataConfig(dataset="jsonl", path=str(path)), T)
    row = take(src.rows(), 1)[0]
    assert bytes(row[:13].tolist()) == b"doc 1\x00\x00doc 3\x00"
    assert byte_encode("").tolist() == []


def test_a_parquet_text_column_of_another_type_is_refused_at_start(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet: column 'text' \(data\.text_column\) holds int64; expected a "
                                        r"string column"):
        DocumentStream(DataConfig(dataset="parquet", path=str(tmp_path / "n.parquet")), T)


def test_a_long_check_says_how_far_it_got(tmp_path: Path, monkeypatch):
    """On a large corpus the check takes a while (about 1 s per 200 MB of 3 KB records on one CPU
    core, 3 s of 300-byte ones): it says so while it reads."""
    monkeypatch.setattr("nsa.train.data.PROGRESS_S", 0.0)
    said: list[str] = []
    DocumentStream(DataConfig(dataset="jsonl", path=str(_corpus(tmp_path / "c.jsonl", 2000))), T).check(
        10**9, say=said.append)
    assert re.fullmatch(r"\[data\] checking the records the run reads: 1,024 records \([\d,]+ of 1,000,000,000 "
                        r"tokens\), file 1 of 1, \d+ s", said[0]), said
    assert len(said) == 2 and said[1].startswith("[data] checked 2,000 records"), said


def test_a_directory_or_glob_gives_only_the_files_of_the_datasets_kind(tmp_path: Path):
    """data.dataset=jsonl data.path=DIR read every file of DIR: a stray a.parquet.bak was read as
    jsonl. Now a directory or a glob gives the dataset's suffixes only; a file named alone is read."""
    good = _corpus(tmp_path / "b.jsonl", 20)
    (tmp_path / "a.parquet.bak").write_bytes(b"PAR1\x00\x01 not jsonl")
    (tmp_path / "notes.md").write_text("# notes\n")
    said: list[str] = []
    for spec in (str(tmp_path), str(tmp_path / "*")):
        src = DocumentStream(DataConfig(dataset="jsonl", path=spec), T)
        assert src.files == [good], spec
        src.check(10**9, say=said.append)
    fine = DocumentStream(DataConfig(dataset="fineweb_edu", path=str(tmp_path)), T)
    assert fine.files == [good]
    assert len(DocumentStream(DataConfig(dataset="text", path=str(tmp_path)), T).files) == 3  # text: every file


def test_a_directory_without_the_datasets_files_is_an_error_naming_it_and_the_suffixes(tmp_path: Path):
    (tmp_path / "a.parquet.bak").write_bytes(b"PAR1\x00\x01 not jsonl")
    with pytest.raises(DataError) as err:
        DocumentStream(DataConfig(dataset="jsonl", path=str(tmp_path)), T)
    assert str(err.value) == (f"data.path={str(tmp_path)!r}: the directory holds no .jsonl or .json file, which "
                              "data.dataset=jsonl reads (it holds a.parquet.bak); name a file to read it whatever "
                              "its suffix")
    with pytest.raises(DataError, match=r"the glob holds no \.parquet file, which data\.dataset=parquet reads"):
        DocumentStream(DataConfig(dataset="parquet", path=str(tmp_path / "a*")), T)


def test_too_little_data_names_the_key_and_the_empty_files(tmp_path: Path):
    """'fewer than seq_len+1=17 tokens in all files together' named neither train.seq_len nor the
    file that was empty (a text file cut to nothing, a jsonl file of empty records)."""
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(DataError) as err:
        DocumentStream(DataConfig(dataset="text", path=str(tmp_path / "x.txt")), T).check(10**9, say=lambda _: None)
    assert str(err.value) == (f"data.path={tmp_path / 'x.txt'}: 0 tokens of text in 1 file (x.txt is empty); a run "
                              "needs at least train.seq_len+1=17 (with one separator token after each document)")
    (tmp_path / "y.txt").write_text("hi")
    src = DocumentStream(DataConfig(dataset="text", path=str(tmp_path)), T)
    with pytest.raises(DataError, match=rf"^data\.path={re.escape(str(tmp_path))}: 2 tokens of text in 2 files "
                                        r"\(1 of them: x\.txt is empty\); a run needs at least train\.seq_len\+1=17"):
        take(src.rows(), 1)
    d = tmp_path / "j"
    d.mkdir()
    (d / "e.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(DataError, match=r": 0 tokens of text in 1 file \(e\.jsonl holds no text\);"):
        DocumentStream(DataConfig(dataset="jsonl", path=str(d)), T).check(10**9, say=lambda _: None)
