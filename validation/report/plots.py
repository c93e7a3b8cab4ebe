"""PNG plots for the report: one figure per train phase, its points as coloured lines over steps
(named once, above the panels), panels sharing the step axis:

* loss, each point's golden curve a wide pale line under it, the first step beyond the tolerance
  marked with a red cross and a dotted line;
* tokens/s (global) and reserved memory, each gate's threshold a dashed line over its window (the
  gates on these series that are no level, such as a spread, named in the panel's title);
* for multi-rank points, each rank's step time from its heartbeats (a rank that logged no step is
  named in red: the seeds' "GPU 1 idle").

Every y axis starts at 0; where the step-time panel cuts off outliers (a first step's warm-up,
a hiccup) its title names those steps and the longest time. Series come from validation/report/series.py.
"""
from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

from validation.judge.record import PhaseRecord
from validation.report.series import PointSeries, point_series
from validation.runbook.plan import PhasePoint

#: a step time above this many times the median is cut off the per-rank panel (and counted in its title)
CLIP = 4.0
_RANK_STYLES = ("-", "--", ":", "-.")
_GOLDEN_STYLE = {"linewidth": 6.0, "alpha": 0.25, "solid_capstyle": "round"}
DPI = 90
_LEGEND_PT = 8
#: the average width of a legend character, in ems (of DejaVu Sans, matplotlib's default font)
_CHAR_EM = 0.62
# a figure's margins, inches: left of the panels (y tick labels and the axis label), right,
# below (x tick labels and label), between panels and above the first (a panel's title)
_LEFT_IN, _RIGHT_IN, _BOTTOM_IN, _GAP_IN, _TITLE_IN = 1.0, 0.2, 0.6, 0.5, 0.45


def make_plots(results_dir: Path, records: list[PhaseRecord], plot_dir: Path, stem: str,
               points: list[PhasePoint] | None = None, staging: Path | None = None) -> list[dict[str, str]]:
    """Write one PNG per train phase under ``plot_dir`` (the report's earlier PNGs there are
    removed first); return {phase, title, path relative to the report}. ``points``: the
    runbook's points (their golden curves); points whose CSV is gone or unreadable are left out.
    With ``staging`` (a directory of the same file system) the PNGs are drawn there and nothing
    under ``plot_dir`` is touched: the report written before keeps every plot it names until
    ``publish`` moves the new ones in (an interrupt while they are drawn changes nothing)."""
    by_id = {p.test_id: p for p in points or []}
    by_phase: dict[str, list[PointSeries]] = {}
    for r in records:
        if r.kind != "train" or not r.out_dir:
            continue
        s = point_series(results_dir, r, by_id.get(r.test_id))
        if s is not None:
            by_phase.setdefault(r.phase, []).append(s)
    target = staging or plot_dir
    target.mkdir(parents=True, exist_ok=True)
    if staging is None:
        prune(plot_dir, stem, keep=set())
    out = []
    for phase, series in by_phase.items():
        name = f"{stem}__{phase}.png"
        ranked = _figure(phase, series, target / name)
        out.append({"phase": phase, "title": f"{phase}: loss, tokens/s, memory" + (", step time per rank" if ranked else ""),
                    "path": os.path.relpath(plot_dir / name, plot_dir.parent)})
    return out


def publish(staging: Path, plot_dir: Path, stem: str) -> set[str]:
    """Move the PNGs ``make_plots`` drew under ``staging`` into ``plot_dir`` (each a rename, whole
    or not at all); the names moved. The report that names them is written after this, and the
    earlier report's other plots are removed (``prune``) only after that."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    moved = set()
    for png in sorted(staging.glob(f"{stem}__*.png")):
        os.replace(png, plot_dir / png.name)
        moved.add(png.name)
    return moved


def prune(plot_dir: Path, stem: str, keep: set[str]) -> None:
    """Remove the report's PNGs under ``plot_dir`` other than ``keep``: a phase no longer stored,
    or plots of an older layout."""
    for old in plot_dir.glob(f"{stem}__*.png"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def _figure(phase: str, series: list[PointSeries], path: Path) -> bool:
    """Draw and save one phase's figure; True when it has the per-rank panel."""
    fig, ranked = draw(phase, series)
    fig.savefig(path, dpi=DPI)
    return ranked


