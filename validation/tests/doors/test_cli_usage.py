"""The CLI as a user types it: defects found by using it (a baseline of another runbook or the
results directory itself, --profile without --runbook, a closed pipe, runbooks given by path,
signals, check-artifacts on directories of the other format). Most stores are built from SKIP
records; the few runs use the fake trainer (validation/tests/fake_trainer.py)."""
from __future__ import annotations

import io
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation import REPO_ROOT
from validation.cli import _Progress, main
from validation.judge.record import PhaseRecord, Status
from validation.machine import Machine
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store import bless, goldens
from validation.store.goldens import GoldenError
from validation.store.results import ResultStore
from validation.tests.conftest import default_sigint, error_line, train_phase, write_runbook


def _store(results: Path, runbook: Path) -> None:
    """A store holding a SKIP record of every point of ``runbook`` on the cpu profile."""
    rb, prof = load_runbook(runbook), load_profile("cpu")
    ResultStore(results).put_many([PhaseRecord.for_point(p, Status.SKIP, "staged", hardware=Machine())
                                   for p in expand(rb, prof)])


def test_a_baseline_of_another_runbook_is_an_error_naming_what_it_holds(tmp_path, capsys):
    """It once rendered 'No point is stored on both sides', commit 'not recorded', date 'no runs':
    a comparison that compared nothing, and a regression gate that could not fire."""
    cur, base = tmp_path / "cur", tmp_path / "base"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    _store(base, write_runbook(tmp_path / "b.yaml", [train_phase()], name="other"))
    assert main(["report", "--results-dir", str(cur), "--baseline", str(base), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"--baseline {base}: no records of runbook fake, profile cpu (it holds: other/cpu)" in err
    assert not (cur / "reports").exists()


def test_the_results_dir_itself_as_baseline_is_an_error(tmp_path, capsys):
    """Every point compared with itself: +0.0% everywhere, a regression gate that always passes."""
    cur = tmp_path / "cur"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    assert main(["report", f"--results-dir={cur}", f"--baseline={cur}/.", "--no-plots"]) == 2
    assert "is the results directory itself" in capsys.readouterr().err


def test_report_of_a_runbook_the_store_holds_no_records_of_is_a_usage_error(tmp_path, capsys):
    """--runbook cpu_smoke on a store of another runbook rendered an all-NOT RUN report (exit 3),
    where --profile in the same case is a usage error naming what the store holds."""
    cur = tmp_path / "cur"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    assert main(["report", "--results-dir", str(cur), "--runbook", "cpu_smoke", "--no-plots"]) == 2
    assert f"no records of cpu_smoke/cpu in {cur / 'results.json'} (it holds: fake/cpu)" in capsys.readouterr().err
    assert not (cur / "reports").exists()


def test_report_profile_without_runbook_selects_that_profile(tmp_path, capsys):
    """--profile alone was ignored: the report of every stored pair was rendered."""
    cur = tmp_path / "cur"
    _store(cur, write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake"))
    assert main(["report", "--results-dir", str(cur), "--profile", "h100", "--no-plots"]) == 2
    assert f"no records of profile h100 in {cur / 'results.json'} (it holds: fake/cpu)" in capsys.readouterr().err
    assert not (cur / "reports").exists()
    assert main(["report", "--results-dir", str(cur), "--profile=cpu", "--no-plots"]) == 3
    assert (cur / "reports" / "fake__cpu.md").is_file()


def test_output_into_a_closed_pipe_is_no_traceback():
    """`nsa-validate phases | head -1` ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "validation", "phases", "--runbook", "nsa_ddp_a100"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "Exception ignored" not in err, err


def test_each_subcommand_help_lists_only_options_it_uses(capsys):
    """`phases --results-dir` was accepted and ignored; report's --no-plots said nothing; phases'
    --profile said its default came from 'the results dir', which phases has none of."""
    for cmd in ("phases", "report"):
        try:
            main([cmd, "--help"])
        except SystemExit:
            pass
    out = capsys.readouterr().out
    phases_help, report_help = out.split("usage: nsa-validate report")
    assert "--results-dir" not in phases_help and "results dir" not in phases_help, phases_help
    assert "(default: the runbook's first)" in " ".join(phases_help.split())
    assert "--no-plots            render the report without PNG plots" in report_help


def test_an_unknown_config_preset_is_refused_when_the_runbook_loads(tmp_path, capsys):
    """`config: tiniest` loaded fine and every train point then crashed (trainer exit 2)."""
    rb = tmp_path / "rb.yaml"
    rb.write_text("name: x\nprofiles: [cpu]\ndefaults: {config: tiniest}\nphases:\n  - {name: p, kind: train}\n")
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    # named where it was written: the phase takes it from defaults
    assert f"{rb}: defaults.config: unknown config preset 'tiniest'; presets: " in err and "tiny" in err
    assert not (tmp_path / "r").exists()


def test_a_missing_runbook_or_profile_lists_the_ones_there_are(capsys):
    assert main(["run", "--runbook", "cpu_smok"]) == 2
    assert "no runbook 'cpu_smok' under " in capsys.readouterr().err.replace("\n", " ")
    assert main(["phases", "--runbook", "cpu_smoke", "--profile=cpux"]) == 2
    err = capsys.readouterr().err
    assert "no profile 'cpux' under " in err and "profiles: a100, cpu, h100, h200" in err


def test_bless_commands_name_a_runbook_given_by_path(tmp_path):
    """For a runbook outside runbooks/, the suggested commands named it by name alone: run as
    printed, bless would take the repository's runbook of that name and write runbooks/goldens/."""
    path = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4)], name="cpu_smoke")
    rb, prof = load_runbook(path), load_profile("cpu")
    assert rb.cli_name == str(path) and load_runbook("cpu_smoke").cli_name == "cpu_smoke" and prof.cli_name == "cpu"
    (tmp_path / "res").mkdir()
    with pytest.raises(GoldenError, match=f"nsa-validate run --runbook {path} --profile cpu --phase long_run"):
        bless.bless(tmp_path / "res", rb, prof, bless.select(rb, prof, None, None))
    note = goldens.gate(expand(rb, prof)[0], None, Machine(), tmp_path / "res").note
    # the store is named: pasted without it, bless would take another store's run of the point
    assert (f"`nsa-validate bless --runbook {path} --profile cpu --point long_run/default --results-dir "
            f"{(tmp_path / 'res').resolve()}`") in note


