"""The stored points' per-step metrics as TensorBoard event files (``--tensorboard DIR``), for
engineers who already look there: no server, ``tensorboard --logdir DIR`` reads them.

One run per point, ``DIR/<runbook>/<profile>/<phase>/<point>``, its earlier events replaced: each
training.csv column under its own name as the tag (loss, lr, toks_per_s, step_time_s, grad_norm,
mem_alloc_gb, mem_reserved_gb: the tags this project's trainer writes itself), ``mfu`` where the
trainer counted its FLOPs and the profile names a peak, and each rank's step time of a
multi-rank point (``rank{R}/step_time_s``, from its heartbeats). Needs the tensorboard package
(torch's SummaryWriter writes through it): ``pip install -e '.[tensorboard]'``.
"""
from __future__ import annotations

import importlib.util
import math
import tempfile
from pathlib import Path

from nsa.contract import CSV_COLUMNS
from validation.errors import HarnessError
from validation.judge.record import PhaseRecord
from validation.report.series import PointSeries, point_series

INSTALL_HINT = "pip install -e '.[tensorboard]'"
PACKAGE = "tensorboard"


def missing() -> str | None:
    """Why the export cannot run here (the tensorboard package is not installed), or None."""
    if importlib.util.find_spec(PACKAGE) is None:
        return f"--tensorboard needs the {PACKAGE} package, which is not installed: {INSTALL_HINT}"
    return None


def unwritable(out: Path) -> str | None:
    """Why event files cannot be written under ``out``, or None: ``out`` (or the nearest of its
    parents that exists) must be a directory this process can create files in. Checked before a
    run, which would otherwise end in a traceback after its points ran; nothing is created."""
    here = out
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is not a directory"
    try:
        tempfile.TemporaryFile(dir=here).close()
    except OSError as exc:
        return f"cannot write in {here} ({exc.strerror or exc})"
    return None


def export(results_dir: Path, records: list[PhaseRecord], out: Path, peak_flops: float | None) -> list[Path]:
    """Write the train points' event files under ``out``; return the run directories written.
    ``peak_flops``: one device's peak FLOP/s from the hardware profile (None: no mfu tag)."""
    why = missing()
    if why:
        raise HarnessError(why)
    written = []
    for rec in records:
        if rec.kind != "train" or not rec.out_dir:
            continue
        series = point_series(results_dir, rec, None)
        if series is None:
            continue
        run_dir = Path(out, *rec.test_id.split("/"))  # runbook/profile/phase/point: safe names (plan.py)
        try:
            _write_events(run_dir, rec, series, peak_flops)
        except OSError as exc:  # a full disk, a folder made read-only since the check before the run
            raise HarnessError.of_os("cannot write the TensorBoard events in", run_dir, exc) from None
        written.append(run_dir)
    return written


def _write_events(run_dir: Path, rec: PhaseRecord, series: PointSeries, peak_flops: float | None) -> None:
    """One point's event file in ``run_dir``, its earlier ones removed."""
    from torch.utils.tensorboard import SummaryWriter

    if run_dir.is_dir():
        for old in run_dir.glob("events.out.tfevents.*"):
            old.unlink()
    flops = rec.metrics.model_flops_per_token
    with SummaryWriter(str(run_dir)) as writer:
        for col in CSV_COLUMNS[1:]:
            values = series.csv[col]
            if not values.map(math.isfinite).any():
                continue  # a column the trainer's files do not carry (an adapter's nan)
            for step, value in zip(series.csv["step"], values):
                writer.add_scalar(col, float(value), int(step))
        if flops and peak_flops:
            for step, toks in zip(series.csv["step"], series.csv["toks_per_s"]):
                writer.add_scalar("mfu", float(toks) * flops / (peak_flops * rec.world_size), int(step))
        for rank, steps in series.rank_step_s.items():
            for step, seconds in steps:
                writer.add_scalar(f"rank{rank}/step_time_s", seconds, step)
