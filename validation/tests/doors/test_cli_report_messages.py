"""The CLI and the report as a demanding user types and reads them (QA pass 12): each defect
found, with a test that failed before its fix. Stores are hand-built or come from the fake
trainer (validation/tests/fake_trainer.py); nothing here runs the real trainer."""
from __future__ import annotations

from pathlib import Path

from validation.session.session import AcceptanceSession, SessionOptions
from validation.tests.conftest import train_phase, write_runbook


def test_phases_given_out_of_order_run_in_runbook_order(tmp_path):
    """`run --help` says "--phase ... each phase runs once, in runbook order", but `--phase
    long_run --phase baseline_ddp` ran long_run first: the order typed, not the runbook's."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("sdpa_audit"), train_phase("long_run")])
    session = AcceptanceSession(SessionOptions(tmp_path / "r", runbooks=(str(rb),),
                                               phases=("long_run", "baseline_ddp", "long_run")))
    assert [p.phase.name for p in session.points()] == ["baseline_ddp", "long_run"]


def _skip_store(results: Path, runbook: Path) -> None:
    """A store holding a SKIP record of every point of ``runbook`` on the cpu profile."""
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    ResultStore(results).put_many([PhaseRecord.for_point(p, Status.SKIP, "staged", hardware=Machine())
                                   for p in expand(load_runbook(runbook), load_profile("cpu"))])


def test_an_interrupted_report_command_says_what_it_stopped(tmp_path, capsys, monkeypatch):
    """Ctrl-C during `nsa-validate report` printed "running trainers killed; the interrupted point
    was not recorded (its earlier record and artifacts are kept), and the report shows the points
    finished before": report runs no trainer and no point, and the report was not written."""
    import validation.cli as cli
    from validation.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    _skip_store(tmp_path / "r", rb)
    monkeypatch.setattr(cli.AcceptanceSession, "render", interrupted)
    assert main(["report", "--results-dir", str(tmp_path / "r")]) == 130
    err = capsys.readouterr().err
    assert "trainers" not in err and "point" not in err, err
    assert ("nsa-validate: interrupted (SIGINT) while the report was written: a report not finished stays as it "
            "was before (with several runbooks or profiles, the ones finished were written); the stored records are "
            "unchanged; `nsa-validate report` writes it") in err, err


def test_an_interrupt_while_plots_are_drawn_leaves_the_previous_report_whole(fake_run, monkeypatch):
    """Ctrl-C during `nsa-validate report` (or the report at the end of a run) while its PNGs were
    drawn: the previous report was kept, as promised, but its plots had been deleted before the
    new ones were drawn, so the report on disk named images that were gone (seen as an empty
    reports/plots/ after a Ctrl-C 1.2 s into `nsa-validate report`)."""
    import pytest

    import validation.report.plots as plots
    from validation.report.build import render

    run = fake_run([train_phase(steps=5)])
    plot_dir = run.results / "reports" / "plots"  # the previous report and the plot it names
    plot_dir.mkdir(parents=True)
    before = {"fake__cpu__baseline_ddp.png": b"as drawn before"}
    (plot_dir / "fake__cpu__baseline_ddp.png").write_bytes(b"as drawn before")
    report = "![baseline_ddp](plots/fake__cpu__baseline_ddp.png)\n"
    (plot_dir.parent / "fake__cpu.md").write_text(report)

    def interrupted_half_way(phase, series, path):
        path.write_bytes(b"\x89PNG half")  # savefig cut short
        raise KeyboardInterrupt
    monkeypatch.setattr(plots, "_figure", interrupted_half_way)
    with pytest.raises(KeyboardInterrupt):
        render(run.results, "fake", "cpu", runbook=run.runbook, profile=run.profile)
    assert (plot_dir.parent / "fake__cpu.md").read_text() == report
    assert {p.name: p.read_bytes() for p in plot_dir.iterdir()} == before  # no staging directory left either
    assert sorted(p.name for p in plot_dir.parent.iterdir()) == ["fake__cpu.md", "plots"]


def test_a_phase_no_longer_stored_loses_its_plot_once_the_new_report_is_written(fake_run):
    from validation.report.build import render

    run = fake_run([train_phase(steps=5)])
    plot_dir = run.results / "reports" / "plots"
    plot_dir.mkdir(parents=True)
    (plot_dir / "fake__cpu__gone_phase.png").write_bytes(b"stale")
    (plot_dir / "other__cpu__gone_phase.png").write_bytes(b"another report's")
    out = render(run.results, "fake", "cpu", runbook=run.runbook, profile=run.profile)
    assert "(plots/fake__cpu__baseline_ddp.png)" in out.path.read_text()
    assert sorted(p.name for p in plot_dir.iterdir()) == ["fake__cpu__baseline_ddp.png", "other__cpu__gone_phase.png"]


