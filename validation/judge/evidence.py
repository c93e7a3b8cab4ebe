"""Evidence collection: the finished run's artifacts read into RunData (for the metrics) and
into the record's Evidence (for findings and the report)."""
from __future__ import annotations

from pathlib import Path

from validation.contract import check as contract
from validation.contract.files import read_halt, stackdumps, tail
from validation.contract.stacks import StackDump, main_thread_frames, parse_faulthandler
from validation.contract.torchrun_log import rank_failures
from validation.judge.metrics import RunData, fallback_counters, rank_step_times
from validation.judge.record import Beat, Evidence

STDERR_TAIL_LINES = 40

MAX_FRAMES = 8


def collect_train(run: RunData, errors: list[str]) -> None:
    """Read a train point's contract files into ``run`` (validation/contract.py); what is
    missing or broken is an error."""
    found = contract.read(run.out_dir)
    run.csv, run.heartbeats, run.env, run.halted = found.csv, found.heartbeats, found.env, found.halted
    errors.extend(found.problems())
    if run.env and isinstance(run.env.get("world_size"), int):
        run.world_size = run.env["world_size"]


def collect(run: RunData, stderr_path: Path, errors: list[str]) -> Evidence:
    """Stderr tail, .HALT, how each rank ended, where each rank was (last heartbeat, stack dump),
    per-rank step times, fallback counters, first and last loss, the files written."""
    dumps = {}
    for rank, path in stackdumps(run.out_dir).items():
        text = path.read_text(errors="replace")
        frames = main_thread_frames(parse_faulthandler(text))[:MAX_FRAMES]
        header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
        dumps[rank] = StackDump(path.name, frames, header)
    beats = {r: _beat(recs[-1]) for r, recs in run.heartbeats.items() if recs}
    losses = run.csv["loss"].tolist() if run.csv is not None and not run.csv.empty else []
    return Evidence(
        errors=errors, stderr_tail=tail(stderr_path, STDERR_TAIL_LINES), stderr_log=stderr_path.name,
        halt=read_halt(run.out_dir) if run.halted else None, rank_failures=rank_failures(stderr_path),
        stackdumps=dumps, last_heartbeat=beats,
        rank_step_time_s={r: round(t, 6) for r, t in rank_step_times(run.heartbeats).items()},
        fallbacks=fallback_counters(run), files=sorted(p.name for p in run.out_dir.iterdir() if p.is_file()),
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
        top_ops=list(run.info.get("top_ops") or []))


def _beat(rec: dict) -> Beat:
    step, util = rec.get("step"), rec.get("gpu_util")
    return Beat(step if isinstance(step, int) else None, rec.get("stage"),
                float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else None)