def test_the_reports_rerun_command_names_a_runbook_given_by_path(tmp_path):
    """The report's rerun line said --runbook <name>: for a runbook outside runbooks/ it re-ran
    the repository's runbook of that name (or none) instead."""
    path = write_runbook(tmp_path / "rb.yaml", [train_phase()], name="cpu_smoke")
    rb, prof = load_runbook(path), load_profile("cpu")
    ResultStore(tmp_path / "res").put(PhaseRecord.for_point(expand(rb, prof)[0], Status.PASS, "",
                                                            command=["python", "-m", "x"], hardware=Machine()))
    ctx = build_context(tmp_path / "res", rb.name, prof.name, runbook=rb, profile=prof)
    assert [r["rerun"] for r in ctx["reproduce"]] == [
        f"pytest {REPO_ROOT}/validation/tests/test_acceptance.py -m baseline_ddp --runbook {path} --profile cpu "
        f"--results-dir={tmp_path / 'res'}"]


def test_check_artifacts_world_size_without_an_adapter_is_refused(tmp_path, capsys):
    """It was accepted and ignored: the contract's env.json says the world size."""
    assert main(["check-artifacts", str(tmp_path), "--world-size=2"]) == 2
    err = capsys.readouterr().err
    assert "--world-size is for an adapter (--adapter " in err and "seed" in err.split("(--adapter ")[1], err
    assert main(["check-artifacts", str(tmp_path), "--adapter", "seed", "--world-size", "2"]) == 1


