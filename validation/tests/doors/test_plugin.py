"""The pytest plugin: runbook points become marked, parametrized tests; marker and -k selection
work; records land in the store and the report is rendered at session end; a bad runbook is a
usage error naming the key; hardware checks skip or run as the profile and option say."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from validation import DEFAULT_RESULTS_DIR, REPO_ROOT
from validation.machine import Machine
from validation.pytest_plugin import is_acceptance_run, results_dir_for, selects_only_points
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.point import why_skip
from validation.store.results import ResultStore
from validation.tests.conftest import (default_sigint, interrupt_when_training, slow_second_point, train_phase,
                                      write_runbook)


def _pytest(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _runbook(tmp_path):
    return write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp"),
                                               train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [25, 50]})])


def test_marker_selects_one_phase_and_ids_name_the_point(tmp_path):
    out = _pytest("validation/tests/test_acceptance.py", "--collect-only", "--runbook", str(_runbook(tmp_path)),
                  "-m", "bucket_sweep")
    assert "test_phase[fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=25]" in out.stdout
    assert "test_phase[fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=50]" in out.stdout
    assert "baseline_ddp" not in out.stdout


def test_run_stores_records_and_renders_report(tmp_path):
    res = tmp_path / "res"
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(_runbook(tmp_path)), "--results-dir", str(res),
                  "-k", "bucket_sweep or test_report")
    # every test passed, but the report is INCOMPLETE (baseline_ddp not run): an acceptance run exits 1
    assert out.returncode == 1, out.stdout + out.stderr
    assert "3 passed" in out.stdout  # two sweep points + the cross-point report check
    assert {r.key.phase for r in ResultStore(res).records()} == {"bucket_sweep"}
    assert f"nsa-validate report: INCOMPLETE -> {res}/reports/fake__cpu.md" in out.stdout
    # said before the seconds of rendering, as the CLI says it
    assert out.stdout.index("nsa-validate: writing the report ...") < out.stdout.index("nsa-validate report: INCOMPLETE")
    assert "\nnsa-validate: writing the report ..." in out.stdout  # on a line of its own, not after '[100%]'
    assert "nsa-validate report: exit status 1: this acceptance run is not GO: the report is INCOMPLETE" in out.stdout
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert "**Status: INCOMPLETE**" in text and "`fake/cpu/baseline_ddp/default`" in text  # not run this time


def test_failing_point_fails_its_test_with_the_reason(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", fault="crash:step=2")])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"))
    assert out.returncode == 1
    # the verdict line names the rank first (validation/judge/findings/headline.py), then how the process ended
    assert "FAIL: rank 0 crashed (last heartbeat step 1, stage optimizer): RuntimeError" in out.stdout, out.stdout
    assert "— trainer crashed (exit code 1)" in out.stdout


def test_a_point_that_passed_its_gates_with_a_critical_finding_fails_its_test_as_the_cli_says_no_go(tmp_path):
    """A rank did no work, in a phase that gates only tokens/s: `nsa-validate run` said NO-GO (exit
    1) for its critical finding, while `pytest -m <phase>` passed the point's test and exited 0: the
    two doors disagreed on the same run. A trainer that logged a NaN loss and went on is no such
    pass: its point is a FAIL, as its record and the report's counts say."""
    toks = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": {"profile": "min_toks_per_s"}, "window": "last 5 steps"}]
    rb = write_runbook(tmp_path / "rb.yaml", [
        train_phase("long_run", fault="idle:rank=1", gates=toks, env={"NSA_FAKE_WORLD": "2"}),
        train_phase("nan_run", fault="nan_logged:step=3", gates=toks)])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"),
                  "-m", "long_run or nan_run")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "PASS by its gates, but critical: idle rank in long_run [default]: 1 of 2 rank(s) did no work" in out.stdout, \
        out.stdout
    assert "FAIL: non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT)" in out.stdout, out.stdout
    assert "nsa-validate report: NO-GO" in out.stdout, out.stdout


def test_bad_runbook_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprofiles: [cpu]\nphases:\n  - {name: p, kind: train, gates: [{metric: x, op: '>=', threshold: 1}]}\n")
    out = _pytest("validation/tests/test_acceptance.py", "--collect-only", "--runbook", str(bad))
    assert out.returncode != 0
    assert "bad.yaml: phases[0].gates[0].metric: unknown metric 'x'" in out.stdout + out.stderr


