"""The default real text: the Python standard library's own .py files, found at run time, read
in place in sorted order (nsa/train/corpus.py), and what env.json says of them."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

from nsa.train.cli import run
from nsa.train.config import DataConfig
from nsa.train.corpus import StdlibCorpus
from nsa.train.data import SEPARATOR, DocumentStream, byte_encode

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_the_corpus_is_the_running_pythons_stdlib_sources_in_sorted_order():
    corpus = StdlibCorpus.find()
    assert corpus.root == STDLIB
    assert len(corpus.files) > 500 and list(corpus.files) == sorted(corpus.files)
    assert {"os.py", "json/__init__.py", "collections/__init__.py"} <= set(corpus.files)
    assert all(f.endswith(".py") and (STDLIB / f).is_file() for f in corpus.files)
    assert not [f for f in corpus.files if {"site-packages", "dist-packages"} & set(f.split("/"))]


def test_only_py_files_sorted_by_relative_path_without_third_party_packages(tmp_path: Path):
    for rel in ("z.py", "A.py", "a/b.py", "a/c.txt", "a/__pycache__/b.cpython-311.py", "site-packages/numpy/x.py",
                "dist-packages/y.py", "b/site-packages.py", "_t/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    corpus = StdlibCorpus.find(tmp_path)
    assert corpus.files == ("A.py", "_t/x.py", "a/b.py", "b/site-packages.py", "z.py")
    assert corpus.paths()[0] == tmp_path / "A.py"
    assert StdlibCorpus.find(tmp_path) == corpus  # deterministic


def test_rows_are_the_files_bytes_read_in_place_in_that_order():
    seq = 255
    stream = DocumentStream(DataConfig(dataset="text"), seq)
    assert stream.corpus is not None and stream.files == stream.corpus.paths()
    summary = stream.summary()
    assert summary.root == str(STDLIB) and summary.files == len(stream.corpus.files) and summary.dataset == "text"
    assert str(STDLIB) in stream.describe() and f"{summary.files} files" in stream.describe()
    # the first rows are the first files' UTF-8 bytes, NUL between documents
    want, i = [], 0
    while sum(t.numel() for t in want) < 8 * (seq + 1):
        want += [byte_encode(stream.files[i].read_text(encoding="utf-8", errors="replace")), torch.tensor([SEPARATOR])]
        i += 1
    flat = torch.cat(want)
    rows = stream.rows()
    for k in range(8):
        assert torch.equal(next(rows), flat[k * (seq + 1):(k + 1) * (seq + 1)])


def test_a_run_on_the_default_text_records_the_corpus_in_env_json(tmp_path: Path):
    overrides = (f"model.n_layers=1 train.seq_len=64 train.steps=2 train.print_every=100 train.out_dir={tmp_path} "
                 "data.dataset=text")
    assert run("tiny", [overrides], env={}) == 0
    data = json.loads((tmp_path / "env.json").read_text())["data"]
    corpus = StdlibCorpus.find()
    assert data == {"dataset": "text", "text": f"text: {corpus.describe()}", "root": str(STDLIB),
                    "files": len(corpus.files)}
