"""The CLI: exit codes per status, clear errors for bad runbooks, report from stored results,
phase listing, and python -m validation."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from validation import REPO_ROOT
from validation.cli import main
from validation.tests.conftest import (default_sigint, interrupt_when_training, slow_second_point, train_phase,
                                      write_runbook)

#: a gate on speed alone: a point's loss is not checked by any gate
TOKS = {"metric": "toks_per_s_mean", "op": ">=", "threshold": {"profile": "min_toks_per_s"}, "window": "last 5 steps"}


def test_run_nogo_exit_code_and_report_with_plots(tmp_path, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run", fault="crash:step=2")])
    results = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results)]) == 1
    out = capsys.readouterr()
    assert "[2/2] fake/cpu/long_run/default: FAIL" in out.err and "NO-GO" in out.out
    report = (results / "reports" / "fake__cpu.md").read_text()
    assert "![baseline_ddp: loss, tokens/s, memory](plots/fake__cpu__baseline_ddp.png)" in report
    assert (results / "reports" / "plots" / "fake__cpu__baseline_ddp.png").stat().st_size > 1000
    # report from the store alone, without the runbook on disk
    rb.unlink()
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == 1


def test_a_point_that_passed_its_gates_with_a_critical_finding_says_so_in_its_line(tmp_path, capsys):
    """A user's pass: a point whose gates passed while a critical finding made the run NO-GO (a rank
    that did no work, where no gate checks it) printed 'PASS (4.6s) 1 gate(s) passed' and nothing of
    why the run was NO-GO until the report; the pytest door fails its test for it. Its line says it,
    as pytest's."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", fault="idle:rank=1", env={"NSA_FAKE_WORLD": "2"},
                                                          gates=[TOKS])])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"), "--no-plots"]) == 1
    said = capsys.readouterr()
    [line] = [ln for ln in (said.out + said.err).splitlines() if "long_run/default: PASS" in ln]
    assert "1 gate(s) passed; but critical: idle rank in long_run [default]: 1 of 2 rank(s) did no work" in line, line


