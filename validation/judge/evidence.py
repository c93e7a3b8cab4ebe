"""Evidence collection: the finished run's artifacts read into RunData (for the metrics) and
into the record's Evidence (for findings and the report)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from nsa.contract import TRAINING_CSV
from validation.contract import check as contract
from validation.contract.files import blank, read_halt, stackdumps, tail, torn_last_row, unranked_stackdumps
from validation.contract.stacks import (
    StackDump,
    TakenStack,
    main_thread_frames,
    parse_faulthandler,
    parse_pyspy,
    read_index,
)
from validation.contract.torchrun_log import agent_signalled, log_exception, log_has_traceback, rank_failures
from validation.excerpt import EXCERPT_CHARS, STDERR_TAIL_LINES
from validation.judge.memory import growing_ranks
from validation.judge.metrics import RunData, costs, fallback_counters, rank_step_times
from validation.judge.nodes import lateness, node_evidence, node_failures, slurm_stopped
from validation.judge.record import Beat, Evidence, NotRun, RunSigns, rank_processes
from validation.judge.stability import Rise, Slowdown, Spike, rise, slowdown, spikes


MAX_FRAMES = 8


def collect_train(run: RunData, errors: list[str]) -> None:
    """Read a train point's contract files into ``run`` (validation/contract/check.py); what is
    missing or broken is an error. The world size is env.json's when it says one, and at least the
    processes launched. A training.csv
    row cut off mid-write is not read; of a run that ended by itself with exit 0 (no writer was
    killed) it is an error too: the trainer's last logged step is not in its file."""
    found = contract.read(run.out_dir, costs(), launched=run.world_size)  # run.world_size: the processes launched
    run.csv, run.heartbeats, run.env, run.halted = found.csv, found.heartbeats, found.env, found.halted
    run.reruns = found.reruns
    errors.extend(found.problems())
    run.world_size = found.world_size or run.world_size
    csv = run.out_dir / TRAINING_CSV
    ended_itself = run.exit_code == 0 and not run.timed_out and run.stalled_s is None
    if ended_itself and found.csv is not None and (torn := torn_last_row(csv)) is not None:
        errors.append(f"{csv}: the last row has no line end though the trainer exited 0 (a row cut off mid-write, "
                      f"or rows not ended: every row must end with one): {torn[:EXCERPT_CHARS]!r}")


def collect_halt(run: RunData) -> None:
    """The .HALT record, when the run left one (the metrics and the verdict read it)."""
    run.halt = read_halt(run.out_dir) if run.halted else None


def collect_failures(run: RunData, stderr_path: Path) -> None:
    """How each rank ended, from torchrun's log and every node's agent log, and whether Slurm
    stopped the step, into ``run`` (the verdict reads it: a rank that failed before the others'
    watchdog fired is the cause; ranks Slurm stopped failed in nothing)."""
    run.rank_failures = {**rank_failures(stderr_path), **node_failures(run.out_dir)}
    run.slurm_stopped = slurm_stopped(run.out_dir)


def collect(run: RunData, stderr_path: Path, errors: list[str]) -> Evidence:
    """Stderr tail, .HALT, how each rank ended (``collect_failures``), where each rank was (last heartbeat, stack: only
    of ranks that exist, and those whose rank cannot be told), per-rank step times, fallback
    counters, first and last loss, the files written."""
    taken = read_index(run.out_dir)
    dumps, unranked = _stacks(run.out_dir, taken)
    # the heartbeats of ranks that exist: a file of a rank at or above the world size is malformed
    # (the point's ERROR names it), and whoever wrote it is no rank of its own to place or time
    heartbeats = {r: recs for r, recs in run.heartbeats.items() if r < run.world_size}
    beats = {r: Beat.of(recs) for r, recs in heartbeats.items() if recs}
    losses = run.csv["loss"].tolist() if run.csv is not None and not run.csv.empty else []
    step_times = {r: round(t, 6) for r, t in rank_step_times(heartbeats).items()}
    nodes = node_evidence(run.out_dir, heartbeats, step_times)  # each node's agent logs
    # of one node, how late each rank comes (of several nodes, each node's figure is in ``nodes``)
    late = {r: round(t, 6) for r, t in lateness(heartbeats).items()} if nodes is None and run.world_size > 1 else {}
    failures = run.rank_failures  # collect_failures
    return with_log(Evidence(
        errors=errors, halt=run.halt, rank_failures=failures,
        stackdumps={r: d for r, d in dumps.items() if r < run.world_size}, unranked_stacks=unranked,
        taken_stacks=taken, signalled_pids=agent_signalled(stderr_path), last_heartbeat=beats,
        rank_step_time_s=step_times, rank_lateness_s=late, nodes=nodes,
        fallbacks=fallback_counters(run), files=sorted(p.name for p in run.out_dir.iterdir() if p.is_file()),
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
        nonfinite_loss_step=_first_nonfinite(run),
        top_ops=list(run.info.get("top_ops") or []), reruns=run.reruns, spikes=_spikes(run), divergence=_rise(run),
        slowdown=_slowdown(run), memory_growth=growing_ranks(run.csv, heartbeats, run.env, run.reruns),
        not_run=None if run.launched else NotRun.LAUNCH, misses=list(run.misses),
        rank_processes=rank_processes(beats, run.processes)), stderr_path)


