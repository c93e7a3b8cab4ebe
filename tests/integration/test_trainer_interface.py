"""A runbook's own trainer (``trainer:``), judged through the artifact contract.

Two test trainers outside the nsa package, with no model (tests/trainers): one that behaves like
the seed system's train_showcase.py (CONFIG env, headerless CSV every N steps, ``ts`` heartbeats,
text .HALT, epoch-named stack dumps, unknown flags ignored) through the ``seed`` adapter, and one
that writes the contract natively. The harness runs them under python and torchrun (2 ranks):
GO where they train, the right NO-GO finding where they stall, crash or stop on NaN, SKIP and
UNMEASURED where they lack a feature.
"""
from __future__ import annotations

import io
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from tests.faults import _util as U
from validation import REPO_ROOT
from validation.cli import _parser
from validation.judge import check_command as check_artifacts
from validation.contract.files import window_rows
from validation.launch import commands
from validation.errors import RunbookError
from validation.judge.findings import find
from validation.judge.record import Status
from validation.runbook.plan import unprovided_metrics
from validation.report.build import build_context, status_of
from validation.report.tables import process_line
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, NotLaunchable, SessionOptions

STEPS = 40
SEEDLIKE: dict[str, Any] = {
    "name": "seedlike", "root": "tests/trainers", "script": "seedlike_train.py",
    "args": ["--dataset", "synthetic", "--flag-it-does-not-know", "1"],
    "config": {"template": "configs/seedlike.yaml", "pass_as": {"env": "CONFIG"}},
    "steps": {"flag": "--steps"}, "out_dir": {"config": "train.out_dir"},
    "params": {"train.log_every": {"config": "train.log_every"}, "train.seq_len": {"config": "train.seq_len"}},
    "env": {"NSA_HEARTBEAT_EVERY": 1}, "format": "seed", "phases": ["train"]}
NATIVE: dict[str, Any] = {
    "name": "native_test", "root": "tests/trainers", "script": "native_train.py",
    "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "params": {"optim.lr": {"flag": "--lr"}}}
GATES = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, "window": "last 20 steps"},
         {"metric": "loss_finite", "op": "==", "threshold": 1},
         {"metric": "steps_completed", "op": ">=", "threshold": STEPS},
         {"metric": "idle_ranks", "op": "==", "threshold": 0}]


def _runbook(tmp_path: Path, trainer: dict[str, Any], phases: list[dict[str, Any]], name: str = "trainer_iface") -> Path:
    data = {"name": name, "profiles": ["cpu"], "trainer": trainer,
            "defaults": {"steps": STEPS, "timeout_s": 60, "env": {"OMP_NUM_THREADS": 1}}, "phases": phases}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _train(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "train", "overrides": {"train.log_every": 10, "train.seq_len": 64},
            "gates": GATES, **extra}


def _run_all(runbook: Path, results: Path, only: set[str] | None = None) -> dict[str, Any]:
    """Every point (or those named), several at once (they mostly sleep: the test trainers have no model)."""
    points = [p for p in expand(load_runbook(runbook), load_profile("cpu")) if only is None or p.phase.name in only]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip((p.phase.name for p in points), pool.map(AcceptanceSession(SessionOptions(results)).run_point, points)))


#: the seed-like trainer's faults (TEST_TRAINER_FAULT, tests/trainers/trainer_faults.py) by point.
#: This harness refuses that variable in a runbook (its allow-list of environment names), so it
#: is set in the harness's own environment, which the trainers it launches inherit.
SEEDLIKE_FAULTS = {"stall": "hang_rank:0@5", "ddp_stall": "hang_rank:0@5", "crash": "crash@5", "nan": "nan@15"}


@pytest.fixture(scope="module")
def seedlike_results(tmp_path_factory) -> tuple[Path, Path, dict[str, Any]]:
    """Every outcome of the seed-like trainer, one point each, into one store."""
    tmp = tmp_path_factory.mktemp("seedlike")
    rb = _runbook(tmp, SEEDLIKE, [
        _train("good"),
        _train("ddp", launcher={"kind": "torchrun", "nproc": 2}),
        _train("stall", timeout_s=30, stall_s=3),
        _train("ddp_stall", timeout_s=30, stall_s=6, launcher={"kind": "torchrun", "nproc": 2}),
        _train("crash"),
        _train("nan"),
        _train("memory", gates=[*GATES, {"metric": "mem_reserved_gb_max", "op": "<=", "threshold": 10}]),
        {"name": "profiled", "kind": "profile", "profile_steps": 2},
    ])
    results = tmp / "results"
    recs = _run_all(rb, results, only={"good", "ddp", "memory", "profiled"})
    for fault in sorted(set(SEEDLIKE_FAULTS.values())):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TEST_TRAINER_FAULT", fault)
            recs.update(_run_all(rb, results, only={n for n, f in SEEDLIKE_FAULTS.items() if f == fault}))
    return rb, results, recs