def test_a_nan_loss_no_gate_checks_is_a_failed_point_not_a_pass_with_a_finding(tmp_path, capsys):
    """A trainer logged NaN from step 3 and exited 0 in a phase of no gates (or one gating only
    speed): its line said 'PASS ... completed (no gates); but critical: non-finite loss ...' and the
    report counted 1 PASS / 0 FAIL under a NO-GO verdict, while a run that stopped short with no
    gates was a FAIL. The NaN fails the point, in its line, its record and the report's counts."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("no_gates", fault="nan_logged:step=3", gates=[]),
                                              train_phase("speed_only", fault="nan_logged:step=3", gates=[TOKS])])
    results = tmp_path / "r"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == 1
    said = capsys.readouterr()
    lines = [ln for ln in (said.out + said.err).splitlines() if "/default: " in ln and "..." not in ln]
    assert any("no_gates/default: FAIL" in ln and ln.endswith(
        "non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT)") for ln in lines), lines
    assert any("speed_only/default: FAIL" in ln and ln.endswith(
        "non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT); its gates: 1 gate(s) passed")
        for ln in lines), lines
    assert not any("but critical" in ln for ln in lines), lines
    report = (results / "reports" / "fake__cpu.md").read_text()
    assert "| 0 | 2 | 0 | 0 | 0 | 0 |" in report, report


def test_bad_runbook_exit_2_names_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprofiles: [cpu]\nphases:\n  - {name: p, kind: train, steps: -1}\n")
    assert main(["run", "--runbook", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml: phases[0].steps: expected an integer >= 1, got -1" in err


def test_a_runbook_profile_that_does_not_exist_is_named_with_its_file_and_key(tmp_path, capsys):
    """A misspelt profile in the runbook's own list: the error named neither the file nor the key."""
    bad = write_runbook(tmp_path / "bad.yaml", [train_phase()], profiles=["cpuu"])
    for argv in (["phases", "--runbook", str(bad)], ["run", "--runbook", str(bad), "--results-dir", str(tmp_path / "r")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{bad}: profiles[0]: no profile 'cpuu' under " in err and "profiles there: a100, cpu, h100, h200" in err, err
    assert not (tmp_path / "r").exists()


def test_phases_lists_gates_and_sweeps(capsys):
    assert main(["phases", "--runbook", "nsa_ddp_a100", "--profile", "a100"]) == 0
    out = capsys.readouterr().out
    assert "gate: toks_per_s_mean >= 39 (last 50 steps)" in out
    assert "sweep: NSA_DDP_BUCKET_MB=25, NSA_DDP_BUCKET_MB=50, NSA_DDP_BUCKET_MB=100" in out


def test_phases_names_no_window_for_a_metric_of_the_whole_run(capsys):
    """A metric that takes no window (tests_failed, preflight_missing, loss_finite) is listed without
    one: '(all steps)' beside it named a window it never had; a windowed metric keeps its own."""
    assert main(["phases"]) == 0
    out = capsys.readouterr().out
    for line in ("gate: preflight_missing == 0\n", "gate: tests_failed <= 0\n", "gate: loss_finite == 1\n",
                 "gate: toks_per_s_mean >= 1 (last 5 steps)\n", "gate: loss_drop >= 0.5 (all steps)\n"):
        assert line in out, (line, out)
    assert "gate: tests_failed <= 0 (" not in out


def test_phases_names_a_profile_phases_launch_trainer_and_profiled_steps(tmp_path, capsys):
    """A runbook trainer's profile phase read 'torch.profiler, 12 steps': neither the trainer that
    runs it, as its train and resume phases say, nor the steps it is asked to profile (and that
    trainer profiles however it does, torch.profiler or not)."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "profile"]}
    rb = write_runbook(tmp_path / "rb.yaml", [{"name": "prof", "kind": "profile", "steps": 12, "profile_steps": 4,
                                              "launcher": {"kind": "torchrun", "nproc": 2}, "gates": []}],
                       trainer=trainer)
    assert main(["phases", "--runbook", str(rb)]) == 0
    out = capsys.readouterr().out
    assert ("  prof               profile   1 point(s)  timeout 30s  torchrun x2, trainer mine, 12 steps, 4 of them "
            "profiled once steady (CONTRACT_PROFILE_STEPS=4)\n") in out, out
    assert main(["phases"]) == 0  # this project's trainer profiles with torch.profiler
    assert ("python, config tiny, 4 steps, 2 of them profiled with torch.profiler once steady "
            "(CONTRACT_PROFILE_STEPS=2)\n") in capsys.readouterr().out


def test_python_dash_m_validation_default_is_cpu_smoke():
    out = subprocess.run([sys.executable, "-m", "validation", "phases"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("runbook cpu_smoke")


def test_an_interrupt_that_surfaces_as_another_error_still_exits_130(monkeypatch, capsys):
    """Ctrl-C during a C extension's first import (matplotlib's Agg backend while plots are drawn)
    reaches Python as "ImportError: initialization failed"; CI saw exit 1 for it. With the interrupt
    flag set (by the stop-signal handler) it is an interrupt; without it the error is not swallowed."""
    import signal

    from validation import cli

    def interrupted_import(args):
        try:
            signal.raise_signal(signal.SIGINT)  # the handler sets the flag and raises Stopped
        except KeyboardInterrupt:
            raise ImportError("initialization failed") from None

    monkeypatch.setattr(cli, "cmd_phases", interrupted_import)
    assert main(["phases", "--runbook", "nsa_ddp_a100"]) == 130
    assert "interrupted" in capsys.readouterr().err

    def broken_import(args):
        raise ImportError("initialization failed")

    monkeypatch.setattr(cli, "cmd_phases", broken_import)
    with pytest.raises(ImportError):
        main(["phases", "--runbook", "nsa_ddp_a100"])


def test_report_of_a_missing_results_dir_is_a_usage_error_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["report", "--results-dir", str(missing)]) == 2
    assert "results directory" in capsys.readouterr().err and not missing.exists()


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_a_positive_number(jobs, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--jobs", jobs])
    assert exc.value.code == 2 and "--jobs" in capsys.readouterr().err


def test_a_repeated_phase_runs_once(tmp_path, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run")])
    args = ["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(tmp_path / "r"), "--no-report"]
    assert main(args + ["--phase", "long_run", "--phase", "long_run"]) == 0
    err = capsys.readouterr().err
    assert "1 point(s)" in err and err.count("fake/cpu/long_run/default: PASS") == 1


def test_numbers_in_the_report_have_thousands_separators():
    from validation.report.tables import cell

    assert cell(34512.4) == "34,512" and cell(245600.0) == "245,600" and cell(0.06673) == "0.06673"
    assert cell(None) == "—" and cell("a|b") == "a\\|b"


def test_an_install_without_the_checkout_says_what_to_do(tmp_path, monkeypatch, capsys):
    """`pip install .` (not -e) copies only the packages: runbooks/ and reports/ stay behind, and
    the CLI once failed with a bare 'file not found'."""
    import validation

    monkeypatch.setattr(validation, "RUNBOOK_DIR", tmp_path / "site-packages" / "runbooks")
    assert main(["phases"]) == 2
    err = capsys.readouterr().err
    assert "runbooks not found" in err and "pip install -e ." in err


def test_an_interrupted_run_prints_no_status_line_that_reads_as_its_verdict(tmp_path):
    """After Ctrl-C the CLI printed 'nsa-validate: GO -> report' (the status of the records stored
    before) and then its 'interrupted' line: the run that was stopped read as GO."""
    rb, csvs = slow_second_point(tmp_path)
    results = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--results-dir",
                             str(results), "--no-plots"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = interrupt_when_training(proc, lambda: csvs(results))
    assert proc.returncode == 130, err[-2000:]
    assert not re.search(r"^nsa-validate: (GO|NO-GO|INCOMPLETE)\b", out, re.M), out
    report = results / "reports" / "fake__cpu.md"
    assert f"nsa-validate: report of the points stored before the interrupt (no verdict of this run) -> {report}" in out
    assert "interrupted (SIGINT)" in err and "[1/2] fake/cpu/baseline_ddp/default: PASS" in err, err[-2000:]


def test_the_report_of_an_interrupted_run_says_where_it_stopped(tmp_path):
    """user hH's pass: a run stopped (SIGINT) within a point that had an earlier record left a
    report saying only 'Status: GO': the stored records' status, with no word of the stop. It says
    the run was stopped, at which point, and what that point's row is; and its status, of the
    records stored, is never GO (user s16's pass: a GO of earlier records, maybe of other code,
    headed the report of a run that judged nothing new)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run", steps=60,
                                                                         env={"NSA_FAKE_STEP_S": "0.05"})])
    results = tmp_path / "res"
    args = [sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--results-dir", str(results),
            "--no-plots"]
    assert subprocess.run(args, cwd=REPO_ROOT, capture_output=True, timeout=120).returncode == 0
    report = results / "reports" / "fake__cpu.md"
    assert "Interrupted" not in report.read_text()
    [earlier] = results.glob("runs/fake/cpu/long_run/default/*/training.csv")
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    csvs = lambda: [c for c in results.glob("runs/fake/cpu/long_run/default/*/training.csv") if c != earlier]
    out, err = interrupt_when_training(proc, csvs)
    assert proc.returncode == 130, err[-2000:]
    text = report.read_text()
    assert "**Status: INCOMPLETE**" in text and "**Status: GO**" not in text
    assert "the run that wrote this report was stopped by SIGINT before it judged every point" in text
    assert re.search(r"> \*\*Interrupted\*\*: the run that wrote this report was stopped by SIGINT while "
                     r"`fake/cpu/long_run/default` \(its row is its earlier record, PASS, of a run started "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d UTC\) ran; that run was not recorded\. The status above is of the "
                     r"records stored, never GO for a stopped run", text), text[:3000]
    # a report written from the store afterwards is of the store alone
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == 0
    assert "Interrupted" not in report.read_text()


