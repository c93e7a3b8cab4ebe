"""The report's pictures: what each phase's figure draws (validation/report/series.py: the golden
curve with its first diverging step, gate thresholds over their windows, each rank's step time)
and that the figure is written and embedded under its phase."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from nsa.contract import CSV_COLUMNS
from validation.judge.gates import GateResult, GateVerdict
from validation.report.plots import make_plots
from validation.report.series import Level, levels, point_series, rank_step_series, undrawn
from validation.runbook.plan import expand
from validation.store.goldens import Curve, GoldenFile
from validation.tests.conftest import train_phase


def _csv(steps: int) -> pd.DataFrame:
    rows = [[s, 3.0, 1e-3, 100.0, 0.1, 1.0, 0.5, 0.5 + 0.01 * s] for s in range(1, steps + 1)]
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS))


def _gate(metric: str, op: str, threshold: float | None, window: str, ref: str | None = None) -> GateResult:
    return GateResult(metric, op, threshold, window, 1.0, GateVerdict.PASS, ref)


def test_gate_thresholds_become_levels_over_their_windows():
    csv = _csv(12)
    got = levels([_gate("toks_per_s_mean", ">=", 39.0, "last 5 steps", "min_toks_per_s"),
                  _gate("toks_per_s_per_gpu", ">=", 20.0, "all steps"),
                  _gate("mem_reserved_gb_max", "<=", 40.0, "all steps"),
                  _gate("mem_growth_gb", "<=", 1.0, "last 4 steps"),
                  _gate("toks_per_s_mean", ">=", None, "last 5 steps"),  # to be measured: nothing to draw
                  _gate("loss_finite", "==", 1.0, "all steps")], csv, world_size=2)
    assert got["toks_per_s"] == [
        Level(39.0, 8, 12, "gate toks_per_s_mean >= 39 (min_toks_per_s), last 5 steps"),
        Level(40.0, 1, 12, "gate toks_per_s_per_gpu >= 20, all steps, x 2 ranks")]
    # the memory growth gate: the window's end may lie at most 1 GiB above its first step (9: 0.59)
    assert got["mem_reserved_gb"] == [Level(40.0, 1, 12, "gate mem_reserved_gb_max <= 40, all steps"),
                                      Level(pytest.approx(1.59), 9, 12, "gate mem_growth_gb <= 1, last 4 steps: "
                                                                         "the window's end at most here")]
    cv = _gate("toks_per_s_cv", "<=", 0.1, "last 5 steps")
    assert undrawn([cv], levels([cv], csv, 1)) == {"toks_per_s": ["toks_per_s_cv <= 0.1, last 5 steps"]}


def test_a_column_the_trainer_never_logged_says_so_in_its_panel():
    """A Hugging Face Trainer logs no memory: its panel said nothing, an empty axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from validation.report.plots import _level_panel

    csv = _csv(4)
    csv["mem_reserved_gb"] = float("nan")
    fig, (mem, toks) = plt.subplots(2, 1)
    for ax, col in ((mem, "mem_reserved_gb"), (toks, "toks_per_s")):
        _level_panel(ax, [SimpleNamespace(label="default", csv=csv, levels={}, undrawn={})], {"default": "C0"}, col, col)
    assert [t.get_text() for t in mem.texts] == ["not measured: no mem_reserved_gb in the trainer's output"]
    assert not toks.texts
    plt.close(fig)


def test_rank_step_series_from_the_trainers_own_field_else_from_heartbeat_times():
    own = [{"stage": "forward", "step": 1, "time": 0.0}, {"stage": "step", "step": 1, "step_time_s": 0.7},
           {"stage": "step", "step": 2, "step_time_s": 0.2}]
    assert rank_step_series(own) == [(1, 0.7), (2, 0.2)]
    beats = [{"step": 1, "time": 10.0}, {"step": 1, "time": 10.2}, {"step": 2, "time": 10.5}, {"step": 4, "time": 11.5}]
    assert rank_step_series(beats) == [(2, pytest.approx(0.5)), (4, pytest.approx(0.5))]
    assert rank_step_series([{"step": 0, "time": 1.0, "stage": "data"}]) == []  # an idle rank


