"""torchtitan (pytorch/torchtitan 0.2.x and 0.3.x, and the older format fla's flame pins) -> the contract.

The trainer runs unchanged; its ``--job.dump_folder`` is the point's ``torchtitan/`` directory.
What it writes, and what becomes of it here:

- Its log on stdout (the harness keeps it as ``trainer.stdout.log``; by hand, a ``*.log`` in the
  dump folder, e.g. ``... | tee outputs/train.log``), one metrics line per logged step:
  ``step: 5  loss:  7.12345  grad_norm:  1.2345  memory:  1.23GiB(0.87%)  tps: 12,345
  tflops: 1.23  mfu: 0.16%`` (0.2.x, 0.3.x; the older format has no ``grad_norm`` there, and flame
  prints ``lr: 3.0000e-04 gnorm:  1.23 [...]`` on the line after). Colour codes are dropped; of
  ranks printing the same step (every rank logs it) the first line is kept. The ``*.log`` files of
  a dump folder are taken in the order they were written: by their lines' first timestamp. A log
  with no timestamped line (stderr kept apart: empty, or a traceback) is no run of its own: its
  lines go to the latest run begun by its file's modification time. One that begins after every
  earlier one ended is a later run (a
  crashed run's log, then its resumed run's): its rows follow the earlier run's in training.csv,
  so a step it logs again supersedes the earlier run's rows of that step and after it, as the
  contract reads a resume in place; step times are never taken across two runs' timestamps, and
  an earlier run's non-finite loss at a step a later run went back before is no ``.HALT``. Logs that
  overlap in time are one run's (ranks' own logs). One stream may hold several runs too: under
  ``torchrun --max-restarts`` the restarted workers print into the same stdout, so a line torchtitan
  prints as a process begins (``Starting job:``, 0.2.x's ``torchtitan version:``, ``Training starts
  at step N``) once a step (or the non-finite loss error) was logged begins another run there, read
  as a later run of the dump folder is; ``Training starts at step N`` says where it went back to,
  and a run that logged no step (it died before its first) undoes the earlier runs' rows from N on
  all the same. Every later run is named in env.json's ``adapter.restarts`` (the step it began at,
  the last the run before it logged, its own last): training.csv shows a restart only where it
  logged a step again.
  The harness's capture of stderr beside stdout, where torchtitan's exception goes, is placed by its
  runs' order where it shows as many runs, else its non-finite loss error is the run's whose attempt
  torchrun's agent, in the same stderr, says it ended (its failure line per attempt, where there are
  as many runs as failed attempts or one more), else the error at step N is the latest run's that
  began at or before N and logged no step from N on (torchtitan raises before it logs the
  step). ``tps`` is per
  device (torchtitan divides by the non-data-parallel degree), so tokens/s here are ``tps`` times
  the world size: the data-parallel degree times the non-data-parallel one.
- TensorBoard events (``--metrics.enable_tensorboard``; ``tb/<time>/events.out.tfevents.*``):
  ``loss_metrics/global_avg_loss`` (float32, finer than the log's 5 decimals), ``lr`` (0.3.x:
  ``lr/<optimizer>``; flame: ``optimizer/lr``), ``grad_norm`` (flame: ``optimizer/grad_norm``), ``throughput(tps)``,
  ``time_metrics/end_to_end(s)``, ``memory/max_active(GiB)``, ``memory/max_reserved(GiB)``. Where
  both say a value the events' is taken; without events, step time comes from the log lines'
  timestamps and lr and allocated memory are ``nan`` (UNMEASURED). A validation
  (``--validation.enable``) between two logged steps is not training time: as torchtitan's tps,
  the later step's time runs from its ``validate step: N`` line over the steps after N.
- 0.3.x's structured logs (``--debug.enable_structured_logging``, on by default; ``structured_logs/*.global_rank_R.*.jsonl``,
  every rank, with pid and host) -> ``heartbeat_rank{R}.jsonl``: a ``step_end`` record says the
  step is done, any other record of a step that it is in progress. Without them rank 0's
  heartbeats are its metrics lines (a run of several ranks then has silent ranks: enable them).
- ``Loss is not finite (global_avg_loss=nan) at step N`` (0.3.x raises it) -> a ``nonfinite``
  ``.HALT`` at step N. ``Training completed`` is printed also after ``Ran out of data``: completion
  is the last logged step against the steps asked, which the harness checks, never that line.
- The flight recorder's dumps (``comm_traces/rank_R``, written by NCCL's watchdog when a
  collective times out) -> ``comm_trace_rank{R}`` in the run directory, named in the report's list
  of the point's files.

Never written by torchtitan, so UNMEASURED: attention backends, fallback counters, the model's
FLOPs per token (its log prints TFLOP/s rounded to 2 decimals, too coarse to divide back).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nsa.contract import CSV_COLUMNS, ENV_JSON, HALT, HALT_NONFINITE, TRAINING_CSV, VERSION, heartbeat_name
from validation.contract.adapters.base import (
    BOOKKEEPING,
    GIVEN,
    Adapter,
    Converted,
    FileOrigin,
    KeyOrigin,
    Origin,
    RunFacts,
    given_commit,
)
from validation.contract.adapters.tfevents import events_where, read_scalars
from validation.contract.check import ADAPTER_READ_NOTHING
from validation.contract.reruns import Restart
from validation.contract.torchrun_log import AgentSeen, attempt_ends

#: where the harness keeps the trainer's stdout, beside the run directory's contract files
HARNESS_STDOUT = ("trainer.stdout.log", "trainer.stderr.log")
COMM_TRACES = "comm_traces"
COMM_TRACE_OUT = "comm_trace_rank{rank}"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_METRICS = re.compile(
    r"(?<!validate )\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)\s+(?:grad_norm:\s*(?P<grad_norm>\S+)\s+)?"
    r"memory:\s*(?P<mem>[-\d.]+)GiB\([^)]*\)\s+tps:\s*(?P<tps>[\d,]+)\s+tflops:\s*\S+\s+mfu:\s*\S+")
_FLAME = re.compile(r"\blr:\s*(?P<lr>\S+)\s+gnorm:\s*(?P<gnorm>\S+)")
#: the line torchtitan prints as a validation ends (``--validation.enable``), after which its clock for
#: the next logged step's tps starts again
_VALIDATED = re.compile(r"\bvalidate step:\s*(?P<step>\d+)\s+loss:")
_NONFINITE = re.compile(r"Loss is not finite \(global_avg_loss=(?P<loss>[^)]*)\) at step (?P<step>\d+)")
#: what torchtitan prints as a process begins, before its first step: its version (0.2.x), ``Starting job:``
#: (the first line of its Trainer) and ``Training starts at step N`` (its checkpoint's step + 1)
_BEGINS = re.compile(r"torchtitan version: |Starting job: |Training starts at step (?P<first>\d+)")
_BATCH = re.compile(r"global batch size (?P<batch>\d+).*?sequence length (?P<seq>\d+)")
_CAPACITY = re.compile(r"capacity: .* with (?P<gib>[\d.]+)GiB memory")
_RANK_FILE = re.compile(r"\.global_rank_(\d+)\.")
_TRACE_FILE = re.compile(r"^(?:.*?)(\d+)$")
#: TensorBoard tags, first found wins: torchtitan 0.3.x's, then the older format's and flame's
_TAGS = {
    "loss": ("loss_metrics/global_avg_loss",),
    "grad_norm": ("grad_norm", "optimizer/grad_norm"),
    "tps": ("throughput(tps)",),
    "step_time_s": ("time_metrics/end_to_end(s)",),
    "mem_alloc_gb": ("memory/max_active(GiB)",),
    "mem_reserved_gb": ("memory/max_reserved(GiB)",),
    "lr": ("lr", "optimizer/lr"),
}


@dataclass
class _Step:
    """One logged step, from the log and the events."""

    step: int
    time: float | None = None
    loss: float = math.nan
    lr: float = math.nan
    tps: float = math.nan
    step_time_s: float = math.nan
    grad_norm: float = math.nan
    mem_alloc_gb: float = math.nan
    mem_reserved_gb: float = math.nan
    validated: tuple[int, float] | None = None
    """(step, time) of the last validation logged since the logged step before this one: this
    step's time runs from its end, as torchtitan's tps does, not from that step's line."""