def test_a_results_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    """`run --results-dir results.json` (a file) ended in a NotADirectoryError traceback."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    (tmp_path / "f").write_text("x")
    for results in (tmp_path / "f", tmp_path / "f" / "sub"):
        assert main(["run", "--runbook", str(rb), "--results-dir", str(results)]) == 2
        assert f"results directory {results}: {tmp_path / 'f'} is a file, not a directory" in capsys.readouterr().err
    assert main(["report", "--results-dir", str(tmp_path / "f")]) == 2  # the same words from both commands
    assert f"results directory {tmp_path / 'f'}: {tmp_path / 'f'} is a file, not a directory" in capsys.readouterr().err


def test_check_artifacts_names_the_adapter_that_reads_a_directory(tmp_path, capsys):
    """A seed-format directory checked without --adapter (or a contract one with --adapter seed)
    said only 'malformed ... header is 1,5.5,...' (or 'row 2 ... step is not a number', a row of
    the adapter's temporary copy): nothing told the author which check would pass."""
    seed, native = tmp_path / "seed", tmp_path / "native"
    seed.mkdir(), native.mkdir()
    (seed / "training.csv").write_text("1,5.5,0.001,100.0\n2,5.4,0.001,110.0\n")
    (seed / "heartbeat_rank0.jsonl").write_text('{"ts": 1.0, "step": 1, "msg": "train"}\n')
    (seed / "env.json").write_text("{}")
    (native / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                         "1,5.5,0.001,100,0.1,1,0.1,0.2\n")
    (native / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    (native / "env.json").write_text('{"world_size": 1}')
    assert main(["check-artifacts", str(seed)]) == 1
    assert f"hint: {seed} holds to the contract through --adapter seed" in capsys.readouterr().out
    assert main(["check-artifacts", str(native), "--adapter=seed"]) == 1
    assert f"hint: {native} holds to the contract as it is: check it without --adapter" in capsys.readouterr().out
    assert main(["check-artifacts", str(native)]) == 0
    assert "hint" not in capsys.readouterr().out
    # user15's pass: a contract directory whose every rank appended its rows (1,1,2,2) is malformed,
    # and the hint said 'holds to the contract through --adapter seed': the seed's reading keeps the
    # rows after the last repeated step only, and the seed's training.csv has no header at all
    (native / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                         + "".join(f"{s},5.5,0.001,100,0.1,1,0.1,0.2\n" for s in (1, 1, 2, 2)))
    (native / "heartbeat_rank0.jsonl").write_text("".join(f'{{"time": {s}.0, "step": {s}, "pid": 7}}\n' for s in (1, 2)))
    assert main(["check-artifacts", str(native)]) == 1
    out = capsys.readouterr().out
    assert "malformed            training.csv step" in out and "hint" not in out, out


def test_the_contracts_reader_has_one_name_in_runbooks_check_artifacts_and_phases(tmp_path, capsys):
    """docs/guides/your-trainer.md named a runbook key `adapter:` with values native and seed; the
    key is trainer.format (contract, seed, torchtitan, hf_trainer), while check-artifacts --adapter
    offered native and `phases` printed 'adapter native'. They all say contract now; --adapter native,
    the old word, still checks the contract."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                      "1,5.5,0.001,100,0.1,1,0.1,0.2\n")
    (run / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    (run / "env.json").write_text('{"world_size": 1}')
    for argv in ([], ["--adapter", "contract"], ["--adapter=native"]):
        assert main(["check-artifacts", str(run), *argv]) == 0, argv
        out = capsys.readouterr().out
        assert out.startswith(f"{run} against the artifact contract:\n") and "hint" not in out, out
    assert main(["check-artifacts", str(run), "--adapter", "contract", "--world-size", "2"]) == 2
    assert "--world-size is for an adapter (--adapter hf_trainer/seed/torchtitan)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check-artifacts", "--help"])
    assert "--adapter {contract,hf_trainer,seed,torchtitan}" in capsys.readouterr().out
    assert main(["phases", "--runbook", str(REPO_ROOT / "docs" / "guides" / "your_trainer_example.yaml")]) == 0
    assert "in tests/trainers, format contract, phases train, resume\n" in capsys.readouterr().out
    guide = (REPO_ROOT / "docs" / "guides" / "your-trainer.md").read_text()
    assert "`adapter:`" not in guide and "`format:`" in guide
    # a runbook that says adapter: or format: native is told the key and the value
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}
    for extra, said in (({"adapter": "native"}, "trainer.adapter: unknown key (the reader of its files is format: "
                                                "contract, the default, seed, torchtitan or hf_trainer)"),
                        ({"format": "native"}, "trainer.format: 'native' is not one of contract, seed, torchtitan, "
                                               "hf_trainer: a trainer that writes the contract itself is format "
                                               "contract (the default)")):
        rb = write_runbook(tmp_path / "rb.yaml", [train_phase()], trainer={**trainer, **extra})
        assert main(["phases", "--runbook", str(rb)]) == 2
        assert said in capsys.readouterr().err


def test_check_artifacts_warns_of_a_bare_nan_in_a_json_file(tmp_path, capsys):
    """docs/artifact_contract.md: the contract's JSON files are strict, a non-finite number the
    string "nan"; check-artifacts said OK for an env.json holding a bare NaN (Python's json writes
    one by default, jq and JSON.parse refuse it). A warning names the file and key; the harness
    reads the file all the same, so the check still passes (exit 0)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                      "1,5.5,0.001,100,0.1,1,0.1,0.2\n2,5.4,0.001,100,0.1,1,0.1,0.2\n")
    (run / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1, "loss": NaN}\n{"time": 2.0, "step": 2}\n'
                                               '{"time": 3.0, "step": 2, "loss": NaN}\n')
    (run / "env.json").write_text('{"world_size": 1, "loss_scale": NaN, "env": {"NSA_X": "1"}, "peaks": [1, -Infinity]}')
    assert main(["check-artifacts", str(run)]) == 0
    out = capsys.readouterr().out
    assert '  warning: env.json loss_scale: a bare NaN, which strict JSON has not' in out, out
    assert 'write the string "nan"' in out
    assert '  warning: env.json peaks[1]: a bare -Infinity, which' in out and 'write the string "-inf"' in out
    assert "  warning: heartbeat_rank0.jsonl loss: a bare NaN (line 1; 1 more line(s))" in out, out
    assert out.count("warning:") == 3 and out.rstrip().endswith("the gates)")
    (run / "env.json").write_text('{"world_size": 1, "loss_scale": "nan"}')  # the contract's string: no warning
    (run / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n{"time": 2.0, "step": 2}\n')
    assert main(["check-artifacts", str(run)]) == 0
    assert "warning" not in capsys.readouterr().out


def test_a_baseline_of_some_stored_pairs_compares_those_and_renders_the_rest(tmp_path, capsys):
    """A store of several runbooks against a baseline of one: the others are rendered without a
    comparison (and said so), rather than failing the whole report."""
    cur, base = tmp_path / "cur", tmp_path / "base"
    a = write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake")
    _store(cur, a), _store(cur, write_runbook(tmp_path / "b.yaml", [train_phase()], name="other")), _store(base, a)
    assert main(["report", "--results-dir", str(cur), "--baseline", str(base), "--no-plots"]) == 3
    assert f"--baseline {base} holds no records of other/cpu; its report has no comparison" in capsys.readouterr().err
    assert "Comparison with Baseline" in (cur / "reports" / "fake__cpu.md").read_text()
    assert "Comparison with Baseline" not in (cur / "reports" / "other__cpu.md").read_text()


def test_a_trainer_root_outside_the_repository_says_how_to_name_it(tmp_path, capsys):
    """`root: /path/to/my/trainer` (what a trainer author writes first) was refused as 'must be a
    relative path without ..', not saying that {env: VAR} is the way to a checkout elsewhere."""
    rb = tmp_path / "rb.yaml"
    rb.write_text("name: x\nprofiles: [cpu]\ntrainer: {name: t, root: /opt/mine, script: train.py,\n"
                  "  args: [--steps, '{steps}', --out, '{out_dir}']}\nphases:\n  - {name: p, kind: train}\n")
    assert main(["phases", "--runbook", str(rb)]) == 2
    assert ("trainer.root: '/opt/mine' is outside this repository; name it through an environment variable: "
            "root: {env: MY_TRAINER_ROOT}, then export MY_TRAINER_ROOT=/opt/mine") in capsys.readouterr().err


def test_an_unknown_trainer_commit_is_not_said_to_come_from_git(tmp_path):
    """'at an unknown commit (from git describe)' for a trainer root that is no git checkout."""
    rb, prof = load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase()])), load_profile("cpu")
    ResultStore(tmp_path / "res").put(PhaseRecord.for_point(expand(rb, prof)[0], Status.PASS, "", hardware=Machine(),
                                                            trainer="mine", trainer_sha_source="git describe"))
    text = render_text({**build_context(tmp_path / "res", rb.name, prof.name, runbook=rb, profile=prof),
                        "results_prefix": ".."})
    assert ("- **Trainer**: mine (the runbook's `trainer:`), at no recorded commit (its env.json names no git_sha, "
            "and its root is not a git repository of its own)\n") in text
    assert "- **Git SHA**: not recorded\n" in text