def test_a_run_stopped_before_it_stored_anything_writes_no_report_and_report_agrees(tmp_path, capsys):
    """user s6_hG: Ctrl-C in the first point of a new results directory wrote an INCOMPLETE report
    (every point NOT RUN, an 'Interrupted' note), which the next `nsa-validate report` removed ('no
    results') and the pytest door never wrote. Neither door writes a report of a stopped run that
    stored nothing (the pytest door: validation/tests/doors/test_plugin.py)."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", steps=400, env={"NSA_FAKE_STEP_S": "0.05"})])
    results = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "-m", "validation", "run", "--runbook", str(rb), "--results-dir",
                             str(results), "--no-plots"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    out, err = interrupt_when_training(proc, lambda: list(results.glob("runs/fake/cpu/long_run/default/*/training.csv")))
    assert proc.returncode == 130, err[-2000:]
    assert err.rstrip().endswith("; no point of it is stored, so no report was written (there is nothing to report)"), \
        err[-2000:]
    assert not (results / "reports").exists() or not any((results / "reports").iterdir()), out
    assert main(["report", "--runbook", str(rb), "--results-dir", str(results)]) == 2
    assert "no results in" in capsys.readouterr().err


def test_an_interrupt_while_the_report_is_written_says_every_point_was_stored(tmp_path, capsys, monkeypatch):
    """user7's pass: Ctrl-C after the last point was judged and stored, while its report was
    rendered, printed 'the interrupted point was not recorded (its earlier record and artifacts
    are kept), and the report shows the points finished before': no point had been interrupted,
    every one was stored, and no report of them had been written."""
    import validation.cli as cli

    def interrupted(session, pairs=None, interrupted=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_render", interrupted)
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(tmp_path / "r")]) == 130
    err = capsys.readouterr().err
    assert "fake/cpu/baseline_ddp/default: PASS" in err, err
    assert "not recorded" not in err and "points finished before" not in err, err
    assert ("nsa-validate: interrupted (SIGINT) while the report was written: every point ran and was stored; "
            "`nsa-validate report` writes its report") in err, err


def test_an_interrupt_while_the_report_is_written_leaves_no_report_of_removed_runs(tmp_path, monkeypatch, capsys):
    """user13: a second run stopped while it wrote its report left the first run's report, which
    named run directories the second run had already removed (its records replaced them)."""
    import validation.cli as cli

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    results = tmp_path / "r"
    args = ["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]
    assert main(args) == 0
    report = results / "reports" / "fake__cpu.md"
    [first] = results.glob("runs/fake/cpu/baseline_ddp/default/*")
    assert f"runs/fake/cpu/baseline_ddp/default/{first.name}/" in report.read_text()

    def interrupted(session, pairs=None, interrupted=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_render", interrupted)
    assert main(args) == 130
    assert not first.exists()  # the second run's record replaced it
    assert not report.exists() or first.name not in report.read_text()
    assert "`nsa-validate report` writes its report" in capsys.readouterr().err


@pytest.mark.parametrize("interrupted, said", [
    (False, "nsa-validate: writing the report ...\n"),
    (True, "nsa-validate: writing the report of the points stored before the interrupt (another stop signal leaves "
           "it unwritten) ...\n")])
def test_the_cli_says_it_is_writing_the_report_before_it_renders_it(capsys, interrupted, said):
    """Rendering draws a plot per phase: after a Ctrl-C on a busy 2-core machine it took 10 s, in which the
    run printed nothing between the stop and the report's line."""
    import validation.cli as cli

    shown_before = []

    class Session:
        profile_notes = ()

        def render(self, pairs, notes):
            shown_before.append(capsys.readouterr().err)
            return []

        def exit_status(self, rendered):
            return 0
    assert cli._render(Session(), interrupted=interrupted) == 0
    assert shown_before == [said]