@dataclass
class _Log:
    """What one run's log says (the harness's capture of its output, or the dump folder's logs
    of one run)."""

    steps: dict[int, _Step] = field(default_factory=dict)
    tokens_per_step: int | None = None
    device_mem_gb: float | None = None
    nonfinite: tuple[int, str, str] | None = None
    """(step, loss as printed, the line) of torchtitan's non-finite loss error: its first."""
    nonfinites: list[tuple[int, str, str]] = field(default_factory=list)
    """Every one, in the order printed (a stream that cannot be lined up with the runs holds one
    a run: ``_place``)."""
    files: list[str] = field(default_factory=list)
    first: int | None = None
    """The step its ``Training starts at step N`` line says it began at (a restart's checkpoint + 1)."""
    start: float = 0.0
    """When it began: its first timestamp, else its file's modification time."""
    end: float = 0.0
    """When it ended: its last timestamp, else its file's modification time."""
    stamped: bool = False
    """Whether a line of it carries torchtitan's timestamp (a log that has none, its stderr kept
    apart, is written beside a run, not one of its own)."""

    def absorb(self, other: _Log) -> None:
        """Another log of the same run (another rank's): the first line of a step is kept."""
        for step, row in other.steps.items():
            self.steps.setdefault(step, row)
        self.tokens_per_step = self.tokens_per_step or other.tokens_per_step
        self.device_mem_gb = self.device_mem_gb or other.device_mem_gb
        self.nonfinite = self.nonfinite or other.nonfinite
        self.nonfinites += other.nonfinites
        self.files += other.files
        self.first = min((s for s in (self.first, other.first) if s is not None), default=None)
        self.start, self.end = min(self.start, other.start), max(self.end, other.end)

    @property
    def began(self) -> int | None:
        """The step it began at: its ``Training starts at step N``, else its first logged step."""
        return min((s for s in (self.first, min(self.steps, default=None)) if s is not None), default=None)