def test_report_judges_a_store_against_the_runbook_it_ran_from(tmp_path, capsys):
    """`run --runbook /my/cpu_smoke.yaml` said GO; `report` of that store then judged it against
    runbooks/cpu_smoke.yaml (another runbook of the same name): INCOMPLETE, 'N point(s) not run'."""
    rb = write_runbook(tmp_path / "cpu_smoke.yaml", [train_phase()], name="cpu_smoke")
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
    assert main(["report", "--results-dir", str(res), "--no-plots"]) == 0
    assert f"- **Runbook**: cpu_smoke (`{rb}`)" in (res / "reports" / "cpu_smoke__cpu.md").read_text()


def test_bless_refuses_a_run_of_another_runbook_file_of_the_same_name(tmp_path, capsys):
    """A run of /my/cpu_smoke.yaml (say, with a changed window) blessed with the default --runbook
    cpu_smoke would have written its curve into runbooks/goldens/ as the repository's golden."""
    path = write_runbook(tmp_path / "mine.yaml", [train_phase("long_run", golden_steps=4)], name="fake")
    mine, prof = load_runbook(path), load_profile("cpu")
    (tmp_path / "other").mkdir()
    other = load_runbook(write_runbook(tmp_path / "other" / "mine.yaml", [train_phase("long_run", golden_steps=4)],
                                       name="fake"))
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(path), "--results-dir", str(res), "--no-report"]) == 0
    with pytest.raises(GoldenError, match=f"ran from runbook {path}, not {other.path}; nothing blessed"):
        bless.bless(res, other, prof, bless.select(other, prof, None, None))
    assert not (tmp_path / "other" / "goldens").exists()
    assert [b.point for b in bless.bless(res, mine, prof, bless.select(mine, prof, None, None))] == ["long_run/default"]


