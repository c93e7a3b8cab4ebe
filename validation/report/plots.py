"""PNG plots for the report: per train phase, tokens/s and reserved memory over steps, one line
per sweep point."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from validation.contract.files import read_training_csv
from validation.errors import ArtifactError
from validation.judge.findings.finding import point_label
from validation.judge.record import PhaseRecord

_SERIES = (("toks_per_s", "tokens/s (global)", "toks"), ("mem_reserved_gb", "reserved memory (GB)", "mem"))


def make_plots(results_dir: Path, records: list[PhaseRecord], plot_dir: Path, stem: str) -> list[dict[str, str]]:
    """Write the PNGs under ``plot_dir``; return {phase, title, path relative to the report}.
    Points whose CSV is gone or unreadable are left out of the plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_phase: dict[str, list[tuple[str, Any]]] = {}
    for r in records:
        if r.kind != "train" or not r.out_dir:
            continue
        try:
            df = read_training_csv(results_dir / r.out_dir)
        except ArtifactError:
            continue
        by_phase.setdefault(r.phase, []).append((point_label(r), df))
    out = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for phase, series in by_phase.items():
        for col, label, suffix in _SERIES:
            fig, ax = plt.subplots(figsize=(7, 3.5))
            for name, df in series:
                ax.plot(df["step"], df[col], label=name, linewidth=1.2)
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.set_title(f"{phase}: {label}")
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(fontsize=7)
            fig.tight_layout()
            path = plot_dir / f"{stem}__{phase}_{suffix}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            out.append({"phase": phase, "title": f"{phase}: {label}", "path": os.path.relpath(path, plot_dir.parent)})
    return out
