"""``nsa-validate check-artifacts --adapter ...`` says where each key of the env.json an adapter
wrote came from. It said "present env.json: 6 keys" of a Hugging Face Trainer's folder, whose
Trainer writes no env.json: every key was the harness's (world size, tokens per step) or the
adapter's own record, and a user took them for keys their trainer wrote. The origins are the
adapters' typed answer (``Converted``, ``Origin``); the contract's own check prints as before."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from validation.cli import main
from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.adapters.base import Converted, Origin
from validation.judge.provenance import trainer_commit
from validation.tests.contract.test_hf_trainer_adapter import _events, _state, needs_tb
from validation.tests.contract.test_torchtitan_adapter import EVIDENCE, _checked_dump


def _env_lines(out: str) -> dict[str, str]:
    """The word before each env.json key the output names (not those it names missing): {key: word}."""
    said = {}
    for line in out.splitlines():
        tag, name = line[2:22].strip(), line[23:].split(":")[0]
        if name.startswith("env.json ") and not tag.startswith("missing"):
            said[name.removeprefix("env.json ")] = tag
    return said


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
def test_hf_trainer_keys_are_the_harnesses_not_the_trainers(tmp_path, capsys):
    folder = _hf_folder(tmp_path / "out")
    assert main(["check-artifacts", str(folder), "--adapter", "hf_trainer", "--tokens-per-step", "4x64"]) == 0
    out = capsys.readouterr().out
    assert "env.json: 6 keys" not in out, out
    assert ("  derived              env.json: derived by the hf_trainer adapter from what the harness gave it and what "
            "it read (a Trainer writes no env.json); 0 of the 3 keys below are the trainer's own\n") in out, out
    assert _env_lines(out) == {"world_size": "given", "trainer": "given", "tokens_per_step": "given"}, out
    assert ("  given                env.json world_size: given the hf_trainer adapter by the harness, not read from "
            "the trainer's files (the processes it launched; check-artifacts: --world-size)\n") in out, out


def test_torchtitan_keys_say_the_log_line_they_were_derived_from(tmp_path, capsys):
    folder = _torchtitan_folder(tmp_path / "run1")
    assert main(["check-artifacts", str(folder), "--adapter", "torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "env.json: 8 keys" not in out, out
    assert _env_lines(out) == {"contract_version": "filled in", "world_size": "given", "trainer": "given",
                               "tokens_per_step": "derived", "device_mem_gb": "derived"}, out
    assert ("  derived              env.json tokens_per_step: derived by the torchtitan adapter from torchtitan's log "
            "(train.log): its 'global batch size G ... sequence length S' line, G x S\n") in out, out
    assert ("  filled in            env.json contract_version: filled in by the torchtitan adapter: not measured (the "
            "contract version it converts to; torchtitan names none)\n") in out, out


def test_a_restart_the_torchtitan_adapter_read_is_not_said_present(tmp_path, capsys):
    """env.json's adapter.restarts, the adapter's reading of torchtitan's log, was 'present' as if
    the trainer had written it."""
    out = _checked_dump(tmp_path, "1:kill@9,9:", capsys)
    assert ("  derived              env.json adapter.restarts: restarted into the same files: attempt 2 began at step "
            "9 (attempt 1 had logged up to step 8) and logged up to step 30 (derived by the torchtitan adapter from "
            "torchtitan's log (train.log): the lines torchtitan prints as a process begins, after a step was "
            "logged)\n") in out, out


def test_seed_keys_of_the_trainers_own_env_json_are_present_and_the_rest_are_not(tmp_path, capsys):
    assert main(["check-artifacts", str(_seed_folder(tmp_path / "seed")), "--adapter", "seed"]) == 0
    out = capsys.readouterr().out
    assert ("  derived              env.json: derived by the seed adapter from the trainer's env.json: world_size and "
            "trainer set, the commit added, its env kept to the NSA_* variables; 2 of the 4 keys below are the "
            "trainer's own\n") in out, out
    assert _env_lines(out) == {"torch": "present", "env": "present", "world_size": "derived", "trainer": "given"}, out
    assert ("  derived              env.json world_size: derived by the seed adapter from the trainer's env.json's "
            "env.WORLD_SIZE (torchrun's)\n") in out, out


def test_the_contracts_own_check_prints_as_before(tmp_path, capsys):
    """A trainer that writes the contract itself: every file is its own, and its lines are the
    check's as they always were (no key listed, no origin)."""
    run = tmp_path / "native"
    run.mkdir()
    (run / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                      "1,5.5,0.001,100,0.1,1,0.1,0.2\n")
    (run / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1, "fallbacks": {}}\n')
    env = {"world_size": 1, "contract_version": 2, "git_sha": "a" * 40, "attention_backends": {},
           "tokens_per_step": 10, "env": {}, "noop_toggles": [], "model_flops_per_token": 1.0,
           "data_position": {"start": 0, "end": 1}, "device_mem_gb": 8.0}
    (run / "env.json").write_text(json.dumps(env))
    assert main(["check-artifacts", str(run)]) == 0
    assert capsys.readouterr().out == (
        f"{run} against the artifact contract:\n"
        "  present              training.csv: 1 rows, steps 1..1\n"
        "  present              heartbeat_rank{R}.jsonl: rank 0: 1 records\n"
        "  present              env.json: 10 keys\n"
        "OK: every required file is present and well-formed (the run they record is judged by an acceptance "
        "run: a stall, the losses, the gates)\n")


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


