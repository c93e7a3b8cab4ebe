"""``nsa-validate check-artifacts --adapter ...`` says where each file an adapter wrote came from.
It said "present training.csv" of a Hugging Face Trainer's folder, whose Trainer writes no
training.csv: the adapter built it from trainer_state.json and the TensorBoard events, and a user
took it for a file their trainer wrote. So were torchtitan's heartbeats (from its metrics lines)
and .HALT (from a log line), and every file the seed adapter rewrites. The origins are the
adapters' typed answer (``Converted.files``, ``FileOrigin``); a file missing or malformed, and the
contract's own check, print as before."""
from __future__ import annotations

from pathlib import Path

import pytest

from validation.cli import main
from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.adapters.base import Origin
from validation.tests.contract.test_check_artifacts_key_origins import _hf_folder, _seed_folder, _torchtitan_folder
from validation.tests.contract.test_hf_trainer_adapter import needs_tb
from validation.tests.contract.test_torchtitan_adapter import EVIDENCE, _attempts


def _file_lines(out: str) -> dict[str, str]:
    """The word before each file the output names (not a key inside one): {file: word}."""
    said = {}
    for line in out.splitlines():
        tag, name = line[2:22].strip(), line[23:].split(":")[0]
        if line.startswith("  ") and " " not in name:
            said[name] = tag
    return said


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
def test_hf_trainers_training_csv_is_derived_from_its_state_and_events(tmp_path, capsys):
    folder = _hf_folder(tmp_path / "out")
    assert main(["check-artifacts", str(folder), "--adapter", "hf_trainer", "--tokens-per-step", "4x64"]) == 0
    out = capsys.readouterr().out
    assert "  present              training.csv" not in out, out
    assert ("  derived              training.csv: 4 rows, steps 1..4 (derived by the hf_trainer adapter from "
            "trainer_state.json's log_history and the TensorBoard events under runs/)\n") in out, out
    assert ("  derived              env.json: derived by the hf_trainer adapter from what the harness gave it and what "
            "it read (a Trainer writes no env.json); 0 of the 3 keys below are the trainer's own\n") in out, out


def test_torchtitans_heartbeats_of_its_metrics_lines_are_derived(tmp_path, capsys):
    """No structured logs: rank 0's heartbeats are the adapter's, one a logged step."""
    folder = _torchtitan_folder(tmp_path / "run1")
    assert main(["check-artifacts", str(folder), "--adapter", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert _file_lines(out) == {"training.csv": "derived", "heartbeat_rank{R}.jsonl": "derived",
                                "env.json": "derived"}, out
    assert ("  derived              heartbeat_rank{R}.jsonl: rank 0: 30 records (derived by the torchtitan adapter "
            "from the steps of torchtitan's log (train.log) and the TensorBoard events under tb/: rank 0's alone, a "
            "record a logged step, as the folder holds no structured logs, which every rank writes)\n") in out, out


def test_torchtitans_halt_is_derived_from_its_log_line(tmp_path, capsys):
    assert main(["check-artifacts", str(_torchtitan_nan_folder(tmp_path / "nan")), "--adapter", "torchtitan"]) == 0
    out = capsys.readouterr().out
    [halt] = [line for line in out.splitlines() if line[23:].startswith(".HALT")]
    assert halt.startswith("  derived              .HALT: run stopped: {"), out
    assert halt.endswith("(derived by the torchtitan adapter from torchtitan's log (train.log): its 'Loss is not "
                         "finite ... at step 12' line)"), halt


def test_every_file_the_seed_adapter_rewrites_is_derived(tmp_path, capsys):
    assert main(["check-artifacts", str(_seed_halted_folder(tmp_path / "seed")), "--adapter", "seed"]) == 0
    out = capsys.readouterr().out
    assert _file_lines(out) == {"training.csv": "derived", "heartbeat_rank{R}.jsonl": "derived", "env.json": "derived",
                                ".HALT": "derived", "stackdump_rank0.txt": "derived"}, out
    assert ("  derived              stackdump_rank0.txt: stack dump of rank 0 (derived by the seed adapter from the "
            "trainer's stackdump_1700000000.txt: its traceback.format_stack text in faulthandler's format)\n") in out, out


def test_a_malformed_file_an_adapter_copied_is_said_malformed_as_before(tmp_path, capsys):
    """The seed's env.json that is not JSON is copied as it is: the check names it malformed, with
    no word of where it came from."""
    folder = _seed_folder(tmp_path / "seed")
    (folder / "env.json").write_text('{"torch": ')
    assert main(["check-artifacts", str(folder), "--adapter", "seed"]) == 1
    [line] = [line for line in capsys.readouterr().out.splitlines() if line[23:].startswith("env.json")]
    assert line.startswith("  malformed            env.json: ") and "adapter" not in line, line


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