@dataclass
class _Runs:
    """Every run the logs show, oldest first."""

    runs: list[_Log]

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(f for run in self.runs for f in run.files))

    def latest(self, name: str) -> Any:
        """The value of ``name`` the latest run that says it says."""
        return next((getattr(r, name) for r in reversed(self.runs) if getattr(r, name)), None)

    def rows(self) -> list[tuple[int, _Step]]:
        """(run, row) of every logged step, run after run, each run's by step. A run that logged no
        step undoes the earlier runs' rows from the step it began at: it went back there, and no row
        of its own going back shows it to the contract's reader."""
        rows: list[tuple[int, _Step]] = []
        for i, run in enumerate(self.runs):
            if not run.steps and run.began is not None:
                rows = [(j, row) for j, row in rows if row.step < run.began]
            rows += [(i, run.steps[k]) for k in sorted(run.steps)]
        return rows

    def restarts(self) -> list[Restart]:
        """Every run after the first, as the process a restart began (env.json's ``adapter.restarts``)."""
        return [Restart(i + 1, run.began, max(before.steps, default=None), max(run.steps, default=None))
                for i, (before, run) in enumerate(zip(self.runs, self.runs[1:]), start=1)]

    def nonfinite(self) -> tuple[int, str, str] | None:
        """The latest run's non-finite loss error that no later run went back before: a later run that
        began at or before its step went back over it, whether it logged on from there (what it logged
        is what happened) or died before its first step (its rows undone, ``rows``: the run stands
        before that step, and how the later run ended is the run's end)."""
        found = None
        for run in self.runs:
            if found and run.began is not None and run.began <= found[0]:
                found = None
            found = run.nonfinite or found
        return found