def test_a_sweep_point_that_did_not_pass_says_why_in_its_row(tmp_path):
    """`nsa-validate run --runbook nsa_ddp_a100 --phase bucket_sweep` on a CPU box: the report's
    sweep table showed three rows of dashes and SKIP, and nowhere said why (the reason, 'profile
    a100 needs 2 CUDA GPU(s); this machine has 0', was lost); then a list under the table said it,
    the row itself still without. The sweep table has a Reason column, as the other tables do."""
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine
    from validation.report.build import build_context, render_text
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    rb = load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [1, 4]})]))
    prof = load_profile("cpu")
    one, four = expand(rb, prof)
    ResultStore(tmp_path / "r").put_many([
        PhaseRecord.for_point(one, Status.SKIP, "profile cpu needs 2 CUDA GPU(s); this machine has 0", hardware=Machine()),
        PhaseRecord.for_point(four, Status.UNMEASURED, "toks_per_s_mean: no threshold measured yet", hardware=Machine())])
    text = render_text({**build_context(tmp_path / "r", rb.name, prof.name, runbook=rb, profile=prof), "results_prefix": ".."})
    rows = _sweep_rows(text, "bucket_sweep")
    assert rows[0][0] == "NSA_DDP_BUCKET_MB" and rows[0][-2:] == ["Status", "Reason"], rows
    assert rows[1][0] == "1" and rows[1][-2:] == ["SKIP", "profile cpu needs 2 CUDA GPU(s); this machine has 0"], rows
    assert rows[2][0] == "4" and rows[2][-2:] == ["UNMEASURED", "toks_per_s_mean: no threshold measured yet"], rows


def test_a_failed_sweep_point_says_who_failed_in_its_row(fake_run):
    """A sweep point that crashed showed FAIL in the sweep table without why: its row says what the
    other tables' Reason says, the diagnosis (who crashed, where) before the verdict's reason."""
    run = fake_run([train_phase("bucket_sweep", sweep={"env.NSA_FAULT": ["lean", "crash:step=3"]})])
    rows = _sweep_rows(run.report, "bucket_sweep")
    assert rows[0][-2:] == ["Status", "Reason"] and len({len(r) for r in rows}) == 1, rows
    healthy, crashed = rows[1:]
    assert healthy[-2:] == ["PASS", "2 gate(s) passed"], healthy
    assert crashed[-2] == "FAIL" and crashed[-1].startswith("rank 0 crashed"), crashed
    assert "Points that did not pass" not in run.report