def with_log(ev: Evidence, stderr_path: Path) -> Evidence:
    """``ev`` with its stderr (the log's tail, name, last exception and whether it holds a traceback)
    read from ``stderr_path``: of a launch of several nodes, the log of the node the verdict blames
    (session/runs.py ``record``)."""
    return dataclasses.replace(ev, stderr_tail=tail(stderr_path, STDERR_TAIL_LINES), stderr_log=stderr_path.name,
                               exception=log_exception(stderr_path), traceback=log_has_traceback(stderr_path))


def signs(run: RunData, failed_gates: list[str]) -> RunSigns:
    """What the run's whole training.csv and heartbeats say of how it trained, as ``collect`` puts
    it in a record's evidence: for each process of a point of several (a repeat), whichever decides."""
    heartbeats = {r: recs for r, recs in run.heartbeats.items() if r < run.world_size}
    return RunSigns(_spikes(run), _rise(run), _slowdown(run), growing_ranks(run.csv, heartbeats, run.env, run.reruns),
                    _first_nonfinite(run), run.halt is not None and run.halt.source == "nonfinite", list(failed_gates))


def _slowdown(run: RunData) -> Slowdown | None:
    return None if run.csv is None else slowdown(run.csv["step"].tolist(), run.csv["toks_per_s"].tolist())


def _first_nonfinite(run: RunData) -> int | None:
    if run.csv is None:
        return None
    bad = run.csv.loc[~run.csv["loss"].map(math.isfinite), "step"]
    return int(bad.iloc[0]) if len(bad) else None


def _spikes(run: RunData) -> list[Spike]:
    if run.csv is None:
        return []
    return [s for col in ("loss", "grad_norm") if col in run.csv
            for s in spikes(run.csv["step"].tolist(), run.csv[col].tolist(), run.stability, col)]


def _rise(run: RunData) -> Rise | None:
    return None if run.csv is None else rise(run.csv["step"].tolist(), run.csv["loss"].tolist(), run.stability)


def _stacks(out_dir: Path, taken: list[TakenStack]) -> tuple[dict[int, StackDump], list[StackDump]]:
    """Each rank's stack (the one the harness took when it stopped the run, else the trainer's
    own dump), and the stacks of processes whose rank cannot be told. A dump file with nothing
    but whitespace in it, the trainer's or the harness's, is no stack (files.blank)."""
    dumps = {rank: _read(out_dir, path.name, "trainer", parse_faulthandler)
             for rank, path in stackdumps(out_dir).items()}
    unranked = [_read(out_dir, p.name, "trainer", parse_faulthandler) for p in unranked_stackdumps(out_dir)]
    for t in taken:
        if t.method == "SIGUSR1" and t.rank in dumps:  # the trainer's own dump, written when the harness asked
            dumps[t.rank] = _read(out_dir, dumps[t.rank].path, "SIGUSR1", parse_faulthandler)
        if t.path is None or blank(out_dir / t.path):
            continue  # no dump of its own, or an empty one (py-spy wrote nothing): no stack of the process
        dump = _read(out_dir, t.path, t.method, parse_pyspy, t.pid)
        if t.rank is None:
            unranked.append(dump)
        else:
            dumps[t.rank] = dump
    return dumps, unranked


def _read(out_dir: Path, rel: str, source: str, parse, pid: int | None = None) -> StackDump:
    text = (out_dir / rel).read_text(errors="replace")
    frames = main_thread_frames(parse(text))[:MAX_FRAMES]
    header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
    return StackDump(rel, frames, header, source, pid)