class TorchtitanAdapter(Adapter):
    name = "torchtitan"
    converts = True
    lacks = frozenset({"attention_backends", "fallbacks", "model_flops_per_token"})

    def in_format(self, trainer_dir: Path) -> bool:
        return bool(_log_files(trainer_dir, None)) or any(trainer_dir.rglob("events.out.tfevents.*"))

    def trainer_dir(self, out_dir: Path) -> Path:
        return out_dir / "torchtitan"

    def progress_csv(self, trainer_dir: Path) -> Path:
        """Its stdout, which the harness keeps beside the dump folder while it runs."""
        return trainer_dir.parent / HARNESS_STDOUT[0]

    def progress(self, line: str, world_size: int = 1) -> tuple[int, float | None] | None:
        """The metrics line's step and its ``tps`` times the world size (``tps`` is per device), the
        tokens/s training.csv and the report hold."""
        m = _METRICS.search(_ANSI.sub("", line))
        return (int(m["step"]), _number(m["tps"]) * world_size) if m else None

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> Converted:
        out_dir.mkdir(parents=True, exist_ok=True)
        log = _read_runs(trainer_dir, out_dir)
        events = _events(trainer_dir)
        steps = _merge(log.rows(), events)
        beats, ranks_seen = _structured_heartbeats(trainer_dir)
        world = max(facts.world_size, max(ranks_seen, default=-1) + 1)
        structured = sorted(str(p.relative_to(trainer_dir)) for p in _structured_files(trainer_dir))
        # a folder with none of torchtitan's files gets no training.csv or heartbeats: the contract
        # check then says what was looked for, not 'header only'
        found = bool(log.files or events or structured)
        read_from = _read_from(log, events, trainer_dir)
        files = _write_steps(out_dir, steps, beats, world, read_from) if found else {}
        traces = _comm_traces(trainer_dir, out_dir)
        files.update(traces)
        read: dict[str, Any] = (
            {"log": log.files, "tensorboard": sorted(str(p.relative_to(trainer_dir)) for p in events),
             "structured_logs": structured, "comm_traces": list(traces)} if found else
            {ADAPTER_READ_NOTHING: "no torchtitan log (its stdout, or *.log files), TensorBoard events or structured "
                                   "logs in the folder"})
        env: dict[str, Any] = {"contract_version": VERSION, "world_size": world, "trainer": facts.trainer,
                               **given_commit(facts), "adapter": {"name": self.name, "read": read}}
        if restarts := log.restarts():
            env["adapter"]["restarts"] = [dataclasses.asdict(r) for r in restarts]
        if tokens_per_step := log.latest("tokens_per_step"):
            env["tokens_per_step"] = tokens_per_step
        if device_mem_gb := log.latest("device_mem_gb"):
            env["device_mem_gb"] = device_mem_gb
        _atomic(out_dir / ENV_JSON, json.dumps(env, indent=2))
        files[ENV_JSON] = FileOrigin(Origin.DERIVED, f"from {_logs(log) + ' and ' if log.files else ''}what the "
                                                     "harness gave it (torchtitan writes no env.json)")
        if nonfinite := log.nonfinite():
            step, loss, line = nonfinite
            halt: dict[str, Any] = {"source": HALT_NONFINITE, "step": step, "text": line}
            if world == 1:  # torchtitan prints the global loss: a rank's own only when there is one
                halt["losses"] = [loss]
            _atomic(out_dir / HALT, json.dumps(halt))
            files[HALT] = FileOrigin(Origin.DERIVED, f"from {_logs(log)}: its 'Loss is not finite ... at step {step}' "
                                                     "line")
        return Converted(_env_origins(log, world > facts.world_size), files)


