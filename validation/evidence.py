"""Evidence collection: the finished run's artifacts read into RunData (for the metrics) and
into the record's Evidence (for findings and the report)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from . import contract
from .artifacts import HALT_NAME, main_thread_frames, parse_stackdump, stackdumps
from .metrics import RunData, fallback_counters, rank_step_times
from .record import Beat, Evidence, Frame, HaltInfo, StackDump
from .runner import ProcResult
from .torchrun_log import rank_failures

MAX_FRAMES = 8


def collect_train(run: RunData, errors: list[str]) -> None:
    """Read a train point's contract files into ``run`` (validation/contract.py); what is
    missing or broken is an error."""
    found = contract.read(run.out_dir)
    run.csv, run.heartbeats, run.env, run.halted = found.csv, found.heartbeats, found.env, found.halted
    errors.extend(found.problems())
    if run.env and isinstance(run.env.get("world_size"), int):
        run.world_size = run.env["world_size"]


def read_halt(out_dir: Path) -> HaltInfo | None:
    """The .HALT file: a JSON record (the trainer's watchdog and NaN guard; its ``text``, when it
    has one, is what the trainer said) or free text (an operator's); None when there is none.
    A record cut short (a trainer that writes it in place and died, or is read, mid-write) is
    not an operator's text: its source and step are read from what is there."""
    path = Path(out_dir) / HALT_NAME
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        if rec is None and text.lstrip().startswith("{"):
            source = re.search(r'"source"\s*:\s*"([^"\\]*)"', text)
            step = re.search(r'"step"\s*:\s*(\d+)', text)
            return HaltInfo(source=source and source.group(1), step=step and int(step.group(1)),
                            text=text.strip(), torn=True)
        return HaltInfo(text=text.strip())
    losses = rec.get("losses")
    return HaltInfo(source=rec.get("source"), step=rec.get("step") if isinstance(rec.get("step"), int) else None,
                    losses=losses if isinstance(losses, list) else None,
                    grad_norm=rec.get("grad_norm") if isinstance(rec.get("grad_norm"), (int, float)) else None,
                    text=rec["text"] if isinstance(rec.get("text"), str) else text.strip())


def collect(run: RunData, proc: ProcResult, errors: list[str]) -> Evidence:
    """Stderr tail, .HALT, how each rank ended, where each rank was (last heartbeat, stack dump),
    per-rank step times, fallback counters, first and last loss, the files written."""
    dumps = {}
    for rank, path in stackdumps(run.out_dir).items():
        text = path.read_text(errors="replace")
        frames = main_thread_frames(parse_stackdump(text))[:MAX_FRAMES]
        header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
        dumps[rank] = StackDump(path.name, [Frame(f["file"], f["line"], f["func"]) for f in frames], header)
    beats = {r: _beat(recs[-1]) for r, recs in run.heartbeats.items() if recs}
    losses = run.csv["loss"].tolist() if run.csv is not None and not run.csv.empty else []
    return Evidence(
        errors=errors, stderr_tail=proc.stderr_tail(), stderr_log=proc.stderr_path.name,
        halt=read_halt(run.out_dir) if run.halted else None, rank_failures=rank_failures(proc.stderr_path),
        stackdumps=dumps, last_heartbeat=beats,
        rank_step_time_s={r: round(t, 6) for r, t in rank_step_times(run.heartbeats).items()},
        fallbacks=fallback_counters(run), files=sorted(p.name for p in run.out_dir.iterdir() if p.is_file()),
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
        top_ops=list(run.info.get("top_ops") or []))


def _beat(rec: dict) -> Beat:
    step, util = rec.get("step"), rec.get("gpu_util")
    return Beat(step if isinstance(step, int) else None, rec.get("stage"),
                float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else None)
