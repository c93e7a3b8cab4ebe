"""Evidence collection: the finished run's artifacts read into frozen records (``TrainFiles``,
``Ended``) that the metrics read through RunData, and into the record's Evidence (for the
diagnosis, the findings and the report)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsa.contract import HALT
from validation.contract import check as contract
from validation.contract.files import HaltInfo, read_halt, read_helper_stacks, read_stacks, tail
from validation.contract.reruns import Rerun
from validation.contract.torchrun_log import (RankFailure, agent_signalled, log_exception, log_has_traceback,
                                              rank_failures)
from validation.judge.clock import StepClock
from validation.judge.memory import growing_ranks
from validation.judge.metrics import RunData, costs, fallback_counters, rank_step_times
from validation.judge.nodes import (agent_seen, launch_agent_killed, launch_attempts, lateness, nearness,
                                    node_evidence, node_failures, node_logs, slurm_stopped)
from validation.judge.record import Beat, Evidence, NotRun, RunSigns, rank_processes
from validation.judge.stability import curve, nonfinite
from validation.excerpt import EXCERPT_CHARS, STDERR_TAIL_LINES

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd


MAX_FRAMES = 8


@dataclass(frozen=True)
class TrainFiles:
    """A trainer point's contract files as read once after it ended (validation/contract/check.py),
    with what is missing or broken in them."""

    csv: pd.DataFrame | None
    heartbeats: Mapping[int, list[dict[str, Any]]]
    env: Mapping[str, Any] | None
    halted: bool
    reruns: Mapping[str, list[Rerun]]
    world_size: int
    """env.json's world size where it says one, and at least the processes launched."""
    problems: tuple[str, ...]

    def onto(self, run: RunData) -> RunData:
        """``run`` with these files in it (the metrics read them there)."""
        return dataclasses.replace(run, csv=self.csv, heartbeats=dict(self.heartbeats),
                                   env=dict(self.env) if self.env is not None else None, halted=self.halted,
                                   reruns=dict(self.reruns), world_size=self.world_size)


def read_train(run: RunData) -> TrainFiles:
    """Read a train point's contract files; what is missing or broken is a problem. A training.csv
    row or a heartbeat record cut off mid-write is not read; of a run that ended by itself with
    exit 0 (no writer was killed) it is a problem too: the trainer's last step is not in its file."""
    # run.world_size: the processes launched
    found = contract.read(run.out_dir, costs(), launched=run.world_size, steps=run.steps_requested)
    problems = list(found.problems())
    ended_itself = run.exit_code == 0 and not run.timed_out and run.stalled_s is None
    for cut in contract.unended(found) if ended_itself else []:
        problems.append(f"{cut.path}: the last {cut.entry} has no line end though the trainer exited 0 (a {cut.entry} "
                        f"cut off mid-write, or {cut.entry}s not ended: every {cut.entry} must end with one): "
                        f"{cut.text[:EXCERPT_CHARS]!r}")
    return TrainFiles(found.csv, found.heartbeats, found.env, found.halted, found.reruns,
                      found.world_size or run.world_size, tuple(problems))


@dataclass(frozen=True)
class Ended:
    """How a run ended, as its files and logs say: its .HALT (where its contract files say it left
    one), how each rank ended (torchrun's log and every node's agent log), and how Slurm stopped
    its step without the harness asking. The verdict reads it: a rank that failed before the
    others' watchdog fired is the cause; ranks Slurm stopped failed in nothing."""

    halt: HaltInfo | None
    rank_failures: Mapping[int, RankFailure]
    slurm_stopped: str | None
    agent_killed: str | None
    """A node's torchrun agent that a signal ended (RunData.agent_killed)."""

    def onto(self, run: RunData) -> RunData:
        return dataclasses.replace(run, halt=self.halt, rank_failures=dict(self.rank_failures),
                                   slurm_stopped=self.slurm_stopped, agent_killed=self.agent_killed)


def read_ended(run: RunData, stderr_path: Path) -> Ended:
    """``Ended`` of a run whose contract files were read (``read_train``: whether it left a .HALT)."""
    seen = agent_seen(run.out_dir, stderr_path, run.exit_code)
    return Ended(read_halt(run.out_dir) if run.halted else None,
                 {**rank_failures(stderr_path, seen=seen), **node_failures(run.out_dir)}, slurm_stopped(run.out_dir),
                 launch_agent_killed(run.out_dir, run.stopped_by_harness))