def _write_steps(out_dir: Path, steps: list[_Step], beats: dict[int, list[dict[str, Any]]], world: int,
                 read_from: str) -> dict[str, FileOrigin]:
    """training.csv of ``steps``, read from ``read_from``, and each rank's heartbeats: its structured
    logs' ``beats``, else rank 0's of the steps; by their names, where each came from."""
    _write_csv(out_dir / TRAINING_CSV, steps, world)
    files = {TRAINING_CSV: FileOrigin(Origin.DERIVED, f"from {read_from}") if read_from else
             FileOrigin(Origin.FILLED, "(its header alone: no log or TensorBoard events)")}
    beats_from = FileOrigin(Origin.DERIVED, "from its structured logs (structured_logs/): a record a step's span")
    if not beats:
        beats = {0: [{"time": s.time, "step": s.step, "rank": 0, "stage": "step"} for s in steps if s.time]}
        beats_from = FileOrigin(Origin.DERIVED, f"from the steps of {read_from}: rank 0's alone, a record a logged "
                                                "step, as the folder holds no structured logs, which every rank writes")
    for rank, recs in beats.items():
        _atomic(out_dir / heartbeat_name(rank), "".join(json.dumps(r) + "\n" for r in recs))
        files[heartbeat_name(rank)] = beats_from
    return files


def _logs(log: _Runs) -> str:
    """torchtitan's log as an origin names it: "torchtitan's log (train.log)"."""
    return f"torchtitan's log ({', '.join(log.files)})"


def _read_from(log: _Runs, events: list[Path], trainer_dir: Path) -> str:
    """What the steps of training.csv were read from: "torchtitan's log (train.log) and its
    TensorBoard events under tb/"."""
    read = [_logs(log)] if log.files else []
    if events:
        read.append(events_where(events, trainer_dir))
    return " and ".join(read)