@pytest.mark.parametrize("runbook", ["missing", "bad"])
def test_a_run_refused_for_its_runbook_leaves_no_results_directory_behind(tmp_path, runbook):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprofiles: [cpu]\nphases:\n  - {name: p, kind: train, stall_sec: 1}\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "p", "--runbook",
                          str(bad if runbook == "bad" else tmp_path / "missing.yaml"), "--results-dir",
                          str(tmp_path / "results")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(temp)})
    assert out.returncode == 4, out.stdout + out.stderr
    assert list(temp.iterdir()) == []


def test_gpu_profiles_skip_on_cpu_with_a_reason():
    """Each point skips with its reason; the run exits 1, not 0: a CI job gated on `pytest -m a100`
    on a box whose GPUs went missing passed with nothing run."""
    out = _pytest("validation/tests/test_acceptance.py", "-m", "a100 and preflight", "-rs")
    assert out.returncode == 1 and "1 skipped" in out.stdout, out.stdout[-2000:]
    assert "needs a CUDA GPU" in out.stdout
    assert "exit status 1: this acceptance run is not GO: no phase point ran (each one was skipped" in out.stdout


def test_an_acceptance_run_of_a_go_report_exits_0_and_a_plain_run_keeps_pytests_status(tmp_path):
    """An acceptance run of a GO report exits 0 (a plain test run, no profile or phase marker and no
    --runbook, keeps pytest's status on an INCOMPLETE report:
    test_a_plain_run_of_the_acceptance_tests_leaves_results_alone)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"))
    assert out.returncode == 0 and "nsa-validate report: GO -> " in out.stdout, out.stdout[-2000:]
    assert "exit status 1" not in out.stdout


H100_BOX = Machine(gpu_names=("NVIDIA H100 80GB HBM3",) * 2, gpu_mem_gb=(79.1, 79.1))


def test_h100_box_runs_a100_profile_unless_mismatch_is_skip():
    base = expand(load_runbook("nsa_ddp_a100"), load_profile("a100"), ["baseline_ddp"])[0]
    assert why_skip(base, H100_BOX, "run") is None
    assert "is for A100 GPUs; this machine has NVIDIA H100" in why_skip(base, H100_BOX, "skip")
    one_gpu = Machine(gpu_names=H100_BOX.gpu_names[:1], gpu_mem_gb=(79.1,))
    assert "needs 2 CUDA GPU(s); this machine has 1" in why_skip(base, one_gpu, "run")
    h200 = expand(load_runbook("nsa_ddp_a100"), load_profile("h200"), ["baseline_ddp"])[0]
    assert "needs 139.0 GiB per GPU; smallest here is 79.1 GiB" in why_skip(h200, H100_BOX, "run")


def _pytest_in(cwd, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("spelling", ["separate", "equals"])
@pytest.mark.parametrize("where", ["repo", "elsewhere", "elsewhere, no test path"])
def test_rerun_into_an_existing_results_dir_and_runbook_path(tmp_path, spelling, where):
    """The documented re-run, twice into the same directory: once the directory (or a runbook
    path) exists, pytest once took it for a test path, made /tmp the rootdir, never read this
    repository's conftest and failed with 'unrecognized arguments: --results-dir'; later it ran,
    but without this repository's pytest.ini (its markers unknown, --strict-markers off). From
    outside the repository, its path is the test path, or none is given: a user's pass ran
    'pytest -m <phase> --runbook R --profile P' from the runbook's directory, as the docs say
    works from any directory, and pytest collected nothing there."""
    rb, res = _runbook(tmp_path), tmp_path / "res"
    opts = ([f"--results-dir={res}", f"--runbook={rb}"] if spelling == "equals"
            else ["--results-dir", str(res), "--runbook", str(rb)])
    cwd, paths = {"repo": (REPO_ROOT, []), "elsewhere": (tmp_path, [str(REPO_ROOT)]),
                  "elsewhere, no test path": (tmp_path, [])}[where]
    for attempt in (1, 2):
        out = _pytest_in(cwd, *paths, *opts, "-m", "baseline_ddp", "-p", "no:randomly")
        # the point passed; its report is INCOMPLETE (bucket_sweep not run), so the run exits 1
        assert out.returncode == 1 and "this acceptance run is not GO: the report is INCOMPLETE" in out.stdout, \
            f"attempt {attempt}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
        assert "1 passed" in out.stdout and res.is_dir()
        assert "PytestUnknownMarkWarning" not in out.stdout, f"attempt {attempt}: pytest.ini not read"
    assert {r.key.phase for r in ResultStore(res).records()} == {"baseline_ddp"}


def test_results_dir_for_a_plain_test_run_is_not_the_users(tmp_path):
    """The README's test command once replaced every record of the user's ./results."""
    temp, markers = tmp_path / "t", {"cpu_profile", "a100", "bucket_sweep"}

    def where(markexpr, runbooks=None, option=None):
        return results_dir_for(option, is_acceptance_run(markexpr, runbooks, None, markers), temp)

    assert where("") == temp
    assert where("not slow") == temp
    assert where("cpu_profile") == DEFAULT_RESULTS_DIR
    assert where("a100 and not (bucket_sweep)") == DEFAULT_RESULTS_DIR
    assert where("", ["rb.yaml"]) == DEFAULT_RESULTS_DIR
    assert where("", option=str(tmp_path / "x")) == (tmp_path / "x").resolve()


def test_a_marker_of_phases_and_profiles_alone_selects_only_points():
    points, suite = {"cpu_profile", "h200", "sanity", "long_run"}, {"slow", "gpu", "distributed"}
    assert selects_only_points("h200", points, suite)
    assert selects_only_points("cpu_profile and (sanity or long_run)", points, suite)
    assert not selects_only_points("", points, suite)  # the README's test command: the whole suite
    assert not selects_only_points("not h200", points, suite)  # every unit test is not h200
    assert not selects_only_points("h200 or slow", points, suite)  # slow unit tests too
    assert not selects_only_points("sanity", points, {"sanity"})  # a phase named as a suite marker


def test_an_acceptance_run_collects_the_phase_points_alone(tmp_path):
    """`pytest -m baseline_ddp` imported all ~140 test modules of the suite before it ran one
    point (half a minute on a two-core box)."""
    out = _pytest("-m", "baseline_ddp", "--collect-only", "--results-dir", str(tmp_path / "r"))
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids and all(i.startswith("validation/tests/test_acceptance.py::") for i in ids), out.stdout[-2000:]
    assert re.search(r"\d+/\d+ tests collected", out.stdout) and not re.search(r"/1\d{3} tests", out.stdout), \
        out.stdout[-500:]
    # listing runs nothing: no verdict, exit 0 (it said 'this acceptance run is not GO' and exited 1)
    assert out.returncode == 0 and "nsa-validate report" not in out.stdout, out.stdout[-1000:]
    assert not (tmp_path / "r").exists()


def test_a_plain_run_of_the_acceptance_tests_leaves_results_alone(tmp_path):
    before = {p: p.stat().st_mtime_ns for p in DEFAULT_RESULTS_DIR.rglob("*")} if DEFAULT_RESULTS_DIR.exists() else {}
    out = _pytest("validation/tests/test_acceptance.py", "-k", "preflight")
    assert out.returncode == 0, out.stdout[-2000:]
    after = {p: p.stat().st_mtime_ns for p in DEFAULT_RESULTS_DIR.rglob("*")} if DEFAULT_RESULTS_DIR.exists() else {}
    assert after == before
    assert "nsa-validate report: INCOMPLETE -> " in out.stdout and str(DEFAULT_RESULTS_DIR) not in out.stdout


def test_progress_of_a_running_point_is_shown(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp", steps=40, env={"NSA_FAKE_STEP_S": "0.05"})])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"),
                  "--progress-every", "0.5", "-k", "test_phase")
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("nsa-validate: fake/cpu/baseline_ddp/default:")]
    assert len(lines) >= 2, out.stderr[-2000:]
    assert any(re.search(r"step \d+/40, 20\d tok/s \(global\), ETA \d+s", ln) for ln in lines), lines


def test_progress_under_xdist_workers(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("bucket_sweep", steps=40, env={"NSA_FAKE_STEP_S": "0.05"},
                                                          sweep={"env.NSA_DDP_BUCKET_MB": [1, 2]})])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"),
                  "--progress-every", "0.5", "-k", "test_phase", "-n", "2")
    assert out.returncode == 0, out.stdout[-2000:]
    shown = {ln.split(":")[1].strip() for ln in out.stderr.splitlines() if ln.startswith("nsa-validate: fake/")}
    assert shown == {"fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=1", "fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=2"}, \
        out.stderr[-2000:]


def test_unknown_profile_is_a_usage_error_naming_it():
    out = _pytest("validation/tests/test_acceptance.py", "-m", "cpu_profile", "--profile", "a1000")
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error, not 5 (nothing collected)
    assert "a1000" in out.stderr and "no profile 'a1000' under" in out.stderr


def test_profile_no_selected_runbook_uses_is_a_usage_error(tmp_path):
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(_runbook(tmp_path)), "--profile", "a100")
    assert out.returncode == 4
    assert "--profile a100: no selected runbook uses it" in out.stderr


def test_bad_override_key_is_found_when_the_runbook_loads(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp", overrides={"train.seq_lenn": 64})],
                       defaults={"launcher": {"kind": "python", "module": "nsa.train"}})
    out = _pytest("validation/tests/test_acceptance.py", "--collect-only", "--runbook", str(rb))
    assert out.returncode == 4
    assert "rb.yaml: phases[0] (override train.seq_lenn): 'train.seq_lenn' is not a key of the trainer's config; " \
           "did you mean 'train.seq_len'?" in out.stderr


def test_an_override_value_the_trainer_refuses_is_a_usage_error(tmp_path):
    """A sweep value this project's trainer refuses (`train.batch_size: [1, 2x]`) collected and ran
    its point into 'rank 0 crashed' (a test failure blaming the trainer): a usage error (exit 4)
    naming the point and the key, nothing run."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp", sweep={"train.batch_size": [1, "2x"]})],
                       defaults={"launcher": {"kind": "python", "module": "nsa.train"}})
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"))
    assert out.returncode == 4, out.stdout + out.stderr
    assert ("rb.yaml: phases[0] point batch_size=2x (override train.batch_size): the trainer refuses it (nsa.train "
            "--check-config): ") in out.stderr and "expected an integer, got '2x'" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