@pytest.mark.parametrize("second_stop, flags, stored, said", [
    (False, [], True, ", and the report shows the points finished before"),
    (True, [], True, "; no report was written (a second stop came while it was): `nsa-validate report` writes it "
                     "from the stored records"),
    (False, ["--no-report"], True, ", and no report was asked (--no-report)"),
    (False, [], False, "; no point of it is stored, so no report was written (there is nothing to report)"),
])
def test_a_stopped_run_says_whether_it_wrote_the_report_of_the_points_before(tmp_path, capsys, monkeypatch,
                                                                              second_stop, flags, stored, said):
    """A second Ctrl-C while a stopped run wrote the report of its finished points left no report
    (the record it replaced had withdrawn the old one), yet the run said 'the report shows the
    points finished before'; so did a run with --no-report."""
    import validation.cli as cli

    if stored:  # as though the store held records of the pair
        monkeypatch.setattr(cli.AcceptanceSession, "reportable_after_stop", lambda self, pairs: sorted(pairs))

    def stopped(self, *args, **kwargs):
        raise KeyboardInterrupt
    rendered = []

    def render(session, pairs=None, interrupted=False):
        if second_stop:
            raise KeyboardInterrupt
        rendered.append(interrupted)
        return 0
    monkeypatch.setattr(cli.AcceptanceSession, "run", stopped)
    monkeypatch.setattr(cli, "_render", render)
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"), *flags]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("nsa-validate: interrupted (SIGINT): running trainers killed") and err.endswith(said), err
    assert rendered == ([True] if stored and not second_stop and not flags else [])
