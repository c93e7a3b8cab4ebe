"""TensorBoard event files of the logged steps (telemetry.tensorboard), written by rank 0 into
out_dir/tensorboard: each training.csv column under its own name as the tag (as the harness's
``nsa-validate report --tensorboard`` export names them), the mean gate per branch as gate_cmp /
gate_sel / gate_win, and the model's achieved TFLOP/s. Opt-in, no server needed.

``telemetry.tb_disable`` (env NSA_TB_DISABLE, the seed runbook's switch) turns it off. Without the
tensorboard package the run goes on without a writer; env.json's ``tensorboard`` says why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import TelemetryConfig

TB_DIR = "tensorboard"
INSTALL_HINT = "pip install -e '.[tensorboard]'"


class EventWriter:
    """A SummaryWriter over the logged steps; ``note`` says what it does (or why it does nothing)."""

    def __init__(self, cfg: TelemetryConfig, out_dir: Path, is_master: bool, resume_step: int):
        self._writer = None
        self.dir = Path(out_dir) / TB_DIR
        if not cfg.tensorboard:
            self.note = "off (telemetry.tensorboard=false)"
            return
        if cfg.tb_disable:
            self.note = "off: telemetry.tb_disable (env NSA_TB_DISABLE) turns the writer off"
            return
        if not is_master:
            self.note = "rank 0 writes the events"
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's module imports the tensorboard package
            self.note = f"telemetry.tensorboard is on, but TensorBoard is not importable ({exc}); {INSTALL_HINT}"
            return
        if resume_step == 0 and self.dir.is_dir():
            # a fresh run over an earlier one: its events go, as its training.csv does
            for old in self.dir.glob("events.out.tfevents.*"):
                old.unlink()
        # on resume, events of steps after the checkpoint (a crashed run logged them) are dropped
        self._writer = SummaryWriter(str(self.dir), purge_step=resume_step + 1 if resume_step else None,
                                     flush_secs=10)
        self.note = f"writing {self.dir}"

    @property
    def writing(self) -> bool:
        return self._writer is not None

    def log_step(self, row: dict[str, float], extra: dict[str, Any], flops_per_token: float) -> None:
        if self._writer is None:
            return
        step = int(row["step"])
        for key, value in row.items():
            if key != "step":
                self._writer.add_scalar(key, value, step)
        for branch, value in (extra.get("gates") or {}).items():
            self._writer.add_scalar(f"gate_{branch}", value, step)
        self._writer.add_scalar("achieved_tflops", row["toks_per_s"] * flops_per_token / 1e12, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