def test_a_config_file_the_trainer_will_not_find_is_a_usage_error(tmp_path):
    """`config: mycfg.yaml` of no file in the checkout (where the trainer reads it) collected and
    ran every point into 'rank 0 crashed ... config file not found'."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")], defaults={"config": "mycfg.yaml"})
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"))
    assert out.returncode == 4, out.stdout + out.stderr
    assert (f"rb.yaml: defaults.config: config file 'mycfg.yaml' not found: looked for {REPO_ROOT / 'mycfg.yaml'}"
            in out.stderr), out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("params", [{}, {"env.NSA_DDP_BUCKET_MB": 25}])
def test_the_reports_rerun_command_selects_its_point(params):
    """The report's 'Reproduce' line once said -k "NSA_DDP_BUCKET_MB=25", which pytest refuses
    ('=' is no -k expression)."""
    import shlex

    from validation.judge.record import PhaseRecord, PointKey, Status
    from validation.report.tables import reproduce_rows

    phase = "bucket_sweep" if params else "baseline_ddp"
    slug = "NSA_DDP_BUCKET_MB=25" if params else "default"
    test_id = f"nsa_ddp_a100/a100/{phase}/{slug}"
    rec = PhaseRecord(PointKey("nsa_ddp_a100", "a100", phase, params), test_id, "train", Status.PASS, "",
                      command=["python", "-m", "nsa.train"])
    (row,) = reproduce_rows([rec])
    out = _pytest(*shlex.split(row["rerun"])[1:], "--collect-only")
    assert f"test_phase[{test_id}]" in out.stdout and re.search(r"\b1(/\d+)? tests? collected", out.stdout), \
        out.stdout + out.stderr


def test_a_slurm_points_process_line_says_its_allocation_may_be_gone():
    """Pasted after the run, a Slurm point's process line said 'srun: error: Slurm job 3 has
    expired': the harness released the allocation it had asked for. The line now says so."""
    from validation.judge.nodes import NodeEvidence, NodesEvidence
    from validation.judge.record import Evidence, PhaseRecord, PointKey, Status
    from validation.report.tables import reproduce_rows

    nodes = NodesEvidence("slurm", "n1:20003", 60.0, [NodeEvidence(0, "node0.log", host="n1", ranks=[0])], slurm_job_id="3")
    rec = PhaseRecord(PointKey("slurm_cpu", "cpu", "train"), "slurm_cpu/cpu/train/default", "train", Status.PASS, "",
                      command=["srun", "--jobid=3", "python", "-m", "torch.distributed.run"],
                      evidence=Evidence(nodes=nodes))
    (row,) = reproduce_rows([rec])
    assert row["note"].startswith("it ran in Slurm job 3, whose allocation may be gone")
    plain = PhaseRecord(PointKey("rb", "cpu", "train"), "rb/cpu/train/default", "train", Status.PASS, "",
                        command=["python", "-m", "nsa.train"])
    assert reproduce_rows([plain])[0]["note"] is None


