"""Evidence collection: the finished run's artifacts read into RunData (for the metrics) and
into the record's Evidence (for findings and the report)."""
from __future__ import annotations

from pathlib import Path

from validation.contract import check as contract
from validation.contract.files import read_halt, stackdumps, tail, unranked_stackdumps
from validation.contract.stacks import StackDump, main_thread_frames, parse_faulthandler
from validation.contract.torchrun_log import rank_failures
from validation.judge.metrics import RunData, costs, fallback_counters, rank_step_times
from validation.judge.record import Beat, Evidence

STDERR_TAIL_LINES = 40

MAX_FRAMES = 8


def collect_train(run: RunData, errors: list[str]) -> None:
    """Read a train point's contract files into ``run`` (validation/contract/check.py); what is
    missing or broken is an error. The world size is env.json's when it says one."""
    found = contract.read(run.out_dir, costs())
    run.csv, run.heartbeats, run.env, run.halted = found.csv, found.heartbeats, found.env, found.halted
    errors.extend(found.problems())
    run.world_size = found.world_size or run.world_size


def collect_halt(run: RunData) -> None:
    """The .HALT record, when the run left one (the metrics and the verdict read it)."""
    run.halt = read_halt(run.out_dir) if run.halted else None


def collect(run: RunData, stderr_path: Path, errors: list[str]) -> Evidence:
    """Stderr tail, .HALT, how each rank ended, where each rank was (last heartbeat, stack dump:
    only of ranks that exist, and those whose rank is unknown), per-rank step times, fallback
    counters, first and last loss, the files written."""
    dumps = {rank: _dump(path) for rank, path in stackdumps(run.out_dir).items() if rank < run.world_size}
    beats = {r: _beat(recs[-1]) for r, recs in run.heartbeats.items() if recs and r < run.world_size}
    losses = run.csv["loss"].tolist() if run.csv is not None and not run.csv.empty else []
    return Evidence(
        errors=errors, stderr_tail=tail(stderr_path, STDERR_TAIL_LINES), stderr_log=stderr_path.name,
        halt=run.halt, rank_failures=rank_failures(stderr_path),
        stackdumps=dumps, unranked_dumps=[_dump(p) for p in unranked_stackdumps(run.out_dir)], last_heartbeat=beats,
        rank_step_time_s={r: round(t, 6) for r, t in rank_step_times(run.heartbeats).items()},
        fallbacks=fallback_counters(run), files=sorted(p.name for p in run.out_dir.iterdir() if p.is_file()),
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
        top_ops=list(run.info.get("top_ops") or []))


def _dump(path: Path) -> StackDump:
    text = path.read_text(errors="replace")
    frames = main_thread_frames(parse_faulthandler(text))[:MAX_FRAMES]
    header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
    return StackDump(path.name, frames, header)


def _beat(rec: dict) -> Beat:
    step, util = rec.get("step"), rec.get("gpu_util")
    return Beat(step if isinstance(step, int) else None, rec.get("stage"),
                float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else None)
