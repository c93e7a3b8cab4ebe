"""``nsa-validate check-artifacts --adapter hf_trainer`` judges a Hugging Face Trainer's output folder
as ``nsa-validate run`` does: the run gives the adapter the runbook's tokens per step
(``trainer.tokens_per_step``), from which it derives tokens/s, and ``--tokens-per-step`` gives what
the runbook gives, with its meaning: one rank's tokens per step, times the world size. A folder one
of whose logged steps no TensorBoard event times is evidence missing, not a broken folder: both
say which steps have no time and why, and the run's gates on tokens/s are UNMEASURED."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from validation.cli import main
from validation.tests.contract.test_hf_trainer_adapter import _events, _state, needs_tb

#: a stand-in for a Trainer script: it leaves a prepared output folder as the one it wrote
_COPY = """\
import argparse, os, shutil
cli = argparse.ArgumentParser()
for flag in ("--max_steps", "--output_dir", "--per_device_train_batch_size", "--block_size"):
    cli.add_argument(flag)
a = cli.parse_args()
shutil.copytree(os.environ["COPY_FROM"], a.output_dir, dirs_exist_ok=True)
"""


def _folder(where: Path, timed: list[int]) -> Path:
    """A Trainer's output folder of steps 1-6, the steps ``timed`` with their TensorBoard events."""
    _state(where, [1, 2, 3, 4, 5, 6], summary=6)
    _events(where, {s: 1000.0 + 0.5 * s for s in timed}, start=1000.0)
    return where


def _run(tmp_path: Path, folder: Path, tokens: bool, monkeypatch) -> tuple[int, dict]:
    """``nsa-validate run`` of a runbook whose trainer leaves ``folder``: its exit status and record."""
    root = tmp_path / "trainer"
    root.mkdir(exist_ok=True)
    (root / "copy_out.py").write_text(_COPY)
    monkeypatch.setenv("COPY_TRAINER_ROOT", str(root))
    rb = tmp_path / f"rb_{folder.name}.yaml"
    rb.write_text(textwrap.dedent(f"""\
        name: hf_copy
        profiles: [cpu]
        trainer:
          name: hf.copy
          root: {{env: COPY_TRAINER_ROOT}}
          script: copy_out.py
          steps: {{flag: --max_steps}}
          out_dir: {{flag: --output_dir}}
          params:
            train.batch_size: {{flag: --per_device_train_batch_size}}
            train.block_size: {{flag: --block_size}}
          env: {{COPY_FROM: {folder}}}
          {"tokens_per_step: [train.batch_size, train.block_size]" if tokens else ""}
          format: hf_trainer
        defaults:
          launcher: {{kind: python}}
          overrides: {{train.batch_size: 4, train.block_size: 64}}
          steps: 6
          timeout_s: 60
        phases:
          - name: train
            kind: train
            gates:
              - {{metric: loss_finite, op: "==", threshold: 1}}
              - {{metric: toks_per_s_mean, op: ">=", threshold: 1}}
        """))
    results = tmp_path / f"results_{folder.name}_{tokens}"
    code = main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"])
    [rec] = json.loads((results / "results.json").read_text())["records"].values()
    return code, rec


#: why steps 3 and 4 of the folder with no event of step 3 have no time, as the adapter says it
UNTIMED = ("no time for steps 3, 4 of 6 logged: no TensorBoard event of step 3, which trainer_state.json's "
           "log_history logs (a step's time runs from the logged step before it)")