def test_help_states_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "0 GO, 1 NO-GO, 3 INCOMPLETE (run --no-report: 0 once stored)" in out and "128 + the signal" in out


def test_progress_in_a_log_has_no_line_per_point_at_0s():
    """A log (not a terminal) got '  ... <point>:     0s' right after every '[n/N] <point> ...'."""
    log = io.StringIO()
    progress = _Progress(log, every_s=5.0)
    progress.update("a", "a:    12s step 3/12")
    progress.done("a", "[1/2] a: PASS")
    progress.done(None, "[2/2] b ...")
    progress.update("b", "b:     0s")
    assert log.getvalue() == "  ... a:    12s step 3/12\n[1/2] a: PASS\n[2/2] b ...\n"


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "a directory, expected a YAML file"),
    (lambda p: p.write_bytes(b"\xff\xfe name: x"), "not a readable YAML text file ("),
    (lambda p: p.write_text(""), "the file is empty; expected a mapping of keys (name, profiles, phases, ...)"),
], ids=["directory", "not-utf8", "empty"])
def test_a_runbook_that_is_no_yaml_text_is_an_error_naming_it(tmp_path, capsys, make, message):
    """A directory or a binary file given as --runbook ended in a traceback; an empty one said 'got NoneType'."""
    path = tmp_path / "rb.yaml"
    make(path)
    assert main(["run", "--runbook", str(path)]) == 2
    assert f"nsa-validate: error: {path}: {message}" in capsys.readouterr().err


