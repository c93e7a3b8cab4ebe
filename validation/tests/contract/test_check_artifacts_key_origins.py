"""Each adapter says where every key of the env.json it writes came from (``Converted``,
``Origin``): the trainer's own files, the adapter's derivation from them, the harness, or a value
the adapter filled in."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.adapters.base import Converted, Origin
from validation.tests.contract.test_hf_trainer_adapter import _events, _state, needs_tb
from validation.tests.contract.test_torchtitan_adapter import EVIDENCE


def _hf_folder(where: Path) -> Path:
    _state(where, [1, 2, 3, 4], summary=4)
    _events(where, {s: 100.0 + 0.5 * s for s in (1, 2, 3, 4)}, start=100.0)
    return where


def _torchtitan_folder(where: Path) -> Path:
    """The recorded torchtitan run's dump folder with its log kept beside it (``| tee train.log``)."""
    shutil.copytree(EVIDENCE / "torchtitan_go" / "torchtitan", where)
    shutil.copy(EVIDENCE / "torchtitan_go" / "stdout.log", where / "train.log")
    return where


def _seed_folder(where: Path) -> Path:
    """The seed trainer's files: its headerless CSV, a heartbeat, and an env.json of its own."""
    where.mkdir()
    (where / "training.csv").write_text("1,5.5,0.001,100.0\n2,5.4,0.001,110.0\n")
    (where / "heartbeat_rank0.jsonl").write_text('{"ts": 1.0, "step": 1, "msg": "progress"}\n')
    (where / "env.json").write_text(json.dumps({"torch": "2.5.0", "env": {"NSA_X": "1", "WORLD_SIZE": "1"}}))
    return where


@needs_tb
@pytest.mark.parametrize("adapter", ["hf_trainer", "torchtitan", "seed"])
def test_every_key_an_adapter_writes_has_its_origin(tmp_path, adapter):
    """No key of an adapter's env.json is left to ``Converted.origin``'s fallback: each adapter
    names where every key it wrote came from, and none it did not take from the trainer's files is
    the trainer's."""
    written_by = {"hf_trainer": _hf_folder, "torchtitan": _torchtitan_folder, "seed": _seed_folder}[adapter]
    folder = written_by(tmp_path / "in")
    converted = ADAPTERS[adapter].convert(folder, tmp_path / "out", RunFacts(1, "t", "b" * 40, "git", 256))
    assert isinstance(converted, Converted)
    env = json.loads((tmp_path / "out" / "env.json").read_text())
    assert set(env) <= set(converted.env), set(env) - set(converted.env)
    own = {key for key in env if converted.origin(key).origin == Origin.TRAINER}
    assert own == ({"torch", "env"} if adapter == "seed" else set()), own


@pytest.mark.parametrize("launched, origin", [(1, "derived"), (2, "given")])
def test_torchtitans_world_size_is_derived_where_its_rank_files_show_more_ranks_than_launched(tmp_path, launched,
                                                                                              origin):
    folder = tmp_path / "dump"
    (folder / "structured_logs").mkdir(parents=True)
    for rank in (0, 1):
        (folder / "structured_logs" / f"training.global_rank_{rank}.20260105-100000-ABCDEF.jsonl").write_text(
            json.dumps({"rank": rank, "step": 1, "time_ms": 1000, "log_type_name": "step_end"}) + "\n")
    converted = ADAPTERS["torchtitan"].convert(folder, tmp_path / "run", RunFacts(launched, "torchtitan"))
    assert json.loads((tmp_path / "run" / "env.json").read_text())["world_size"] == 2
    assert converted.origin("world_size").origin == origin


def test_a_seed_env_json_without_env_gets_an_empty_one_filled_in(tmp_path):
    folder = _seed_folder(tmp_path / "seed")
    (folder / "env.json").write_text(json.dumps({"torch": "2.5.0"}))
    converted = ADAPTERS["seed"].convert(folder, tmp_path / "run", RunFacts(1, "seed"))
    assert json.loads((tmp_path / "run" / "env.json").read_text())["env"] == {}
    assert (converted.origin("env").origin, converted.origin("world_size").origin) == ("filled in", "given")