def draw(phase: str, series: list[PointSeries]) -> tuple[Any, bool]:
    """One phase's figure, and whether it has the per-rank panel. A Figure of its own (no
    pyplot: no figure manager, no backend to pick; savefig draws a PNG with Agg) laid out by
    fixed margins in inches, which leave room for the widest y tick labels a report draws and
    one line of title per panel: tight_layout would measure every text by drawing the figure
    once more, doubling its cost."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    ranked = [s for s in series if s.rank_step_s]
    n = 3 + bool(ranked)
    width = 8.0
    ncol = _legend_columns([s.label for s in series], width)
    rows = -(-len(series) // ncol)  # of the legend above the panels
    height = 2.5 * n + 0.8
    fig = Figure(figsize=(width, height))
    head = 0.25 + 0.2 * rows + _TITLE_IN  # the suptitle, the legend, the first panel's title
    fig.subplots_adjust(left=_LEFT_IN / width, right=1 - _RIGHT_IN / width, bottom=_BOTTOM_IN / height,
                        top=1 - head / height, hspace=_GAP_IN / ((height - head - _BOTTOM_IN - (n - 1) * _GAP_IN) / n))
    axes = fig.subplots(n, 1, sharex=True)
    colours = {s.label: f"C{i % 10}" for i, s in enumerate(series)}
    _loss(axes[0], series, colours)
    _level_panel(axes[1], series, colours, "toks_per_s", "tokens/s (global)")
    _level_panel(axes[2], series, colours, "mem_reserved_gb", "reserved memory (GiB)")
    tops = {3: _ranks(axes[3], ranked, colours)} if ranked else {}
    axes[-1].set_xlabel("step")
    for i, ax in enumerate(axes):
        _from_zero(ax, tops.get(i))
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colours[s.label], linewidth=2) for s in series]
    fig.legend(handles, [s.label for s in series], loc="upper center", ncol=ncol, fontsize=_LEGEND_PT,
               bbox_to_anchor=(0.5, 1 - 0.3 / height), frameon=False)
    fig.suptitle(f"{phase} over steps (every y axis starts at 0)", fontsize=10, y=1 - 0.05 / height)
    return fig, bool(ranked)


def _legend_columns(labels: list[str], width: float) -> int:
    """Up to three columns for the points' legend, fewer where its longest label would carry it
    past the figure's edges (a sweep over several keys names each point by all of them)."""
    column_in = 0.6 + _CHAR_EM * _LEGEND_PT / 72 * max(map(len, labels))  # the line's handle and gaps, the text
    return max(1, min(3, len(labels), int((width - 0.4) // column_in)))


def _from_zero(ax: Any, top: float | None = None) -> None:
    """x and y from 0; y up to ``top`` or a little above the highest value drawn (matplotlib
    would put a flat line on the frame)."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    ys += [y for c in ax.collections for seg in getattr(c, "get_segments", lambda: [])() for _, y in seg]
    ys = [float(y) for y in ys if math.isfinite(y)]  # an inf or NaN loss is drawn as no point (see _loss)
    ax.set_xlim(left=0)
    ax.set_ylim(0, top if top is not None else 1.12 * max(ys) if ys and max(ys) > 0 else 1)


def _loss(ax: Any, series: list[PointSeries], colours: dict[str, str]) -> None:
    goldens = [s for s in series if s.golden is not None]
    for s in goldens:
        ax.plot(range(1, len(s.golden.loss) + 1), s.golden.loss, color=colours[s.label], **_GOLDEN_STYLE)
    for s in series:
        ax.plot(s.csv["step"], s.csv["loss"], color=colours[s.label], linewidth=1.2)
        bad = s.csv["step"][~s.csv["loss"].map(math.isfinite)]
        if len(bad):  # matplotlib draws no point for an inf or NaN: mark where they start
            ax.axvline(bad.iloc[0], color=colours[s.label], linestyle=":", linewidth=1.0,
                       label=(f"{s.label}: " if len(series) > 1 else "") + f"non-finite loss from step {bad.iloc[0]}")
    for s in goldens:
        d = s.golden.diverging
        if d is not None:
            ax.axvline(d.step, color="red", linestyle=":", linewidth=1.0)
            ax.plot([d.step], [d.loss], marker="x", color="red", markersize=9, linestyle="none",
                    label=(f"{s.label}: " if len(series) > 1 else "") + f"first diverging step {d.step}: "
                          f"{d.loss:.4g} vs golden {d.golden:.4g}")
    if goldens:
        # one key for the style; the curves' source (hardware class, commit, tolerance) once
        ax.plot([], [], color="grey", **_GOLDEN_STYLE, label=goldens[0].golden.label)
    ax.set_ylabel("loss (nats)")
    ax.set_title("loss" + ("; golden curves: the wide pale lines" if goldens else " (no golden curve)"), fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _level_panel(ax: Any, series: list[PointSeries], colours: dict[str, str], col: str, label: str) -> None:
    """A training.csv column per point, and each gate threshold on it over its window."""
    drawn: set[tuple[float, int, int, str]] = set()
    for s in series:
        ax.plot(s.csv["step"], s.csv[col], color=colours[s.label], linewidth=1.2)
        for lv in s.levels.get(col, []):
            key = (lv.value, lv.first_step, lv.last_step, lv.label)
            if key in drawn:  # the phase's points share their gates: one line each
                continue
            drawn.add(key)
            shared = all(lv in p.levels.get(col, []) for p in series)
            ax.hlines(lv.value, lv.first_step, lv.last_step, colors="black" if shared else colours[s.label],
                      linestyles="--", linewidth=1.2, label=lv.label)
    ax.set_ylabel(label)
    if all(s.csv[col].isna().all() for s in series):  # a trainer whose own output has no such column
        ax.text(0.5, 0.5, f"not measured: no {col} in the trainer's output", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="grey")
    other = sorted({g for s in series for g in s.undrawn.get(col, [])})
    if other:
        ax.set_title("gates that are no line here: " + "; ".join(other), fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _ranks(ax: Any, series: list[PointSeries], colours: dict[str, str]) -> float | None:
    """Each rank's step time, ranks with no step logged named in red; the y axis's top when
    outliers are cut off (None: all shown)."""
    values = [t for s in series for steps in s.rank_step_s.values() for _, t in steps]
    idle = [f"{s.label} rank {r}" if len(series) > 1 else f"rank {r}"
            for s in series for r, steps in s.rank_step_s.items() if not steps]
    for s in series:
        for r, steps in sorted(s.rank_step_s.items()):
            if steps:
                ax.plot([x for x, _ in steps], [t for _, t in steps], color=colours[s.label],
                        linestyle=_RANK_STYLES[r % len(_RANK_STYLES)], linewidth=1.2,
                        label=f"{s.label} rank {r}" if len(series) > 1 else f"rank {r}")
    title, top = "step time per rank (heartbeats)", None
    if values:
        median = statistics.median(values)
        kept = [t for t in values if t <= CLIP * median]
        if len(kept) < len(values):
            top = 1.15 * max(kept)
            over = sorted({x for s in series for steps in s.rank_step_s.values() for x, t in steps if t > CLIP * median})
            title += (f"; above the axis: step {', '.join(map(str, over))} (up to "
                      f"{max(t for t in values if t > CLIP * median):.3g} s)")
    if idle:
        ax.text(0.01, 0.95, "no step logged: " + ", ".join(idle), transform=ax.transAxes, color="red",
                fontsize=8, va="top")
    ax.set_ylabel("step time (s)")
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")
    return top