def test_a_profile_file_whose_name_no_runbook_lists_says_its_name_and_what_to_do(tmp_path, capsys):
    """user hG's pass: a copy of cpu.yaml renamed to `name: mycpu` failed with 'no selected
    runbook uses it (... their profiles: cpu)', naming neither the file's profile name nor that
    the runbook's profiles: must list it."""
    prof = tmp_path / "my_cpu.yaml"
    prof.write_text((REPO_ROOT / "runbooks" / "profiles" / "cpu.yaml").read_text().replace("name: cpu", "name: mycpu", 1))
    assert main(["run", "--profile", str(prof), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert (f"--profile {prof}: no selected runbook uses it (runbooks: cpu_smoke; their profiles: cpu). {prof} is "
            "profile 'mycpu' (its name: key), and a runbook runs only the profiles its profiles: lists, by name, "
            "whatever file they come from: keep a listed name (cpu) in the file, or add mycpu to the runbook's "
            "profiles:") in err, err
    assert not (tmp_path / "r").exists()


def test_an_empty_profile_file_names_a_profile_s_keys(tmp_path, capsys):
    """It named a runbook's (name, profiles, phases)."""
    path = tmp_path / "prof.yaml"
    path.write_text("")
    assert main(["run", "--profile", str(path)]) == 2
    assert (f"nsa-validate: error: {path}: the file is empty; expected a mapping of keys (name, marker, hardware, "
            "thresholds, ...)") in capsys.readouterr().err


def test_the_report_names_a_relative_baseline_by_its_absolute_path(tmp_path, monkeypatch):
    """`--baseline base` was named `base` in the report, which says nothing once it is read elsewhere."""
    rb = write_runbook(tmp_path / "a.yaml", [train_phase()], name="fake")
    _store(tmp_path / "cur", rb), _store(tmp_path / "base", rb)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--results-dir", "cur", "--baseline", "base", "--no-plots"]) == 3
    assert f"- **Baseline**: `{tmp_path / 'base'}`" in (tmp_path / "cur" / "reports" / "fake__cpu.md").read_text()


def test_check_artifacts_names_a_rank_without_heartbeats(tmp_path, capsys):
    """env.json said world_size 2 and only rank 0 wrote heartbeats: the check said OK, and the
    first acceptance run then failed its idle_ranks gate."""
    (tmp_path / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,"
                                           "mem_reserved_gb\n1,5.5,0.001,100,0.1,1,0.1,0.2\n")
    (tmp_path / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    (tmp_path / "env.json").write_text('{"world_size": 2}')
    assert main(["check-artifacts", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "missing              heartbeat_rank1.jsonl: not written (env.json says world_size 2)" in out
    # user7's pass: a trainer whose rank 1 opened its file and never wrote a record got OK ("rank 1: 0 records")
    (tmp_path / "heartbeat_rank1.jsonl").write_text("")
    assert main(["check-artifacts", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "missing              heartbeat_rank1.jsonl: no record written (env.json says world_size 2)" in out, out
    (tmp_path / "heartbeat_rank1.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    assert main(["check-artifacts", str(tmp_path)]) == 0


def test_a_config_file_the_trainer_will_not_find_is_bad_input(tmp_path, capsys):
    """`config: mycfg.yaml` of no file in the checkout launched every point, each 'rank 0 crashed
    ... config file not found', NO-GO (exit 1): bad input (exit 2) naming the key, the path looked
    for and where the trainer reads it from."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()], defaults={"config": "mycfg.yaml"})
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert (f"nsa-validate: error: {rb}: defaults.config: config file 'mycfg.yaml' not found: looked for "
            f"{REPO_ROOT / 'mycfg.yaml'}. This project's trainer runs from the checkout ({REPO_ROOT})") in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["run", "phases"])
def test_an_override_value_the_trainer_refuses_is_bad_input(tmp_path, capsys, command):
    """`overrides: {train.batch_size: two}` for this project's trainer ran its point, which the
    trainer refused ("expected an integer, got 'two'", exit 2), read as 'rank 0 crashed': NO-GO
    (exit 1), blaming the trainer for the runbook's typo. Now bad input (exit 2) before anything
    runs: one line naming the runbook, the phase, the key and what the trainer expected."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(overrides={"train.batch_size": "two"})],
                       defaults={"launcher": {"kind": "python", "module": "nsa.train"}})
    extra = ["--results-dir", str(tmp_path / "r")] if command == "run" else []
    assert main([command, "--runbook", str(rb), *extra]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"nsa-validate: error: {rb}: phases[0] (override train.batch_size): the trainer refuses "
                           "it (nsa.train --check-config): "), line
    assert "train.batch_size: expected an integer, got 'two'" in line, line
    assert not (tmp_path / "r").exists()


def test_an_empty_heartbeat_file_of_the_only_rank_fails_both_the_check_and_the_run(tmp_path, capsys):
    """user hH's pass: an empty heartbeat_rank0.jsonl beside a 40-step training.csv, world_size 1,
    got 'OK' (exit 0) from check-artifacts, which named a rank without records only where another
    rank had written some; `nsa-validate run` of such a trainer is NO-GO (its idle finding). Both
    now refuse it."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("ddp", fault="idle:rank=0:silent=1")])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"), "--no-plots"]) == 1
    [out_dir] = (tmp_path / "r" / "runs").glob("fake/cpu/ddp/default/*/")
    assert (out_dir / "heartbeat_rank0.jsonl").read_text() == ""
    assert "rank 0 of 1 wrote no heartbeat (heartbeat_rank0.jsonl has no record)" in (
        tmp_path / "r" / "reports" / "fake__cpu.md").read_text()
    capsys.readouterr()
    assert main(["check-artifacts", str(out_dir)]) == 1
    out = capsys.readouterr().out
    assert "missing              heartbeat_rank0.jsonl: no record written (env.json says world_size 1)" in out, out
    assert "NOT OK" in out


def test_check_artifacts_says_what_a_heartbeat_field_held_that_is_no_number(tmp_path, capsys):
    """A trainer wrote its step as a string ("step": "1"): the check said 'record 1 has no numeric
    'step' (keys: step, time)', listing a key it said was not there, not what it held."""
    (tmp_path / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,"
                                           "mem_reserved_gb\n1,5.5,0.001,100,0.1,1,0.1,0.2\n")
    (tmp_path / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n{"step": "2", "stage": "data"}\n')
    (tmp_path / "env.json").write_text('{"world_size": 1}')
    assert main(["check-artifacts", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ("malformed            heartbeat_rank0.jsonl: record 2 has no numeric 'time', 'step' (no 'time'; 'step' "
            "is '2', a str) (keys: stage, step)") in out, out


def test_a_run_under_nohup_survives_sighup(tmp_path):
    """The harness's own SIGHUP handler replaced nohup's SIG_IGN: a closed terminal stopped it."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(steps=60, env={"NSA_FAKE_STEP_S": "0.05"})])
    proc = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--results-dir",
                             str(tmp_path / "res"), "--no-plots"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # as nohup does
    deadline = time.monotonic() + 60
    while not list((tmp_path / "res").glob("runs/*/*/*/*/*/training.csv")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]


def _sigint_ignored() -> None:
    """A child's SIGINT as a non-interactive shell leaves a job it starts with `&` (``preexec_fn``):
    ignored, and inherited across exec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("door", ["cli", "pytest"])
def test_a_run_that_inherited_sigint_ignored_keeps_ignoring_it_and_stops_on_sigterm(tmp_path, door):
    """A run started with `&` by a script: the CLI put its own SIGINT handler in place of the ignored
    one and stopped (130), where the pytest door kept it ignored and ran on. Both keep it ignored,
    as Python does; SIGTERM still stops either."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(steps=200, env={"NSA_FAKE_STEP_S": "0.05"})])
    res = tmp_path / "res"
    argv = {"cli": ["-m", "validation", "run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"],
            "pytest": ["-m", "pytest", "-p", "no:cacheprovider", "-q", "validation/tests/test_acceptance.py",
                       "--runbook", str(rb), f"--results-dir={res}", "-k", "test_phase"]}[door]
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_sigint_ignored)
    deadline = time.monotonic() + 60
    while not any(len(c.read_bytes().splitlines()) >= 3 for c in res.glob("runs/*/*/*/*/*/training.csv")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()  # 200 steps of 0.05 s: still training
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == {"cli": 128 + signal.SIGTERM, "pytest": pytest.ExitCode.INTERRUPTED}[door], err[-2000:]
    assert "nsa-validate: interrupted (SIGTERM)" in out + err and "(SIGINT)" not in out + err, (out + err)[-2000:]


def _run_training(tmp_path, stdout=subprocess.PIPE) -> subprocess.Popen:
    """`nsa-validate run` of one 200-step point (0.05 s a step), once its training.csv holds steps."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(steps=200, env={"NSA_FAKE_STEP_S": "0.05"})])
    proc = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--results-dir",
                             str(tmp_path / "res"), "--no-plots"], cwd=REPO_ROOT, stdout=stdout,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while not any(len(c.read_bytes().splitlines()) >= 3 for c in (tmp_path / "res").glob("runs/*/*/*/*/*/training.csv")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("delay_s", [0.05, 0.2])
def test_the_first_stop_signal_decides_the_exit_status(tmp_path, delay_s):
    """user hH's pass: SIGHUP, then SIGINT 0.2 s later, exited 130 and said 'interrupted (SIGINT)':
    the second signal, which came while the first's stop was under way, overrode the first's. (Two
    signals sent at once have no first: the kernel may hand them to two threads, and the main
    thread handle the second one's first.)"""
    proc = _run_training(tmp_path)
    proc.send_signal(signal.SIGHUP)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGHUP, err[-2000:]
    assert "nsa-validate: interrupted (SIGHUP)" in err and "(SIGINT)" not in err, err[-2000:]


def test_a_stop_signal_after_the_stop_is_over_does_not_change_the_exit_status(tmp_path):
    """CI: SIGHUP, then SIGINT 0.2 s later, exited -2 (killed by SIGINT) after saying 'interrupted
    (SIGHUP)': the stop was over, its handlers restored, and the second signal ended the process as
    its own. Here the SIGINT follows the stop's last line."""
    proc = _run_training(tmp_path, stdout=subprocess.DEVNULL)
    proc.send_signal(signal.SIGHUP)
    said = ""
    while "interrupted (SIGHUP)" not in said:
        line = proc.stderr.readline()
        assert line, said
        said += line
    proc.send_signal(signal.SIGINT)
    said += proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGHUP, said[-2000:]


def test_run_of_one_phase_checks_every_phase_of_the_runbook(tmp_path, capsys):
    """A threshold typo in another phase passed `run --phase` (pytest and `phases` refused it)."""
    typo = train_phase("long_run", gates=[{"metric": "toks_per_s_mean", "op": ">=",
                                           "threshold": {"profile": "min_tok_per_s"}}])
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), typo])
    assert main(["run", "--runbook", str(rb), "--phase", "baseline_ddp", "--results-dir", str(tmp_path / "r")]) == 2
    assert "uses threshold 'min_tok_per_s', which profile" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_runbook_given_as_a_marker_says_how_to_run_it():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m",
                           "cpu_smoke and not long_run", "validation/tests/test_acceptance.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # pytest's usage error
    assert "-m cpu_smoke: cpu_smoke is a runbook, not a marker; run it with --runbook cpu_smoke" in proc.stderr


def test_check_artifacts_names_a_step_that_is_no_step(tmp_path, capsys):
    """A `nan` in the step column crashed check-artifacts (and `run`) with pandas' IntCastingNaNError
    instead of naming the row."""
    (tmp_path / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                           "1,5.5,0.001,100,0.1,1,0.1,0.2\nnan,5.4,0.001,100,0.1,1,0.1,0.2\n")
    (tmp_path / "heartbeat_rank0.jsonl").write_text('{"time": 1.0, "step": 1}\n')
    (tmp_path / "env.json").write_text('{"world_size": 1}')
    assert main(["check-artifacts", str(tmp_path)]) == 1
    assert "training.csv: line 3, column step: 'nan' is not a step (an integer from 1)" in capsys.readouterr().out


def test_a_results_dir_that_cannot_be_written_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """A results directory on a read-only file system ran the session into an OSError traceback
    (exit 1, which reads as NO-GO) as its first point made its directory."""
    import errno
    import os

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    ro = tmp_path / "ro"
    ro.mkdir()
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(real):  # what a read-only mount does, for root too (chmod does not stop root)
        def call(path, *args, **kwargs):
            if Path(path).is_relative_to(ro):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "open", refuse(real_open))
    monkeypatch.setattr(os, "mkdir", refuse(real_mkdir))
    for results in (ro, ro / "new"):
        assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == 2
        assert f"results directory {results}: cannot write in {ro} (Read-only file system)" in capsys.readouterr().err


def test_the_advice_re_runs_the_failed_phases_of_the_reports_own_runbook(tmp_path):
    """Recommendations said 're-run only that phase: `pytest -m bucket_sweep` with the same
    --profile and --results-dir': without --runbook that re-ran cpu_smoke's bucket_sweep (the
    default runbook's phase of that name) into this store, never the failed point of a runbook
    given by path; and advice shared by two phases named only the first's command. Run as printed
    (collection only), it now selects exactly the failed phases' points of this report's runbook."""
    path = write_runbook(tmp_path / "rb.yaml", [train_phase("bucket_sweep", fault="crash:step=2"),
                                                train_phase("long_run", fault="crash:step=2"), train_phase("single")])
    assert main(["run", "--runbook", str(path), "--results-dir", str(tmp_path / "res")]) == 1
    advice = (tmp_path / "res" / "reports" / "fake__cpu.md").read_text().split("## Recommendations")[1]
    [crash] = [line for line in advice.splitlines() if "Read the traceback" in line]
    assert crash.startswith("1. bucket_sweep, long_run: ")
    command = crash.split("re-run only that phase: `")[1].split("`")[0]
    assert f"--runbook {path} --profile cpu --results-dir={tmp_path / 'res'}" in command
    out = subprocess.run([*shlex.split(command.replace("pytest", f"{sys.executable} -m pytest", 1)), "--collect-only",
                          "-q", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    collected = sorted(line for line in out.stdout.splitlines() if "::test_phase[" in line)
    assert collected == ["validation/tests/test_acceptance.py::test_phase[fake/cpu/bucket_sweep/default]",
                         "validation/tests/test_acceptance.py::test_phase[fake/cpu/long_run/default]"], out.stdout


@pytest.mark.parametrize("args", [["run", "--results-dir", ""], ["run", "--runbook", ""], ["report", "--profile="],
                                  ["report", "--baseline", " "], ["check-artifacts", ""]])
def test_an_empty_path_or_name_is_refused(args, capsys, tmp_path, monkeypatch):
    """An unset shell variable ('--results-dir $R'): `run --results-dir ""` wrote results.json,
    reports/ and runs/ into the working directory, and `--runbook ""` ran every runbook."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert "an empty " in capsys.readouterr().err and not any(tmp_path.iterdir())
