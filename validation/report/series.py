"""What the report's plots draw, read for one stored train point: its training.csv, each rank's
step times from its heartbeats, its golden loss curve with the first diverging step, and its
gates' thresholds as levels on the series they judge. Data only: validation/report/plots.py draws.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validation.contract.files import read_heartbeats, read_training_csv
from validation.errors import ArtifactError
from validation.judge.findings.finding import point_label
from validation.judge.clock import step_times
from validation.judge.gates import GateResult, Window, shown_window
from validation.judge.metrics import METRICS, Source
from validation.judge.record import PhaseRecord
from validation.runbook.plan import GOLDEN_RTOL, PhasePoint
from validation.store import goldens

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd


@dataclass(frozen=True)
class Level:
    """A gate's threshold as a horizontal line, over the steps its window judges."""

    value: float
    first_step: int
    last_step: int
    label: str


@dataclass(frozen=True)
class Golden:
    """The golden loss of steps 1..N on the point's hardware class, as the report re-checks it."""

    loss: tuple[float, ...]
    label: str
    diverging: goldens.Divergence | None = None


@dataclass(frozen=True)
class PointSeries:
    label: str
    csv: pd.DataFrame
    world_size: int = 1
    golden: Golden | None = None
    rank_step_s: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Per rank of the world, (step, seconds) from its heartbeats; a rank with none is idle."""
    levels: dict[str, list[Level]] = field(default_factory=dict)
    """training.csv column -> the gate thresholds drawn on it."""
    undrawn: dict[str, list[str]] = field(default_factory=dict)
    """training.csv column -> its other gates, which are no level of it (a spread, a ratio)."""


def point_series(results_dir: Path, rec: PhaseRecord, point: PhasePoint | None) -> PointSeries | None:
    """The point's series, or None when its training.csv is gone or unreadable (left out of the
    plots). ``point``: the runbook point it ran as (for its golden curve), when known."""
    out_dir = Path(results_dir) / rec.out_dir
    try:
        csv = read_training_csv(out_dir)
    except ArtifactError:
        return None
    try:
        beats = read_heartbeats(out_dir) if rec.world_size > 1 else {}
    except ArtifactError:
        beats = {}
    drawn = levels(rec.gates, csv, rec.world_size)
    return PointSeries(point_label(rec), csv, rec.world_size, _golden(point, rec, csv),
                       {r: rank_step_series(beats.get(r, [])) for r in range(rec.world_size)} if beats else {},
                       drawn, undrawn(rec.gates, drawn))


def rank_step_series(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, seconds) of one rank: its step records' own ``step_time_s`` where it writes them,
    else the steps' times its heartbeats show (any trainer's: the judge's clock, each time drawn at
    its own step)."""
    own = [(int(r["step"]), float(r["step_time_s"])) for r in records
           if r.get("stage") == "step" and _num(r.get("step")) and _num(r.get("step_time_s"))]
    if own:
        return sorted(dict(own).items())
    return sorted(dict(step_times(records)).items())


#: the training.csv columns the plots draw with their gates
_PLOTTED = ("toks_per_s", "mem_reserved_gb")
#: gate metrics drawn as a level: metric -> (training.csv column, scaled by the world size)
_LEVELS = {"toks_per_s_mean": ("toks_per_s", False), "toks_per_s_per_gpu": ("toks_per_s", True),
           "mem_reserved_gb_max": ("mem_reserved_gb", False)}


def levels(gates: list[GateResult], csv: pd.DataFrame, world_size: int) -> dict[str, list[Level]]:
    """Each gate on a level of a plotted series, over the steps of its window. A per-GPU tokens/s
    floor is drawn times the world size on the global series; the memory-growth gate as the
    highest memory the window may end at (its first step's value plus the allowed growth)."""
    out: dict[str, list[Level]] = {}
    last = int(csv["step"].max())
    for g in gates:
        if g.threshold is None:
            continue
        window = Window.parse(g.window)
        first = max(int(csv["step"].min()), last - window.last + 1) if window.last else int(csv["step"].min())
        label = f"gate {g.metric} {g.op} {g.threshold:g}" + (f" ({g.threshold_ref})" if g.threshold_ref else "")
        label += f", {g.window}"
        if g.metric in _LEVELS:
            col, per_gpu = _LEVELS[g.metric]
            value = g.threshold * world_size if per_gpu else g.threshold
            out.setdefault(col, []).append(Level(value, first, last, label + (f", x {world_size} ranks" if per_gpu else "")))
        elif g.metric == "mem_growth_gb":
            start = csv[csv["step"] >= first]["mem_reserved_gb"]
            if not start.empty and start.notna().iloc[0]:
                out.setdefault("mem_reserved_gb", []).append(
                    Level(float(start.iloc[0]) + g.threshold, first, last, label + ": the window's end at most here"))
    return out


def undrawn(gates: list[GateResult], drawn: dict[str, list[Level]]) -> dict[str, list[str]]:
    """Per plotted column, the gates on a metric that reads it but is drawn as no level of it
    (toks_per_s_cv: a spread), so that the panel can name them."""
    out: dict[str, list[str]] = {}
    for g in gates:
        if g.threshold is None or g.metric in _LEVELS or g.metric == "mem_growth_gb" or g.metric not in METRICS:
            continue
        for col in {i.name for i in METRICS[g.metric].reads if i.source == Source.CSV} & set(_PLOTTED):
            window = shown_window(g.metric, g.window)
            out.setdefault(col, []).append(f"{g.metric} {g.op} {g.threshold:g}" + (f", {window}" if window else ""))
    return out


def _golden(point: PhasePoint | None, rec: PhaseRecord, csv: pd.DataFrame) -> Golden | None:
    if point is None or not point.phase.golden_steps or rec.hardware is None:
        return None
    try:
        file = goldens.GoldenFile.for_pair(point.runbook.path, point.runbook.name, point.profile.name)
    except goldens.GoldenError:
        return None
    hw = goldens.hardware_class(rec.hardware)
    curve = file.get(goldens.point_id(point), hw)
    if curve is None:
        return None
    rtol = point.profile.thresholds.get(GOLDEN_RTOL)
    _, first = goldens.compare(goldens.losses(csv, len(curve.loss)), curve, rtol if rtol is not None else 0.0)
    within = f"rtol {rtol:g}" if rtol is not None else "no tolerance set"
    return Golden(curve.loss, f"golden, {hw} (commit {(curve.commit or '?')[:8]}; {within})", first)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