def test_seedlike_trainer_trains_to_GO_under_python_and_torchrun(seedlike_results):
    _, results, recs = seedlike_results
    for name in ("good", "ddp"):
        r = recs[name]
        assert r.status == Status.PASS, (name, r.reason, r.evidence.errors, r.evidence.stderr_tail)
        assert r.trainer == "seedlike" and r.world_size == (2 if name == "ddp" else 1)
        # the harness's own commit is recorded; the trainer's root (tests/trainers) is not a
        # repository's top level, so git names no commit for it, and it stamps none
        assert r.git_sha and r.trainer_sha is None
    out = results / recs["ddp"].out_dir
    assert json.loads((out / "env.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in out.glob("heartbeat_rank*.jsonl")) == ["heartbeat_rank0.jsonl", "heartbeat_rank1.jsonl"]
    # the headerless CSV of rows every 10 steps becomes the contract's, and "last 20 steps" is
    # 2 rows (steps 30 and 40), not the last 20 rows
    csv = pd.read_csv(out / "training.csv")
    assert list(csv["step"]) == [1, 10, 20, 30, 40]
    gate = next(g for g in recs["good"].gates if g.metric == "toks_per_s_mean")
    assert gate.window == "last 20 steps" and gate.verdict == "PASS"


def test_seedlike_stall_crash_and_nan_are_NO_GO_with_the_right_finding(seedlike_results):
    _, _, recs = seedlike_results
    for name in ("stall", "ddp_stall"):  # the harness's stall watch stops them, long before the timeout
        assert recs[name].status == Status.FAIL and recs[name].stalled_s is not None, (name, recs[name].reason)
    assert recs["crash"].status == Status.FAIL and recs["crash"].exit_code == 1
    assert recs["nan"].status == Status.FAIL
    assert recs["nan"].reason == "non-finite loss at step 15 (halt: nan_loss) (trainer .HALT)", recs["nan"].reason
    findings = {f.phase: f for f in find([recs[n] for n in ("stall", "ddp_stall", "crash", "nan")])}
    for name in ("stall", "ddp_stall"):  # under torchrun too: the harness's own stacks name each rank
        assert findings[name].kind == "stall" and "rank 0 in hang_forever" in findings[name].title, findings[name]
    assert findings["crash"].kind == "crash" and "RuntimeError: injected crash at step 5" in findings["crash"].title
    assert findings["nan"].kind == "nonfinite" and findings["nan"].title.endswith(
        "at step 15: the trainer's .HALT says 'halt: nan_loss'"), findings["nan"].title


def test_seedlike_ddp_stall_names_the_hung_rank(seedlike_results):
    """Issue 24, case 2: the seed adapter numbered stack dumps by time, so the waiting rank's dump
    was called rank 0's; the harness's own stacks are mapped to ranks by each process's RANK."""
    _, _, recs = seedlike_results
    (finding,) = find([recs["ddp_stall"]])
    assert finding.kind == "stall" and "rank 1: last heartbeat step 5" in " ".join(finding.detail), finding.detail
    assert "rank 0 in hang_forever" in finding.title, finding.title  # rank 1 waits in wait_for_peers


def test_seedlike_lacking_a_feature_is_SKIP_or_UNMEASURED_never_GO(seedlike_results):
    rb_path, results, recs = seedlike_results
    assert recs["profiled"].status == Status.SKIP
    assert "trainer seedlike does not support profile phases" in recs["profiled"].reason
    mem = recs["memory"]
    assert mem.status == Status.UNMEASURED, mem.reason
    assert "mem_reserved_gb_max (trainer seedlike's files lack mem_reserved_gb)" in mem.reason
    assert next(g for g in mem.gates if g.metric == "mem_reserved_gb_max").verdict == "UNMEASURED"
    pending = [recs["memory"], recs["profiled"]]
    verdict, why = status_of(pending, [], find(pending))
    assert verdict == "INCOMPLETE" and "mem_reserved_gb_max (trainer seedlike's files lack mem_reserved_gb)" in why, why
    rb = load_runbook(rb_path)
    ctx = build_context(results, rb.name, "cpu", runbook=rb, profile=load_profile("cpu"))
    assert ctx["verdict"] == "NO-GO" and ctx["trainer"] == "seedlike"


def test_a_trainer_writing_the_contract_needs_no_adapter_and_an_unset_root_cannot_launch(tmp_path, monkeypatch):
    rb = _runbook(tmp_path, NATIVE, [
        {"name": "single", "kind": "train", "overrides": {"optim.lr": 0.001},
         "gates": [*GATES, {"metric": "mem_reserved_gb_max", "op": "<=", "threshold": 10}]},
        {"name": "ddp", "kind": "train", "launcher": {"kind": "torchrun", "nproc": 2}, "steps": 20, "gates": GATES[:2]},
    ], name="native_iface")
    results = tmp_path / "results"
    recs = _run_all(rb, results)
    assert {n: r.status for n, r in recs.items()} == {"single": Status.PASS, "ddp": Status.PASS}, \
        {n: (r.reason, r.evidence.stderr_tail) for n, r in recs.items()}
    assert "--lr" in recs["single"].command and "0.001" in recs["single"].command
    loaded = load_runbook(rb)
    ctx = build_context(results, loaded.name, "cpu", runbook=loaded, profile=load_profile("cpu"))
    assert ctx["verdict"] == "GO", ctx["status_reason"]
    # a root named by an environment variable that is not set: nothing runs or is stored, and the
    # error says what to set
    monkeypatch.delenv("NSA_TEST_TRAINER_ROOT", raising=False)
    unset = _runbook(tmp_path, {**NATIVE, "root": {"env": "NSA_TEST_TRAINER_ROOT"}}, [{"name": "single", "kind": "train"}],
                     name="unset_root")
    with pytest.raises(NotLaunchable, match="export NSA_TEST_TRAINER_ROOT="):
        _run_all(unset, tmp_path / "r2")
    assert not (tmp_path / "r2" / "results.json").exists()


# ------------------------------------------------------------------------- check-artifacts
def _check(directory: Path, adapter: str = "native") -> tuple[int, str]:
    out = io.StringIO()
    return check_artifacts.check(directory, adapter, out=out), out.getvalue()


def test_check_artifacts_good_missing_and_malformed(seedlike_results, tmp_path):
    _, results, recs = seedlike_results
    good = results / recs["good"].out_dir
    rc, text = _check(good)
    assert rc == 0 and "OK" in text and "present              training.csv: 5 rows, steps 1..40" in text, text
    # the trainer's own directory, read through the adapter, holds to the contract too
    rc, text = _check(good / "trainer_out", "seed")
    assert rc == 0 and "through adapter seed" in text, text
    # ... but not without it: headerless CSV, 'ts' instead of 'time', no world_size
    rc, text = _check(good / "trainer_out")
    assert rc == 1 and "malformed            training.csv: header is 1,5.5" in text, text
    assert "no numeric 'time'" in text and "missing              env.json world_size" in text, text
    for name in ("training.csv", "heartbeat_rank0.jsonl", "env.json"):
        broken = tmp_path / f"without_{name}"
        shutil.copytree(good, broken, ignore=shutil.ignore_patterns("trainer_out"))
        (broken / name).unlink()
        rc, text = _check(broken)
        missing = "heartbeat_rank{R}.jsonl" if name.startswith("heartbeat") else name
        assert rc == 1 and f"missing              {missing}: not written" in text, text
    bad_rows = tmp_path / "bad_rows"
    shutil.copytree(good, bad_rows, ignore=shutil.ignore_patterns("trainer_out"))
    with open(bad_rows / "training.csv", "a") as f:
        f.write("50,abc,0.1,100,nan,nan,nan,nan\n")
    rc, text = _check(bad_rows)
    assert rc == 1 and "line 7 (step 50), column loss: 'abc' is not a number" in text, text


def test_check_artifacts_cli_exit_codes(seedlike_results, tmp_path):
    _, results, recs = seedlike_results
    good = results / recs["good"].out_dir
    ok = U.harness("check-artifacts", str(good / "trainer_out"), "--adapter=seed", timeout=60)
    assert ok.rc == 0 and "OK" in ok.stdout, ok.stdout + ok.stderr
    assert U.harness("check-artifacts", str(tmp_path / "nope"), timeout=60).rc == 2
    assert _check(tmp_path)[0] == 1  # an empty directory
    with pytest.raises(SystemExit) as usage:
        _parser().parse_args(["check-artifacts", str(tmp_path), "--adapter", "nope"])
    assert usage.value.code == 2


# --------------------------------------------------------------------- units and bad input
def test_windows_count_steps_not_rows():
    df = pd.DataFrame({"step": list(range(20, 201, 20)), "toks_per_s": [1.0] * 10})
    assert list(window_rows(df, 50)["step"]) == [160, 180, 200]
    every_step = pd.DataFrame({"step": list(range(1, 101))})
    assert len(window_rows(every_step, 50)) == 50 and len(window_rows(every_step, None)) == 100


def test_seed_csv_appended_across_runs_keeps_the_last_run(tmp_path):
    from validation.contract.adapters import ADAPTERS, RunFacts
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    (raw / "training.csv").write_text("1,5.0,1e-4,100\n20,4.0,1e-4,110\n1,5.1,1e-4,90\n20,3.9,1e-4,95\n")
    ADAPTERS["seed"].convert(raw, out, RunFacts(1, "t"))
    df = pd.read_csv(out / "training.csv")
    assert list(df["step"]) == [1, 20] and list(df["loss"]) == [5.1, 3.9]
    assert df["mem_reserved_gb"].isna().all()


@pytest.mark.parametrize("change, key", [
    ({"script": "../outside.py"}, "trainer.script"),
    ({"root": "/etc"}, "trainer.root"),
    ({"args": ["--x", "{steps.__class__}"]}, "trainer.args[1]"),
    ({"args": ["--x", "a b"]}, "trainer.args[1]"),
    ({"format": "nope"}, "trainer.format"),
    ({"phases": ["pytest"]}, "trainer.phases[0]"),
    ({"steps": {"config": "train.steps"}, "config": None}, "trainer.steps.config"),
    ({"env": {"LD_PRELOAD": "x"}}, "trainer.env.LD_PRELOAD"),
    ({"env": {"PYTHONSTARTUP": "x"}}, "trainer.env.PYTHONSTARTUP"),
    ({"env": {"VALIDATION_RUN_TOKENS": "x"}}, "trainer.env.VALIDATION_RUN_TOKENS"),
    ({"steps": {"env": "PATH"}}, "trainer.steps.env"),
    ({"env": {"lower_case": "x"}}, "trainer.env.lower_case"),
    ({"config": {"template": "../../etc/passwd", "pass_as": {"env": "CONFIG"}}}, "trainer.config.template"),
    ({"module": "x.y"}, "trainer"),
    ({"args": ["--cfg", "{config}"], "config": None, "out_dir": {"flag": "--out"}}, "trainer.args"),
])
def test_bad_trainer_entries_are_refused_naming_the_key(tmp_path, change, key):
    trainer = {k: v for k, v in {**SEEDLIKE, **change}.items() if v is not None}
    with pytest.raises(RunbookError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_runbook(_runbook(tmp_path, trainer, [_train("good")]))


def test_a_trainer_reads_variables_of_its_own_naming(tmp_path):
    """A user's trainer that takes its steps from MY_TRAINER_STEPS was refused: the variables a
    runbook may set for toggles (NSA_*, CONFIG...) were asked of the trainer's own interface too."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "minimal_train.py",
               "steps": {"env": "MINIMAL_STEPS"}, "out_dir": {"env": "MINIMAL_OUT_DIR"}, "env": {"MINIMAL_LOG_EVERY": 2}}
    rb = load_runbook(_runbook(tmp_path, trainer, [{"name": "good", "kind": "train", "gates": GATES}]))
    assert rb.trainer.steps.name == "MINIMAL_STEPS" and rb.trainer.env == {"MINIMAL_LOG_EVERY": "2"}


def test_an_override_the_trainer_does_not_take_is_refused(tmp_path):
    phase = {**_train("good"), "overrides": {"dist.mode": "ddp"}}
    with pytest.raises(RunbookError, match=r"trainer seedlike takes no parameter 'dist.mode'"):
        load_runbook(_runbook(tmp_path, SEEDLIKE, [phase]))
    own_module = {**_train("good"), "launcher": {"kind": "python", "module": "nsa.train"}, "config": "m7c_125m"}
    with pytest.raises(RunbookError, match=r"phases\[0\]: launcher.module and config name this project's trainer"):
        load_runbook(_runbook(tmp_path, SEEDLIKE, [own_module]))


def test_the_runbooks_trainer_yaml_loads():
    rb = load_runbook("seed_trainer_cpu")
    assert rb.trainer is not None and rb.trainer.adapter == "seed" and rb.trainer.root.env == "NSA_SEED_ROOT"


def test_metrics_a_trainer_does_not_list_or_its_files_lack_are_unmeasurable(tmp_path):
    listed = _runbook(tmp_path, {**NATIVE, "metrics": ["loss_finite", "steps_completed"]}, [{"name": "single", "kind": "train", "gates": GATES}],
                      name="listed")
    (point,) = expand(load_runbook(listed), load_profile("cpu"))
    lacking = unprovided_metrics(point)
    assert lacking["toks_per_s_mean"] == "trainer native_test does not list it among its metrics"
    assert "loss_finite" not in lacking and "steps_completed" not in lacking
    (seed_point,) = expand(load_runbook(_runbook(tmp_path, SEEDLIKE, [_train("good")], name="seed")), load_profile("cpu"))
    assert unprovided_metrics(seed_point)["step_time_s_mean"] == "trainer seedlike's files lack step_time_s"
    assert "toks_per_s_mean" not in unprovided_metrics(seed_point)


#: a trainer of another project whose own top-level package is named ``nsa``, in a src layout that
#: its script appends to sys.path (so PYTHONPATH entries come before it)
_SRC_NSA_TRAINER = {
    "src/nsa/__init__.py": "OWNER = 'foreign'\n",
    "src/nsa/loop.py": '''import json, os, time
def train(steps, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump({"world_size": 1, "git_sha": "0123abc"}, f)
    with open(os.path.join(out, "training.csv"), "w") as csv, open(os.path.join(out, "heartbeat_rank0.jsonl"), "w") as hb:
        csv.write("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\\n")
        for step in range(1, steps + 1):
            csv.write(f"{step},{5 - 0.1 * step},0.001,100,0.01,1,0.1,0.1\\n")
            hb.write(json.dumps({"time": time.time(), "step": step, "stage": "step", "pid": os.getpid()}) + "\\n")
''',
    "train.py": '''import pathlib, sys
sys.path.append(str(pathlib.Path(__file__).parent / "src"))
import nsa
if getattr(nsa, "OWNER", None) != "foreign":
    sys.exit(f"imported another project's nsa: {nsa.__file__}")
from nsa.loop import train
train(int(sys.argv[1]), sys.argv[2])
'''}


def test_a_trainer_whose_package_is_named_nsa_imports_its_own(tmp_path, monkeypatch):
    """The harness run as ``PYTHONPATH=<this checkout> python -m validation`` passed that entry on
    to another project's trainer, whose own ``nsa`` it then shadowed: 'No module named nsa.loop',
    a NO-GO of the wrong code. Other inherited entries still reach the trainer, and the record
    names them: its Reproduce line set PYTHONPATH to the trainer's root alone, so a trainer whose
    packages came from such an entry (a folder of wheels installed with --target) did not start
    when run by hand."""
    root = tmp_path / "other_project"
    for rel, text in _SRC_NSA_TRAINER.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setenv("OTHER_TRAINER_ROOT", str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), str(tmp_path / "site")]))
    trainer = {"name": "other", "root": {"env": "OTHER_TRAINER_ROOT"}, "script": "train.py",
               "args": ["{steps}", "{out_dir}"]}
    rb = _runbook(tmp_path, trainer, [{"name": "single", "kind": "train", "gates": GATES[1:3]}],
                  name="other_nsa")
    rec = _run_all(rb, tmp_path / "results")["single"]
    assert rec.status == Status.PASS, (rec.reason, rec.evidence.stderr_tail)
    assert commands.child_env({}, root=root)["PYTHONPATH"].split(os.pathsep) == [str(root), str(tmp_path / "site")]
    assert rec.env["PYTHONPATH"].split(os.pathsep) == [str(root), str(tmp_path / "site")], rec.env
    assert f"PYTHONPATH={root}{os.pathsep}{tmp_path / 'site'} " in process_line(rec, fresh=True)
    assert commands.child_env({})["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO_ROOT), str(REPO_ROOT)]