def collect(run: RunData, stderr_path: Path, errors: list[str], clock: StepClock | None = None) -> Evidence:
    """Stderr tail, .HALT, how each rank ended (``read_ended``), where each rank was (last heartbeat, stack: only
    of ranks that exist, and those whose rank cannot be told), per-rank step times, the trainer's
    step time against the harness's (``clock``: judge/clock.py ``step_clock``), fallback counters,
    first and last loss, the files written."""
    # the heartbeats of ranks that exist: a file of a rank at or above the world size is malformed
    # (the point's ERROR names it), and whoever wrote it is no rank of its own to place or time
    heartbeats = {r: recs for r, recs in run.heartbeats.items() if r < run.world_size}
    beats = {r: Beat.of(recs) for r, recs in heartbeats.items() if recs}
    seen = rank_processes(beats, run.processes)
    losses = run.csv["loss"].tolist() if run.csv is not None and not run.csv.empty else []
    trained = signs(run, [])
    taken, dumps, unranked = read_stacks(run.out_dir, MAX_FRAMES)
    step_times = {r: round(t, 6) for r, t in rank_step_times(heartbeats).items()}
    fallbacks = fallback_counters(run)
    # every agent's word of the workers it signalled: one node's agent ends its own ranks
    signalled = sorted({pid for path in [stderr_path, *node_logs(run.out_dir)] for pid in agent_signalled(path)})
    nodes = node_evidence(run.out_dir, heartbeats, step_times)  # each node's agent logs
    # of one node, how late each rank comes (of several nodes, each node's figure is in ``nodes``)
    one_node = nodes is None and run.world_size > 1
    late = {r: round(t, 6) for r, t in lateness(heartbeats).items()} if one_node else {}
    nearest = {r: round(t, 6) for r, t in nearness(heartbeats).items()} if one_node else {}
    return with_log(Evidence(
        errors=errors, halt=run.halt, rank_failures=dict(run.rank_failures),
        stackdumps={r: d for r, d in dumps.items() if r < run.world_size}, unranked_stacks=unranked,
        helper_stacks={r: h for r, h in read_helper_stacks(run.out_dir, MAX_FRAMES).items() if r < run.world_size},
        taken_stacks=taken, signalled_pids=signalled, last_heartbeat=beats,
        no_heartbeats="" if beats else contract.adapter_unmeasured(run.env).get(contract.HEARTBEATS, ""),
        no_halt=contract.adapter_unmeasured(run.env).get(HALT, ""),
        summary_step=None if beats else contract.adapter_summary_step(run.env),
        rank_step_time_s=step_times, clock=clock, rank_lateness_s=late, rank_nearest_s=nearest, nodes=nodes,
        fallbacks=fallbacks, files=_listed(run.out_dir), written_by=run.written_by,
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
        nonfinite_loss_step=trained.nonfinite_loss_step, nonfinite_loss=nonfinite(run.csv),
        top_ops=list(run.info.get("top_ops") or []), reruns=run.reruns,
        restarts=contract.adapter_restarts(run.env), spikes=trained.spikes,
        divergence=trained.divergence, slowdown=trained.slowdown, memory_growth=trained.memory_growth,
        not_run=None if run.launched else NotRun.LAUNCH, misses=list(run.misses), rank_processes=seen,
        silent_ranks=[s for s in run.silent_ranks if s.rank < run.world_size]), stderr_path, run.exit_code)


def with_log(ev: Evidence, stderr_path: Path, exit_code: int | None = None) -> Evidence:
    """``ev`` with its stderr (the log's tail, name, last exception and whether it holds a traceback,
    of its agent's last attempt) read from ``stderr_path``: of a launch of several nodes, the log of
    the node the verdict blames (session/runs.py ``record``); and how each attempt of torchrun's
    workers failed, by every agent's log (``launch_attempts``). ``exit_code``: the run's, of a launch
    of one agent (its agent's: one that exits 0 after a failure had restarted its workers)."""
    seen = agent_seen(stderr_path.parent, stderr_path, exit_code)
    return dataclasses.replace(ev, stderr_tail=tail(stderr_path, STDERR_TAIL_LINES), stderr_log=stderr_path.name,
                               exception=log_exception(stderr_path, seen=seen),
                               traceback=log_has_traceback(stderr_path, seen=seen),
                               attempts=launch_attempts(stderr_path.parent, stderr_path, exit_code))


def signs(run: RunData, failed_gates: list[str]) -> RunSigns:
    """What the run's whole training.csv and heartbeats say of how it trained, as ``collect`` puts
    it in its evidence (a sub-run's signs are read back from there: RunSigns.of)."""
    heartbeats = {r: recs for r, recs in run.heartbeats.items() if r < run.world_size}
    c = curve(run.csv, run.stability)
    return RunSigns(list(c.spikes), c.divergence, c.slowdown, growing_ranks(run.csv, heartbeats, run.env, run.reruns),
                    c.nonfinite_step, run.halt is not None and run.halt.source == "nonfinite", list(failed_gates))


def _listed(out_dir: Path) -> list[str]:
    """The run directory's files and, with a trailing slash, its folders (``harness_stacks/``, a
    trainer's own output), which findings cite: the report's list of the point's artifacts."""
    return sorted(p.name + "/" if p.is_dir() else p.name for p in out_dir.iterdir() if p.is_file() or p.is_dir())
