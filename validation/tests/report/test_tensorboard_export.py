"""``--tensorboard DIR``: the train points' per-step metrics as TensorBoard event files, read
back with TensorBoard's own reader; without the package, a clear error naming the extra."""
from __future__ import annotations

import dataclasses
import importlib.util

import pandas as pd
import pytest

from validation.cli import main
from validation.report import tensorboard
from validation.tests.conftest import read_only, train_phase, write_runbook

HAVE_TB = importlib.util.find_spec("tensorboard") is not None
needs_tb = pytest.mark.skipif(not HAVE_TB, reason="the tensorboard package is not installed "
                                                   "(pip install -e '.[tensorboard]'): no event files to read back")


def scalars(run_dir) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


@needs_tb
def test_report_exports_each_train_point_and_reads_back(tmp_path, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(fault="slow:rank=1", env={"NSA_FAKE_WORLD": 2})])
    results, events = tmp_path / "res", tmp_path / "tb"
    main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-report"])
    assert main(["report", "--results-dir", str(results), "--runbook", str(rb), "--no-plots",
                 "--tensorboard", str(events)]) in (0, 1, 3)
    assert f"TensorBoard events -> {events}" in capsys.readouterr().out
    run_dir = events / "fake" / "cpu" / "baseline_ddp" / "default"
    assert [p.parent for p in events.rglob("events.out.tfevents.*")] == [run_dir]
    got = scalars(run_dir)
    csv = pd.read_csv(next((results / "runs").rglob("training.csv")))
    for col in ("loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb"):
        assert got[col] == pytest.approx(dict(zip(csv["step"], csv[col])), rel=1e-6), col
    assert "mfu" not in got  # the cpu profile names no peak
    # the fake trainer's heartbeats: rank 0 steps every 0.5 s, the slow rank 1 every 1.5 s; they mark
    # each step's start, so the last step's time is unknown
    assert got["rank0/step_time_s"] == pytest.approx({s: 0.5 for s in range(1, 8)})
    assert got["rank1/step_time_s"] == pytest.approx({s: 1.5 for s in range(1, 8)})
    # exporting again replaces the point's events rather than adding a second file
    main(["report", "--results-dir", str(results), "--runbook", str(rb), "--no-plots", "--tensorboard", str(events)])
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1


@needs_tb
def test_mfu_is_exported_where_the_flops_and_a_peak_are_known(fake_run, tmp_path):
    run = fake_run([train_phase()])
    rec = dataclasses.replace(run.record, metrics=dataclasses.replace(run.record.metrics, model_flops_per_token=23868.0))
    [run_dir] = tensorboard.export(run.results, [rec], tmp_path / "tb", peak_flops=1e9)
    got = scalars(run_dir)
    assert got["mfu"] == pytest.approx({s: t * 23868.0 / 1e9 for s, t in got["toks_per_s"].items()}, rel=1e-6)


def test_without_the_package_the_option_is_a_clear_error_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tensorboard, "PACKAGE", "tensorboard_not_installed_here")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(tmp_path / "res"),
                 "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert "--tensorboard needs the tensorboard_not_installed_here package" in err
    assert "pip install -e '.[tensorboard]'" in err
    assert not (tmp_path / "res" / "runs").exists() and not (tmp_path / "tb").exists()


@pytest.mark.parametrize("where", ["a_file", "a_file/below"])
def test_a_directory_that_cannot_be_written_is_a_clear_error_before_anything_runs(tmp_path, capsys, monkeypatch, where):
    """--tensorboard at a path that cannot be a directory (a file, or under one) ended a finished
    run, or a report, in a NotADirectoryError traceback with exit 1 (the NO-GO status)."""
    monkeypatch.setattr(tensorboard, "missing", lambda: None)
    (tmp_path / "a_file").write_text("")
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()])
    bad = tmp_path / where
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(tmp_path / "res"),
                 "--tensorboard", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"nsa-validate: error: --tensorboard {bad}: " in err and "Traceback" not in err, err
    assert f"{tmp_path / 'a_file'} is not a directory" in err, err
    assert not (tmp_path / "res" / "runs").exists()


@needs_tb
def test_an_events_folder_that_cannot_be_written_after_the_check_is_named(fake_run, tmp_path, capsys):
    """The check before the run found the folder writable; a point's folder of an earlier export,
    made read-only since, ended the report in a traceback (exit 1) once its old events were removed."""
    run = fake_run([train_phase()])
    events = tmp_path / "tb"
    args = ["report", "--results-dir", str(run.results), "--runbook", str(run.runbook.path), "--no-plots",
            "--tensorboard", str(events)]
    assert main(args) == 0
    run_dir = events / "fake" / "cpu" / "baseline_ddp" / "default"
    [before] = run_dir.glob("events.out.tfevents.*")
    capsys.readouterr()
    with read_only(run_dir):
        status = main(args)
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("nsa-validate: error: ")]
    assert line.startswith(f"nsa-validate: error: cannot write the TensorBoard events in {run_dir}: "), line
    assert list(run_dir.glob("events.out.tfevents.*")) == [before]