def test_an_interrupted_pytest_run_prints_no_status_line_that_reads_as_its_verdict(tmp_path):
    """The pytest door had the CLI's flaw: after Ctrl-C it printed 'nsa-validate report: GO ->
    report' (the records stored before) beside its 'interrupted' line."""
    rb, csvs = slow_second_point(tmp_path)
    results = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                             "validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(results),
                             "-k", "test_phase"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    out, err = interrupt_when_training(proc, lambda: csvs(results))
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    assert not re.search(r"^nsa-validate report: (GO|NO-GO|INCOMPLETE)\b", out, re.M), out[-2000:]
    assert "nsa-validate report: report of the points stored before the interrupt (no verdict of this run) -> " in out
    assert "nsa-validate: writing the report of the points stored before the interrupt ..." in out, out[-2000:]
    assert "nsa-validate: interrupted (SIGINT)" in out, out[-2000:]
    # the report says so too, and where (user hH's pass: it said only its status)
    text = (results / "reports" / "fake__cpu.md").read_text()
    assert ("> **Interrupted**: the run that wrote this report was stopped by SIGINT while "
            "`fake/cpu/long_run/default` (NOT RUN: no current record) ran; that run was not recorded.") in text, text


def test_a_pytest_run_stopped_before_it_stored_anything_writes_no_report(tmp_path):
    """The pytest door's half of the CLI's rule (test_cli.py): a stopped run that stored nothing
    writes no report, and `nsa-validate report` has none to remove."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", steps=400, env={"NSA_FAKE_STEP_S": "0.05"})])
    results = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                             "validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(results),
                             "-k", "test_phase"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    out, err = interrupt_when_training(proc, lambda: list(results.glob("runs/fake/cpu/long_run/default/*/training.csv")))
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    assert "nsa-validate: interrupted (SIGINT)" in out and "nsa-validate report:" not in out, out[-2000:]
    assert "writing the report" not in out, out[-2000:]
    assert not (results / "reports").exists() or not any((results / "reports").iterdir()), out[-2000:]


def test_a_collection_error_is_not_said_to_be_a_signal(tmp_path):
    """pytest stops with 'Interrupted: 1 error during collection' through its KeyboardInterrupt
    hook, and the plugin printed 'nsa-validate: interrupted (SIGINT): running trainers killed; the
    interrupted point was not recorded' where no signal came and no trainer ran (seen with the
    test extra but not the triton one: tests/kernels/test_launch.py imported triton)."""
    broken = tmp_path / "test_broken.py"
    broken.write_text("import no_such_module_of_this_test\n")
    out = _pytest("validation/tests/test_acceptance.py", str(broken), "--runbook", str(_runbook(tmp_path)),
                  "--results-dir", str(tmp_path / "r"), "-m", "bucket_sweep")
    assert out.returncode == pytest.ExitCode.INTERRUPTED, out.stdout[-2000:]
    assert "interrupted (SIGINT)" not in out.stdout + out.stderr
    assert "nsa-validate: pytest stopped the run (1 error during collection); no point was cut short" in out.stdout
    assert not (tmp_path / "r" / "runs").exists()  # nothing ran


@pytest.mark.parametrize("option", ["--results-dir=", "--runbook=", "--baseline="])
def test_an_empty_path_option_is_a_usage_error(option):
    """`pytest --results-dir=$R` with R unset stored into ./results, the option silently dropped."""
    out = _pytest("validation/tests/test_acceptance.py", "-m", "sanity", option)
    assert out.returncode == 4 and f"{option[:-1]}: an empty path (an unset shell variable?)" in out.stderr, \
        (out.returncode, out.stderr[-1000:])