def _sweep_rows(text: str, phase: str) -> list[list[str]]:
    """The cells of each line of a phase's sweep table (its head, then a line per point)."""
    section = text.split(f"### {phase}", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|--")]


def test_not_run_says_why_and_the_command_that_runs_those_points(tmp_path):
    """After `nsa-validate run --phase fused_adamw --phase preflight` the report listed 14 points
    under "Not run" with neither why (no record of them in this store) nor how to run them."""
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine
    from validation.report.build import build_context, render_text
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    rb = load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("sdpa_audit"), train_phase(
        "bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [1, 4]}), train_phase("long_run")]))
    prof = load_profile("cpu")
    points = {p.test_id.split("/", 2)[2]: p for p in expand(rb, prof)}
    ResultStore(tmp_path / "r").put_many([PhaseRecord.for_point(points[k], Status.SKIP, "staged", hardware=Machine())
                                          for k in ("sdpa_audit/default", "bucket_sweep/NSA_DDP_BUCKET_MB=1")])
    text = render_text({**build_context(tmp_path / "r", rb.name, prof.name, runbook=rb, profile=prof), "results_prefix": ".."})
    section = text.split("### Not run", 1)[1].split("\n## ", 1)[0]
    store = (tmp_path / "r").resolve()
    assert (f"No record of these points is stored in this results directory. `nsa-validate run --runbook {rb.path} "
            f"--profile cpu --results-dir {store} --phase baseline_ddp --phase bucket_sweep --phase long_run` runs "
            "them (every point of those phases; a new record replaces the point's stored one):") in section, section
    assert "- `fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=4`" in section and "sdpa_audit" not in section, section


def test_the_report_says_when_and_at_which_commit_each_point_ran(tmp_path):
    """A phase re-run a day later into the same results directory: the report's only date was
    when the report was written ('Date: ...'), so it read as if every point had just run, and no
    line said when (or, at one commit, at which commit) a given point ran."""
    import dataclasses

    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine
    from validation.report.build import build_context, render_text
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    rb = load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run")]))
    prof = load_profile("cpu")
    base, long_run = expand(rb, prof)

    def ran(point, started, sha):
        return dataclasses.replace(PhaseRecord.for_point(point, Status.PASS, "passed", hardware=Machine()),
                                   started=started, wall_s=90.0, out_dir=f"runs/{point.slug}", git_sha=sha)
    ResultStore(tmp_path / "r").put_many([ran(base, "2026-11-26T09:15:02.100+00:00", "a" * 40),
                                          ran(long_run, "2026-11-27T20:05:40.000+00:00", "a" * 40)])
    text = render_text({**build_context(tmp_path / "r", rb.name, prof.name, runbook=rb, profile=prof,
                                        now="2026-11-28 08:00 UTC"), "results_prefix": ".."})
    assert ("- **Date**: report written 2026-11-28 08:00 UTC; its points ran from 2026-11-26 09:15 UTC to "
            "2026-11-27 20:07 UTC\n") in text, text
    assert "(baseline_ddp [default], ran 2026-11-26 09:15 UTC at aaaaaaaaaaaa)" in text, text
    assert "(long_run [default], ran 2026-11-27 20:05 UTC at aaaaaaaaaaaa)" in text, text


def test_bless_refuses_a_stored_run_of_what_the_runbook_asks_no_longer(tmp_path, capsys):
    """A long_run stored at train.seq_len=64, the runbook then changed to 32: `report` rightly
    called the record NOT RUN ("override train.seq_len 64 at the run, 32 in the runbook now"), but
    `bless` wrote its seq_len=64 loss as the golden curve of the seq_len=32 point, and every later
    run of the point was judged against a curve of another configuration."""
    import dataclasses

    from validation.cli import main
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import detect
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    def runbook(seq_len):
        return write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=3, steps=6,
                                                                overrides={"train.seq_len": seq_len})])
    (point,) = expand(load_runbook(runbook(64)), load_profile("cpu"))
    run_dir = tmp_path / "r" / "runs" / "long_run"
    run_dir.mkdir(parents=True)
    (run_dir / "training.csv").write_text("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
                                          + "".join(f"{s},{6 - s / 10},0.001,100,0.1,1,0.1,0.1\n" for s in range(1, 7)))
    ResultStore(tmp_path / "r").put(dataclasses.replace(
        PhaseRecord.for_point(point, Status.PASS, "passed", hardware=detect()), out_dir="runs/long_run", exit_code=0,
        steps=6, git_sha="a" * 40))
    runbook(32)
    assert main(["bless", "--runbook", str(tmp_path / "rb.yaml"), "--profile", "cpu", "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert ("long_run/default: its stored run is of what the runbook asks no longer (override train.seq_len 64 at "
            "the run, 32 in the runbook now); nothing blessed (re-run it first: nsa-validate run --runbook") in err, err
    assert not (tmp_path / "goldens").exists()


def test_an_incomplete_verdict_says_why_its_first_unfinished_point_is_not_done(tmp_path):
    """A golden point run before its curve was blessed: the summary said "1 skipped or without a
    measured threshold" (the profile's golden_loss_rtol is measured, 1e-4: what is missing is the
    curve), the gates table showed its threshold as "to be measured", and neither said what to do."""
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine, detect
    from validation.report.build import build_context, render_text
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store import goldens
    from validation.store.results import ResultStore

    rb = load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run", golden_steps=3)]))
    prof = load_profile("cpu")
    base, long_run = expand(rb, prof)
    gate = goldens.gate(long_run, None, detect(), tmp_path / "r")
    assert gate.threshold == prof.thresholds["golden_loss_rtol"] and "no golden for long_run/default" in gate.note
    assert "to be measured" not in gate.text()
    ResultStore(tmp_path / "r").put_many([
        PhaseRecord.for_point(base, Status.SKIP, "profile cpu needs 2 CUDA GPU(s); this machine has 0", hardware=Machine()),
        PhaseRecord.for_point(long_run, Status.UNMEASURED, f"{gate.metric}: {gate.note}", gates=[gate], hardware=Machine())])
    ctx = build_context(tmp_path / "r", rb.name, prof.name, runbook=rb, profile=prof)
    assert ctx["status_reason"] == ("2 skipped or unmeasured; baseline_ddp [default]: profile cpu needs 2 CUDA GPU(s); "
                                    "this machine has 0"), ctx["status_reason"]
    [row] = [g for g in ctx["gates"] if g["metric"] == "golden_loss_rel_diff"]
    assert row["threshold"] == "0.0001 (golden_loss_rtol)", row


def test_a_results_dir_given_with_a_tilde_is_the_home_directory(tmp_path, monkeypatch, capsys):
    """`nsa-validate run --results-dir=~/r` (the shell leaves a ~ after '=' alone) stored into a
    directory literally named '~' under the working directory and printed '~/r/reports/...', a
    path where the user's shell then found nothing; the pytest door did the same."""
    from validation.cli import main
    from validation.pytest_plugin import results_dir_for

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    _skip_store(home / "r", rb)
    assert main(["report", "--results-dir=~/r", "--no-plots", "--tensorboard=~/tb"]) == 3
    assert f"-> {home / 'r' / 'reports' / 'fake__cpu.md'}" in capsys.readouterr().out
    assert not (cwd / "~").exists()
    assert main(["check-artifacts", "~/r"]) == 1  # a directory (not the contract's): 1, not 2 for no directory
    assert results_dir_for("~/r", False, tmp_path) == home / "r"
    (home / "mine.yaml").write_text(rb.read_text())
    assert main(["phases", "--runbook=~/mine.yaml"]) == 0


def test_the_pytest_results_dir_help_names_both_defaults():
    """`pytest --help` said "--results-dir: result store directory (default: <repo>/results)"; a
    plain test run (no profile or phase in -m, no --runbook or --profile) stores into a temporary
    directory instead (results_dir_for), as the README says."""
    from validation.pytest_plugin import pytest_addoption

    helps = {}

    class Group:
        def addoption(self, name, **kwargs):
            helps[name] = kwargs.get("help", "")

    class Parser:
        def getgroup(self, *args):
            return Group()
    pytest_addoption(Parser())
    text = helps["--results-dir"]
    assert "results" in text and "temporary directory" in text and "plain test run" in text, text


def test_a_store_whose_runbook_cannot_be_loaded_is_never_go(tmp_path, capsys):
    """One phase of a two-phase runbook run (INCOMPLETE), the runbook file then moved: `report`
    said GO, exit 0, "all 1 phase point(s) passed their gates", the missing phase unknown to it,
    and only a note on stderr said that the runbook was not found."""
    from validation.cli import main
    from validation.judge.record import PhaseRecord, Status
    from validation.machine import Machine
    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.store.results import ResultStore

    path = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("long_run")])
    first, _ = expand(load_runbook(path), load_profile("cpu"))
    ResultStore(tmp_path / "r").put(PhaseRecord.for_point(first, Status.PASS, "passed", hardware=Machine()))
    path.rename(tmp_path / "moved.yaml")
    assert main(["report", "--results-dir", str(tmp_path / "r"), "--no-plots"]) == 3
    out, err = capsys.readouterr()
    assert "INCOMPLETE ->" in out and "file not found" in err, (out, err)
    text = (tmp_path / "r" / "reports" / "fake__cpu.md").read_text()
    assert (f"the runbook these records ran from ({path}) could not be loaded, so which of its points were not run "
            f"is unknown (`nsa-validate report --runbook PATH` judges them against it)") in text, text


def test_a_report_by_the_name_of_a_runbook_run_from_a_file_names_the_file(tmp_path, capsys):
    """`report --runbook mine` of a store whose runbook 'mine' ran from a file outside runbooks/ was
    refused with the runbooks under runbooks/ alone: the refusal now names the file its points ran
    from, and the --runbook that reports them."""
    from validation.cli import main

    (tmp_path / "elsewhere").mkdir()
    rb = write_runbook(tmp_path / "elsewhere" / "mine.yaml",
                       [train_phase(steps=4, gates=[{"metric": "loss_finite", "op": "==", "threshold": 1}])], name="mine")
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["report", "--runbook", "mine", "--results-dir", str(res), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "no runbook 'mine' under" in err and f"ran from {rb}: give --runbook {rb}" in err, err
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0