@needs_tb
@pytest.mark.parametrize("tokens", [True, False], ids=["tokens_per_step", "none"])
@pytest.mark.parametrize("timed", [[1, 2, 3, 4, 5, 6], [1, 2, 4, 5, 6]], ids=["every-step-timed", "step-3-untimed"])
def test_check_artifacts_and_run_agree_on_a_hf_trainer_folder(tmp_path, monkeypatch, capsys, timed, tokens):
    """A step the Trainer logged that no TensorBoard event holds made the run an ERROR, 'training.csv
    toks_per_s: malformed (step 3 holds nan (2 of 6 rows) ...', and check-artifacts said malformed,
    though none of the Trainer's files is broken: a step time that cannot be measured is missing
    evidence. Both pass the folder and name the untimed steps and why; the gate on tokens/s is
    UNMEASURED, saying so."""
    folder = _folder(tmp_path / "out", timed)
    code, rec = _run(tmp_path, folder, tokens, monkeypatch)
    capsys.readouterr()
    given = ["--tokens-per-step", "4x64"] if tokens else []  # the runbook's factors: batch size 4 of 64 tokens
    checked = main(["check-artifacts", str(folder), "--adapter", "hf_trainer", *given])
    said = capsys.readouterr().out
    assert checked == 0 and "malformed" not in said, said
    every = len(timed) == 6
    if every and tokens:
        assert (code, rec["status"]) == (0, "PASS"), rec["reason"]
    else:  # tokens/s UNMEASURED: no tokens per step, or steps the events do not time
        gate = next(g for g in rec["gates"] if g["metric"] == "toks_per_s_mean")
        assert (rec["status"], gate["value"], gate["verdict"]) == ("UNMEASURED", None, "UNMEASURED"), rec["reason"]
        assert rec["reason"] == f"metric the trainer does not provide: toks_per_s_mean ({gate['note']})"
        assert code != 0
    if not every:
        assert f"missing (optional)   training.csv step_time_s: step 3 holds nan (2 of 6 rows): {UNTIMED}" in said, said
    if not every and tokens:
        assert gate["note"] == f"training.csv has no toks_per_s of every logged step: {UNTIMED}", gate["note"]
        assert f"missing (optional)   training.csv toks_per_s: step 3 holds nan (2 of 6 rows): {UNTIMED}" in said, said
    assert ("given the adapter: world size 1, 256 tokens per step (256 a rank)" if tokens else
            "given the adapter: world size 1, no tokens per step (--tokens-per-step)") in said, said


@needs_tb
def test_tokens_per_step_is_one_ranks_times_the_world_size(tmp_path, capsys):
    """As the run multiplies the runbook's factors by its world size (launch/foreign.py): with
    --world-size 2, 4x64 a rank is 512 tokens a step, the rate of a 0.5 s step 1024 tokens/s."""
    from validation.judge import check_command

    folder = _folder(tmp_path / "out", [1, 2, 3, 4, 5, 6])
    seen = {}
    real = check_command._read_ended

    def keep(directory, costs, launched):
        seen["csv"] = (directory / "training.csv").read_text()
        seen["env"] = json.loads((directory / "env.json").read_text())
        return real(directory, costs, launched)

    import unittest.mock
    with unittest.mock.patch.object(check_command, "_read_ended", keep):
        assert main(["check-artifacts", str(folder), "--adapter", "hf_trainer", "--world-size", "2",
                     "--tokens-per-step", "4x64"]) == 0
    assert seen["env"]["tokens_per_step"] == 512 and seen["env"]["world_size"] == 2
    assert [line.split(",")[3] for line in seen["csv"].splitlines()[1:]] == ["1024.0"] * 6
    assert "given the adapter: world size 2, 512 tokens per step (256 a rank)" in capsys.readouterr().out


@pytest.mark.parametrize("adapter", ["contract", "seed", "torchtitan"])
def test_tokens_per_step_is_refused_for_a_format_that_says_its_own_rate(tmp_path, capsys, adapter):
    assert main(["check-artifacts", str(tmp_path), "--adapter", adapter, "--tokens-per-step", "256"]) == 2
    err = capsys.readouterr().err
    assert f"--tokens-per-step is for --adapter hf_trainer, whose tokens/s the harness derives from it; {adapter}'s " \
           "files say their own tokens/s (or none)" in err, err


def test_tokens_per_step_takes_a_number_or_its_factors(tmp_path, capsys):
    with pytest.raises(SystemExit) as bad:
        main(["check-artifacts", str(tmp_path), "--adapter", "hf_trainer", "--tokens-per-step", "4x0"])
    assert bad.value.code == 2
    assert "expected a whole number >= 1 or factors such as 4x64, got '4x0'" in capsys.readouterr().err
