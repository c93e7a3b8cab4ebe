"""Each adapter says where every file it wrote into the run directory came from
(``Converted.files``, ``FileOrigin``): a training.csv built from a Hugging Face Trainer's state
and events, torchtitan's heartbeats of its metrics lines and its .HALT of a log line, every file
the seed adapter rewrites, none of them a file the trainer wrote."""
from __future__ import annotations

from pathlib import Path

import pytest

from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.adapters.base import Origin
from validation.tests.contract.test_check_artifacts_key_origins import _hf_folder, _seed_folder
from validation.tests.contract.test_hf_trainer_adapter import needs_tb
from validation.tests.contract.test_torchtitan_adapter import EVIDENCE, _attempts


def _torchtitan_nan_folder(where: Path) -> Path:
    """A dump folder of torchtitan 0.3.x's run that raised on a non-finite loss at step 12, its log
    kept in it (``2>&1 | tee train.log``)."""
    where.mkdir()
    _attempts("1:nan@12", where, where / "train.log", None)
    return where


def _seed_halted_folder(where: Path) -> Path:
    """The seed trainer's files of a run it halted on a NaN loss, with its signal handler's dump."""
    _seed_folder(where)
    (where / ".HALT").write_text("halt: nan_loss\n")
    (where / "stackdump_1700000000.txt").write_text(
        "Signal 10 at 2026-12-01T00:00:00Z\n\n--- Thread: MainThread (1) ---\n"
        '  File "train.py", line 9, in main\n    step()\n')
    return where


@needs_tb
@pytest.mark.parametrize("adapter, written_by", [
    ("hf_trainer", _hf_folder), ("torchtitan", _torchtitan_nan_folder), ("seed", _seed_halted_folder)])
def test_every_file_an_adapter_writes_has_its_origin(tmp_path, adapter, written_by):
    """Each adapter names where every file it wrote came from; none it built is the trainer's."""
    converted = ADAPTERS[adapter].convert(written_by(tmp_path / "in"), tmp_path / "out", RunFacts(1, "t"))
    assert set(converted.files) == {p.name for p in (tmp_path / "out").iterdir()}
    assert all(said.origin == Origin.DERIVED and said.source for said in converted.files.values()), converted.files


def test_a_flight_recorder_dump_torchtitan_wrote_is_copied_as_its_own(tmp_path):
    converted = ADAPTERS["torchtitan"].convert(EVIDENCE / "torchtitan_hang" / "torchtitan", tmp_path / "run",
                                               RunFacts(1, "torchtitan"))
    said = converted.files["comm_trace_rank0"]
    assert (said.origin, said.text("torchtitan")) == (Origin.TRAINER, "as the trainer wrote it (copied from "
                                                                      "comm_traces/rank_0)")


def test_rank_files_of_one_origin_are_one_items(tmp_path):
    """check-artifacts lists every rank's heartbeat file as one item: their origin, where they share one."""
    folder = _seed_folder(tmp_path / "seed")
    (folder / "heartbeat_rank1.jsonl").write_text('{"ts": 1.0, "step": 1, "msg": "progress"}\n')
    converted = ADAPTERS["seed"].convert(folder, tmp_path / "run", RunFacts(2, "seed"))
    assert converted.file("heartbeat_rank{R}.jsonl") == converted.files["heartbeat_rank1.jsonl"]
    assert converted.file("heartbeat_rank{R}.jsonl").source.startswith("from the trainer's file of that name")