def _env_origins(log: _Runs, ranks_beyond_launch: bool) -> dict[str, KeyOrigin]:
    """Where each key of the env.json ``convert`` writes came from: torchtitan writes no env.json,
    so none is the trainer's as written; ``ranks_beyond_launch``: its structured logs show more
    ranks than the harness gave it, and the world size is theirs."""
    logs = _logs(log)
    origins = {**GIVEN, **BOOKKEEPING,
               "contract_version": KeyOrigin(Origin.FILLED, "(the contract version it converts to; torchtitan "
                                                            "names none)"),
               "tokens_per_step": KeyOrigin(Origin.DERIVED, f"from {logs}: its 'global batch size G ... sequence "
                                                            "length S' line, G x S"),
               "device_mem_gb": KeyOrigin(Origin.DERIVED, f"from {logs}: its 'CUDA capacity: ... with M GiB "
                                                          "memory' line"),
               "adapter.restarts": KeyOrigin(Origin.DERIVED, f"from {logs}: the lines torchtitan prints as a "
                                                             "process begins, after a step was logged")}
    if ranks_beyond_launch:
        origins["world_size"] = KeyOrigin(Origin.DERIVED, "from the ranks of structured_logs/*.global_rank_R.*.jsonl")
    return origins


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _number(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def _log_files(trainer_dir: Path, out_dir: Path | None) -> list[Path]:
    """The harness's capture of the trainer's output where it ran it, else the ``*.log`` files
    kept in the dump folder."""
    return _harness_capture(out_dir) or (sorted(trainer_dir.glob("*.log")) if trainer_dir.is_dir() else [])


def _harness_capture(out_dir: Path | None) -> list[Path]:
    kept = [out_dir / n for n in HARNESS_STDOUT] if out_dir is not None else []
    return [p for p in kept if p.is_file()]


def _read_runs(trainer_dir: Path, out_dir: Path) -> _Runs:
    """The runs of the harness's capture (its stdout and stderr), or of a dump folder's logs: each
    log's runs (a restart prints into the same stream), in the order they were written, one run
    each unless they overlap in time (module docstring)."""
    if capture := _harness_capture(out_dir):
        return _Runs(_read_capture(capture))
    runs: list[_Log] = []
    logs = [log for p in _log_files(trainer_dir, None) for log in _read_log(p)]
    for log in sorted((g for g in logs if g.stamped), key=lambda g: (g.start, g.files)):
        if runs and log.start < runs[-1].end:
            runs[-1].absorb(log)
        else:
            runs.append(log)
    # a log with no timestamped line (stderr kept apart: empty, a traceback) is dated only by its
    # file, written as its run ended: it goes to the latest run begun by then, as no run of its own
    for log in (g for g in logs if not g.stamped):
        if not runs:
            runs.append(log)
            continue
        run = max((r for r in runs if r.start <= log.end), key=lambda r: r.start, default=runs[0])
        start, end = run.start, run.end
        run.absorb(log)
        run.start, run.end = start, end
    return _Runs(runs)


def _read_capture(paths: list[Path]) -> list[_Log]:
    """The runs of the harness's capture: those of the stream that shows the most (stdout, where
    torchtitan logs), the other's (stderr) beside them run for run where it shows as many, else
    placed by their steps (``_place``), its non-finite loss errors by torchrun's attempts where its
    agent's lines in that stream show one attempt a run (``_by_attempt``)."""
    streams = [(p, _read_log(p)) for p in paths]
    runs = max((logs for _, logs in streams), key=len)
    for path, other in streams:
        if other is runs:
            continue
        if len(other) == len(runs):
            for run, log in zip(runs, other):
                run.absorb(log)
        else:
            attempts = _by_attempt(path, runs)
            for log in other:
                _place(runs, log, attempts)
    return runs


def _by_attempt(path: Path, runs: list[_Log]) -> dict[int, _Log]:
    """Per step of a non-finite loss error, the run whose error it was, by torchrun's agent's line
    per failed attempt in the log at ``path`` (``attempt_ends``: the error the failed worker printed
    in that attempt is that attempt's), the attempts lined up with the runs where there are as many
    runs as failed attempts or one more (an attempt after the last failure); empty where there are
    not. Steps alone cannot tell whose an error is where a later run began before its step and
    logged nothing: it may have died at its first step, or run to the error without logging."""
    # the harness's capture of one torchrun agent (a launch of several nodes logs each node's apart):
    # its workers' local ranks are their global ones
    ends = attempt_ends(path, AgentSeen(first_rank=0))
    if not ends or len(runs) not in (len(ends), len(ends) + 1):
        return {}
    return {int(m["step"]): runs[a.attempt - 1] for a in ends
            if a.exception and (m := _NONFINITE.search(a.exception))}


def _place(runs: list[_Log], log: _Log, attempts: dict[int, _Log]) -> None:
    """What a stream whose lines cannot be lined up with the runs says (stderr beside stdout): a
    step goes to the latest run that began at or before it (unless that run logged it), each
    non-finite loss error to the run whose attempt torchrun's agent says it ended (``attempts``,
    by the error's step), else to the run that was at its step when it ended (``_ended_at``), the
    rest to the first run where that run says nothing of it."""
    for step, row in log.steps.items():
        began = [r for r in runs if r.began is not None and r.began <= step] or runs[:1]
        began[-1].steps.setdefault(step, row)
    for error in log.nonfinites:
        run = attempts.get(error[0]) or _ended_at(runs, error[0])
        run.nonfinite = run.nonfinite or error
        run.nonfinites.append(error)
    runs[0].tokens_per_step = runs[0].tokens_per_step or log.tokens_per_step
    runs[0].device_mem_gb = runs[0].device_mem_gb or log.device_mem_gb
    runs[0].files += log.files


def _ended_at(runs: list[_Log], step: int) -> _Log:
    """The run whose end a non-finite loss error at ``step`` was: torchtitan raises it before it logs
    the step, so the latest run that began at or before it and logged no step from it on (where none
    did, the latest that began at or before it; where none began by it, the last)."""
    began = [r for r in runs if r.began is not None and r.began <= step]
    ended = [r for r in began if all(s < step for s in r.steps)]
    return (ended or began or runs)[-1]


def _read_log(path: Path) -> list[_Log]:
    """One log's runs, oldest first: a line torchtitan prints as a process begins (``_BEGINS``)
    after a run's step or its non-finite loss error was logged begins another (a restart under
    torchrun's --max-restarts prints into the same stream); several ranks' such lines all come
    before any rank's first step, which waits for every rank."""
    runs = [_Log(files=[path.name])]
    times: list[list[float]] = [[]]
    last: _Step | None = None
    validated: tuple[int, float] | None = None  # the last validation since the last logged step
    for raw in path.read_text(errors="replace").splitlines():
        line = _ANSI.sub("", raw)
        log = runs[-1]
        if begins := _BEGINS.search(line):
            if log.steps or log.nonfinite:
                log = _Log(files=[path.name])
                runs.append(log)
                times.append([])
                last = validated = None
            if begins["first"]:
                log.first = min(int(begins["first"]), log.first or int(begins["first"]))
        if m := _METRICS.search(line):
            step = int(m["step"])
            if step in log.steps:  # another rank's line of the same step
                last = None
                continue
            last = log.steps[step] = _Step(
                step, _stamp(line),
                loss=_number(m["loss"]), grad_norm=_number(m["grad_norm"]), tps=_number(m["tps"]),
                mem_reserved_gb=_number(m["mem"]), validated=validated)
            validated = None
        elif (m := _VALIDATED.search(line)) and (t := _stamp(line)) is not None:
            if validated is None or validated[0] != int(m["step"]):  # the first rank's line of it
                validated = int(m["step"]), t
        elif (m := _FLAME.search(line)) and last is not None:
            last.lr, last.grad_norm = _number(m["lr"]), _number(m["gnorm"])
            last = None
        elif m := _NONFINITE.search(line):
            log.nonfinites.append((int(m["step"]), m["loss"].strip(), line.strip()))
            log.nonfinite = log.nonfinite or log.nonfinites[-1]
        elif m := _BATCH.search(line):
            log.tokens_per_step = int(m["batch"]) * int(m["seq"])
        elif m := _CAPACITY.search(line):
            log.device_mem_gb = float(m["gib"])
        if (t := _stamp(line)) is not None:
            times[-1].append(t)
    written = path.stat().st_mtime
    for log, stamps in zip(runs, times):
        log.start, log.end = (min(stamps), max(stamps)) if stamps else (written, written)
        log.stamped = bool(stamps)
    return runs


def _stamp(line: str) -> float | None:
    t = _TIME.search(line)
    return datetime.strptime(t[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if t else None


def _events(trainer_dir: Path) -> list[Path]:
    """Rank 0's event files (all of them when ranks are not told apart), oldest first."""
    files = sorted(trainer_dir.rglob("events.out.tfevents.*")) if trainer_dir.is_dir() else []
    ranked = [p for p in files if any(part.startswith("rank_") for part in p.parts)]
    if ranked:
        files = [p for p in files if p not in ranked or "rank_0" in p.parts]
    return files


def _merge(logged: list[tuple[int, _Step]], events: list[Path]) -> list[_Step]:
    """The rows of training.csv, run after run: the logged ones with the events' values, which go
    to a step's latest row (an events file's run is the latest run that logged the step), and a row
    for each step only the events show, in the latest run that began at or before it."""
    rows = list(logged)
    steps = {row.step: row for _, row in rows}
    firsts = sorted({run: row.step for run, row in reversed(rows)}.items())
    lr_tag: str | None = None
    for path in events:
        for s in read_scalars(path):
            row = steps.get(s.step)
            if row is None:
                row = steps[s.step] = _Step(s.step)
                rows.append((max((run for run, first in firsts if first <= s.step), default=0), row))
            if row.time is None:
                row.time = s.wall_time
            for name, tags in _TAGS.items():
                if s.tag in tags:
                    setattr(row, name, s.value)
            if s.tag.startswith("lr/") and (lr_tag is None or s.tag == lr_tag):
                lr_tag, row.lr = s.tag, s.value  # the first optimizer's learning rate
    ordered = sorted(((run, row) for run, row in rows if row.step > 0), key=lambda r: (r[0], r[1].step))
    prev: tuple[int, _Step] | None = None
    for run, row in ordered:
        # the interval to the row before in the same run only: across runs it holds the time between them;
        # after a validation, from its end over the steps since it (its time is not training's)
        if math.isnan(row.step_time_s) and prev is not None and prev[0] == run and row.time and prev[1].time:
            since_step, since = prev[1].step, prev[1].time
            if row.validated is not None and since_step <= row.validated[0] < row.step and row.validated[1] >= since:
                since_step, since = row.validated
            row.step_time_s = max(row.time - since, 0.0) / (row.step - since_step)
        prev = run, row
    return [row for _, row in ordered]


def _write_csv(path: Path, steps: list[_Step], world: int) -> None:
    lines = [",".join(CSV_COLUMNS)]
    for s in steps:
        values = [s.loss, s.lr, s.tps * world, s.step_time_s, s.grad_norm, s.mem_alloc_gb, s.mem_reserved_gb]
        lines.append(",".join([str(s.step), *(repr(float(v)) for v in values)]))
    _atomic(path, "\n".join(lines) + "\n")


def _structured_files(trainer_dir: Path) -> list[Path]:
    folder = trainer_dir / "structured_logs"
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def _stage(name: str) -> str:
    """A structured record's span -> the contract's stage: ``step_end`` is a step done."""
    if name == "step_end":
        return "step"
    first = name.split("_")[0]  # fwd_bwd_start: the forward and backward of a step, begun
    return {"fwd": "forward", "forward": "forward", "bwd": "backward", "backward": "backward",
            "optimizer": "optimizer", "optim": "optimizer"}.get(first, "data")


def _structured_heartbeats(trainer_dir: Path) -> tuple[dict[int, list[dict[str, Any]]], set[int]]:
    beats: dict[int, list[dict[str, Any]]] = {}
    for path in _structured_files(trainer_dir):
        m = _RANK_FILE.search(path.name)
        if not m:
            continue
        rank = int(m.group(1))
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line of a killed writer
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or rec["step"] < 1:
                continue
            beats.setdefault(rank, []).append({
                "time": rec.get("time_ms", 0) / 1000 if rec.get("time_ms") else rec.get("time"),
                "step": rec["step"], "rank": rank, "pid": rec.get("pid"), "host": rec.get("host_name"),
                "stage": _stage(str(rec.get("log_type_name") or "")), "event": rec.get("log_type_name")})
    return beats, set(beats)


def _comm_traces(trainer_dir: Path, out_dir: Path) -> dict[str, FileOrigin]:
    """The flight recorder's dumps, copied into the run directory by rank: by their names there,
    each the trainer's own (copied unchanged)."""
    folder = trainer_dir / COMM_TRACES
    names = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _TRACE_FILE.match(path.name)
        if path.is_file() and path.stat().st_size and m:
            name = COMM_TRACE_OUT.format(rank=int(m.group(1)))
            shutil.copyfile(path, out_dir / name)
            names[name] = FileOrigin(Origin.TRAINER, f"(copied from {COMM_TRACES}/{path.name})")
    return names