def test_each_heartbeat_step_time_is_drawn_at_its_own_step_never_the_next_ones():
    # step 6 of these records takes 0.19 s, the others 0.1 s; each step's records: data, then step
    starts = [0.0]
    for step in range(1, 10):
        starts.append(starts[-1] + (0.19 if step == 6 else 0.1))
    marked = [r for step in range(1, 10) for r in ({"step": step, "time": starts[step - 1], "stage": "data"},
                                                  {"step": step, "time": starts[step] - 0.01, "stage": "step"})]
    slowest = max(rank_step_series(marked), key=lambda st: st[1])
    assert slowest[0] == 6
    # only each step's start recorded, and step 10 begun and never done (a hang): no time for step 10
    started = [{"step": step, "time": starts[step - 1], "stage": "data"} for step in range(1, 11)]
    times = dict(rank_step_series(started))
    assert max(times, key=times.get) == 6 and 10 not in times
    # only each step's end recorded: the interval ending at a step's end is that step's
    ended = [{"step": step, "time": starts[step], "stage": "step"} for step in range(1, 10)]
    times = dict(rank_step_series(ended))
    assert max(times, key=times.get) == 6


def test_a_diverging_run_with_an_idle_rank_is_drawn_and_embedded(fake_run, tmp_path):
    # the fake trainer's loss is 3.0 - 0.01 * step; the golden departs from it at step 4
    golden = [round(3.0 - 0.01 * s, 4) + (0.5 if s == 4 else 0.0) for s in range(1, 7)]
    file = GoldenFile(tmp_path / "goldens" / "fake__cpu.yaml", "fake", "cpu")
    file.put("long_run/default", "cpu", Curve(tuple(golden), commit="f" * 40))
    file.save()
    run = fake_run([train_phase("long_run", fault="idle:rank=1", golden_steps=6, steps=6,
                                env={"NSA_FAKE_WORLD": 2})])
    points = expand(run.runbook, run.profile)
    series = point_series(run.results, run.record, points[0])
    assert series.golden.diverging.step == 4 and series.golden.loss == tuple(golden)
    # its records mark each step's start: the last step's time is unknown
    assert series.rank_step_s[1] == [] and [s for s, _ in series.rank_step_s[0]] == [1, 2, 3, 4, 5]
    plot_dir = run.results / "reports" / "plots"
    (plot_dir / "fake__cpu__gone_phase.png").parent.mkdir(parents=True, exist_ok=True)
    (plot_dir / "fake__cpu__gone_phase.png").write_bytes(b"stale")
    [plot] = make_plots(run.results, run.records, plot_dir, "fake__cpu", points)
    assert plot == {"phase": "long_run", "title": "long_run: loss, tokens/s, memory, step time per rank",
                    "path": "plots/fake__cpu__long_run.png"}
    assert (plot_dir / "fake__cpu__long_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (plot_dir / "fake__cpu__gone_phase.png").exists()  # the report's plots are exactly these
    from validation.report.build import render_text
    text = render_text({**run.context, "plots": [plot], "results_prefix": ".."})
    phase = text.split("### long_run", 1)[1].split("\n## ", 1)[0]
    assert "![long_run: loss, tokens/s, memory, step time per rank](plots/fake__cpu__long_run.png)" in phase


@pytest.mark.parametrize("loss", ["nan", "inf"])
def test_a_non_finite_loss_is_drawn_and_marked_where_it_starts(fake_run, loss):
    """An inf loss made the loss axis's limits infinite: matplotlib raised and no report was
    written, through either door. The figure is drawn, with a line where the non-finite loss begins."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from validation.report.plots import _from_zero, _loss

    run = fake_run([train_phase("long_run", fault=f"nan_logged:step=3{':inf=1' * (loss == 'inf')}", steps=5)])
    points = expand(run.runbook, run.profile)
    assert run.record.status == "FAIL"
    series = point_series(run.results, run.record, points[0])
    fig, ax = plt.subplots()
    _loss(ax, [series], {series.label: "C0"})
    _from_zero(ax)
    assert ax.get_ylim() == (0, pytest.approx(1.12 * 2.99))
    assert "non-finite loss from step 3" in ax.get_legend_handles_labels()[1]
    plt.close(fig)
    plot_dir = run.results / "reports" / "plots"
    [plot] = make_plots(run.results, run.records, plot_dir, "fake__cpu", points)
    assert (plot_dir / "fake__cpu__long_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_render_removes_the_staging_folders_of_killed_renders_never_a_live_ones(fake_run):
    """user hC's pass: a harness killed (SIGKILL) while it drew a report's plots left
    reports/plots/.staging-* folders that no later report removed. A render removes those no live
    render owns: it waits while another render holds the results directory's lock (drawing in its
    own), then removes what is left."""
    import threading

    from validation.report.build import render
    from validation.store.results import ResultStore

    run = fake_run([train_phase(steps=5)])
    plot_dir = run.results / "reports" / "plots"
    killed = plot_dir / ".staging-k1ll3d"
    killed.mkdir(parents=True)
    (killed / "fake__cpu__baseline_ddp.png").write_bytes(b"\x89PNG half")
    render(run.results, "fake", "cpu", runbook=run.runbook, profile=run.profile)
    assert sorted(p.name for p in plot_dir.iterdir()) == ["fake__cpu__baseline_ddp.png"]

    live = plot_dir / ".staging-l1ve"
    live.mkdir()
    with ResultStore(run.results).locked():  # another render drawing in it now
        other = threading.Thread(target=render, args=(run.results, "fake", "cpu"),
                                 kwargs={"runbook": run.runbook, "profile": run.profile})
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive() and live.is_dir()
    other.join()
    assert sorted(p.name for p in plot_dir.iterdir()) == ["fake__cpu__baseline_ddp.png"]


def test_the_fixed_margins_hold_every_label_of_a_gpu_scale_figure():
    """The figure is laid out by fixed margins, not measured (plots.draw): with a GPU run's
    numbers (six-digit tokens/s, tens of GiB, a long sweep label, seven points: three legend
    rows, the per-rank panel) every text is inside the figure and no panel's title runs into the
    panel above or the legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from validation.report.plots import draw
    from validation.report.series import PointSeries

    def csv(scale: float) -> pd.DataFrame:
        rows = [[s, 10.5 - 0.1 * s, 3e-4, 987_654.0 * scale, 73.9, 1.0, 0.31, 71.2] for s in range(1, 41)]
        return pd.DataFrame(rows, columns=list(CSV_COLUMNS))

    series = [PointSeries(f"seq_len={8192 * (i + 1)},batch_size=4,NSA_DDP_BUCKET_MB=100", csv(1 - 0.05 * i), 2,
                          rank_step_s={0: [(s, 0.25) for s in range(2, 41)], 1: [(s, 0.26) for s in range(2, 41)]},
                          levels={"toks_per_s": [Level(450_000.0, 21, 40, "gate toks_per_s_mean >= 450000, last 20 steps")]})
              for i in range(7)]
    fig, ranked = draw("scaling_sweep", series)
    assert ranked
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    drawn = fig.get_tightbbox(renderer)  # inches, of what is drawn
    width, height = fig.get_size_inches()
    assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, (drawn, width, height)
    axes = fig.axes
    legend = fig.legends[0].get_window_extent(renderer)
    assert axes[0].title.get_window_extent(renderer).y1 <= legend.y0
    for upper, lower in zip(axes, axes[1:]):
        assert lower.title.get_window_extent(renderer).y1 <= upper.get_window_extent(renderer).y0