def test_the_commit_a_seed_trainer_recorded_is_kept_as_its_own(tmp_path, capsys):
    """The seed adapter wrote the harness's commit over the one the trainer's env.json named:
    check-artifacts, which finds none, said git_sha missing, and an acceptance run recorded the
    commit found at the trainer's root as the trainer's, in place of its own word."""
    folder = _seed_folder(tmp_path / "seed")
    (folder / "env.json").write_text(json.dumps({"torch": "2.5.0", "git_sha": "c" * 40, "env": {}}))
    assert main(["check-artifacts", str(folder), "--adapter", "seed"]) == 0
    out = capsys.readouterr().out
    assert "  present              env.json git_sha: as the trainer wrote it in its env.json\n" in out, out
    assert "missing (optional)   env.json git_sha" not in out, out
    converted = ADAPTERS["seed"].convert(folder, tmp_path / "run", RunFacts(1, "seed", "b" * 40, "git describe"))
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert (env["git_sha"], "git_sha_source" in env) == ("c" * 40, False), env
    assert converted.origin("git_sha").origin == Origin.TRAINER
    assert trainer_commit(env, "b" * 40, "git describe") == ("c" * 40, "env.json git_sha")


def test_a_seed_trainer_that_recorded_no_commit_gets_the_harnesses(tmp_path):
    converted = ADAPTERS["seed"].convert(_seed_folder(tmp_path / "seed"), tmp_path / "run",
                                         RunFacts(1, "seed", "b" * 40, "git describe"))
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert (env["git_sha"], env["git_sha_source"]) == ("b" * 40, "found by the harness at its root: git describe")
    assert (converted.origin("git_sha").origin, converted.origin("git_sha_source").origin) == ("given", "given")


def test_the_trainer_key_says_what_check_artifacts_gave_it(tmp_path, capsys):
    """Its source was "the runbook's trainer.name" while check-artifacts, which reads no runbook,
    gave the adapter a placeholder."""
    assert main(["check-artifacts", str(_seed_folder(tmp_path / "seed")), "--adapter", "seed"]) == 0
    assert ("  given                env.json trainer: given the seed adapter by the harness, not read from the "
            "trainer's files (the runbook's trainer.name; check-artifacts: the placeholder '(checked by hand)', as it "
            "reads no runbook)\n") in capsys.readouterr().out


def _state_only_hf_folder(where: Path) -> Path:
    where.mkdir()
    _state(where, [1, 2], summary=2)
    return where


@pytest.mark.parametrize("name, folder", [("seed", _seed_folder), ("hf_trainer", _state_only_hf_folder),
                                          ("torchtitan", _torchtitan_folder)])
def test_every_adapter_says_the_harnesses_commit_and_where_it_looked_alike(tmp_path, name, folder):
    """The torchtitan adapter decided env.json's git_sha_source by whether the harness found a commit,
    the others by whether it had looked: of a trainer root with no commit to find, torchtitan's
    env.json said null (why none was found, lost) and the others' "found by the harness at its root:
    none: git cannot answer here ..." (found, of nothing). One rule for all three now."""
    why_none = "none: git cannot answer here and there is no SOURCE_SHA stamp"
    cases = [(RunFacts(1, "t", "b" * 40, "git describe"), "b" * 40,
              "found by the harness at its root: git describe"),
             (RunFacts(1, "t", None, why_none), None, f"looked for by the harness at its root: {why_none}"),
             (RunFacts(1, "t"), None, None)]  # check-artifacts: the harness looked nowhere
    trainer_dir = folder(tmp_path / "trainer")
    for i, (facts, sha, source) in enumerate(cases):
        ADAPTERS[name].convert(trainer_dir, tmp_path / f"run{i}", facts)
        env = json.loads((tmp_path / f"run{i}" / "env.json").read_text())
        assert (env.get("git_sha"), env.get("git_sha_source")) == (sha, source), (name, facts, env)
