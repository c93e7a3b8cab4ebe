"""The Hugging Face ``Trainer`` (transformers) -> the contract, from what it writes unchanged.

What a ``Trainer`` leaves in its ``output_dir``, and what becomes of it here:

- ``trainer_state.json`` (``trainer.save_state()`` at the end; each ``checkpoint-N/`` holds one):
  ``log_history``, one entry per logged step (``loss``, ``learning_rate``, ``grad_norm``,
  ``step``) and, once ``train()`` returns, a summary (``train_runtime``, ``step``) -> the rows of
  training.csv. The newest state is read: the output folder's own, else the latest checkpoint's.
  One that cannot be read (cut off mid-write) gives no rows and is named in env.json's
  ``adapter.unreadable``, never in ``adapter.read``.
- TensorBoard events (``report_to tensorboard``: ``runs/<date>_<host>/events.out.tfevents.*``,
  written by rank 0 and flushed at every log): ``train/loss``, ``train/learning_rate``,
  ``train/grad_norm`` per logged step, each with its wall time -> the rows of steps that no saved
  state holds (a run killed after its last checkpoint), and every row's step time: the time
  between two logged steps over the steps between them (the first from the writer's first
  record, written as training begins). They also tell the steps this run trained (env.json's
  ``adapter.trained``): a ``Trainer`` resumed from a checkpoint keeps the checkpoint's
  ``log_history`` in its state, and those steps, before its events' first, are the earlier
  run's: they are left out of training.csv, and a run resumed after step N whose events hold a
  step up to N trained it again (judge/resume.py ``Breach``).
- The evaluations of ``eval_strategy`` run between two training steps, after the step they follow
  is logged: each one's ``eval_runtime`` (``eval/runtime`` in the events; one a dataset where
  ``eval_dataset`` is a dict) is taken out of the step time of the logged step after it, which is
  the training's time, not the evaluation's (env.json's ``adapter.evaluations`` says which).
- tokens/s: the runbook's tokens per step (``trainer.tokens_per_step``) over that step time;
  without either it is UNMEASURED, never estimated from the run's average. A step the saved state
  logs and no event holds has no time, nor has the logged step after it: their step time and
  tokens/s are nan, and env.json's ``adapter.unmeasured`` names those steps (evidence missing, the
  metrics reading the columns UNMEASURED, not a malformed training.csv).
- ``env.json``: world size from the launch, the trainer's commit, tokens per step where known,
  and ``adapter``: which file gave which column, and the columns nothing gave.

A ``Trainer`` writes no heartbeats, memory, attention backends, stack dumps or .HALT: their
metrics are UNMEASURED (a non-finite loss is in its logs, which the loss gate reads). By default
(``logging_nan_inf_filter``) it logs a non-finite step's loss as the mean of the finite ones in
its logging window, 0 where the window is that step alone, while the step's gradient norm stays
as it was: a step logged with loss 0 and a non-finite gradient norm is read as a non-finite loss
(with a wider window the filtered loss cannot be told apart, hence the guide's
``--logging_nan_inf_filter false``). The run's
last step is the last logged one: "done" only when it equals the steps asked, whatever the exit
code (a ``Trainer`` whose batches are not dispatched from rank 0 ends with 0 when its data runs
dry before ``max_steps``). While it runs, the
stall watch reads progress from the same files growing: a new step in the events, a new
checkpoint, a saved state (``live_steps``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from nsa.contract import CSV_COLUMNS, ENV_JSON, HALT, TRAINING_CSV
from validation.contract.adapters.base import (
    BOOKKEEPING,
    GIVEN,
    Adapter,
    Converted,
    FileOrigin,
    Origin,
    RunFacts,
    given_commit,
)
from validation.contract.adapters.tfevents import _fields, events_where, read_scalars
from validation.contract.check import ADAPTER_READ_NOTHING, HEARTBEATS, TrainedSteps

STATE = "trainer_state.json"
EVENTS = "events.out.tfevents.*"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: log_history keys and TensorBoard tags -> training.csv columns
_LOGGED = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}
_TAGS = {f"train/{k}": col for k, col in _LOGGED.items()}
#: an evaluation's seconds: ``eval_runtime`` in log_history, ``eval/runtime`` in the events, with the
#: dataset's name inside where ``eval_dataset`` is a dict (``eval_<name>_runtime``, ``eval/<name>_runtime``)
_EVAL_KEY = re.compile(r"^eval_(.+_)?runtime$")
_EVAL_TAG = re.compile(r"^eval/(.+_)?runtime$")


@dataclass
class _Row:
    step: int
    values: dict[str, float] = field(default_factory=dict)
    wall: float | None = None
    """When rank 0 logged the step (its TensorBoard record), Unix seconds."""


class HfTrainerAdapter(Adapter):
    name = "hf_trainer"
    converts = True
    takes_tokens_per_step = True
    lacks = frozenset({"mem_alloc_gb", "mem_reserved_gb", "attention_backends", "fallbacks",
                       "model_flops_per_token", "data_position", "device_mem_gb"})

    def in_format(self, trainer_dir: Path) -> bool:
        return (trainer_dir / STATE).is_file() or any(_checkpoints(trainer_dir)) or any(trainer_dir.rglob(EVENTS))

    def trainer_dir(self, out_dir: Path) -> Path:
        return out_dir / "trainer_out"

    def live_steps(self, trainer_dir: Path) -> Callable[[], int | None]:
        return _LiveSteps(trainer_dir)

    def convert(self, trainer_dir: Path, out_dir: Path, facts: RunFacts) -> Converted:
        out_dir.mkdir(parents=True, exist_ok=True)
        read: dict[str, str] = {}
        state_path = _newest_state(trainer_dir)
        state_read: Path | None = None
        rows: dict[int, _Row] = {}
        summary_step = None
        unreadable: dict[str, str] = {}
        evaluations: dict[int, float] = {}  # seconds of evaluation after each step, as log_history says
        event_evaluations: dict[int, float] = {}  # the same from the events, for steps no readable state holds
        if state_path is not None:
            history, summary_step, evaluations, why = _log_history(state_path)
            for step, values in history.items():
                rows.setdefault(step, _Row(step)).values.update(values)
            shown = str(state_path.relative_to(trainer_dir))
            if why is None:
                read[shown] = "log_history: loss, lr, grad_norm per logged step"
                state_read = state_path
            else:  # said, never listed as read: the rows are then the events' alone, with no summary step
                unreadable[shown] = f"{why}: no log_history read from it"
        events = sorted(trainer_dir.rglob(EVENTS), key=lambda p: p.stat().st_mtime)
        start = None
        trained: set[int] = set()
        for path in events:
            first = _first_wall(path)
            start = first if start is None else min(start, first or start)
            for s in read_scalars(path):
                if _EVAL_TAG.match(s.tag):
                    event_evaluations[s.step] = event_evaluations.get(s.step, 0.0) + s.value
                    continue
                col = _TAGS.get(s.tag)
                if col is None:
                    continue
                row = rows.setdefault(s.step, _Row(s.step))
                row.values.setdefault(col, s.value)  # a saved state's float64 over the event's float32
                if col == "loss":
                    row.wall = s.wall_time
                    trained.add(s.step)
            read[str(path.relative_to(trainer_dir))] = ("TensorBoard events: loss, lr, grad_norm and each logged "
                                                        "step's wall time, for step_time_s and toks_per_s")
        if unreadable and events:
            unreadable = {f: f"{why}; the rows are the TensorBoard events' alone" for f, why in unreadable.items()}
        logged = [rows[s] for s in sorted(rows) if "loss" in rows[s].values]
        # a Trainer resumed from a checkpoint carries the checkpoint's log_history on in its state, while
        # its events (opened as its training begins) hold only the steps it trained: the rows before
        # their first step are the earlier run's, not this one's (the contract's training.csv, as a
        # native trainer resumed into a new folder writes it, holds the steps its run trained)
        inherited = [row for row in logged if trained and row.step < min(trained)]
        logged = logged[len(inherited):]
        filtered = []
        for row in logged:
            if _filtered_nonfinite(row.values):
                row.values["loss"] = math.nan
                filtered.append(row.step)
        evaluations = event_evaluations | evaluations
        began = inherited[-1].step if inherited else 0
        times, took_out = _step_times(logged, start, began, evaluations)
        per_step = facts.tokens_per_step
        unmeasured = {"mem_alloc_gb": "a Trainer logs no memory", "mem_reserved_gb": "a Trainer logs no memory",
                      HEARTBEATS: "a Trainer writes no per-rank records", HALT: "a Trainer writes no .HALT"}
        if not events:
            unmeasured["step_time_s"] = "no TensorBoard events (report_to tensorboard): no time per logged step"
        elif untimed := _untimed(logged, times):
            # a logged step the events do not time is evidence missing, not a broken file: its rate
            # is nan in training.csv, and the metrics reading it UNMEASURED (contract/check.py)
            unmeasured["step_time_s"] = untimed
        if per_step is None:
            unmeasured["toks_per_s"] = "the runbook gives no trainer.tokens_per_step for this point"
        elif "step_time_s" in unmeasured:
            unmeasured["toks_per_s"] = unmeasured["step_time_s"]
        if "grad_norm" not in {c for r in logged for c in r.values}:
            unmeasured["grad_norm"] = "no grad_norm in the Trainer's logs"
        lines = [",".join(CSV_COLUMNS)]
        for row in logged:
            t = times.get(row.step, math.nan)
            rate = per_step / t if per_step and t > 0 else math.nan
            cells = {"step": row.step, **row.values, "toks_per_s": rate, "step_time_s": t}
            lines.append(",".join(_cell(cells.get(c, math.nan)) for c in CSV_COLUMNS))
        files: dict[str, FileOrigin] = {}
        if logged or state_path is not None or events:
            _atomic(out_dir / TRAINING_CSV, "\n".join(lines) + "\n")
            files[TRAINING_CSV] = _csv_origin(state_read, events, trainer_dir)
        env: dict[str, Any] = {
            "world_size": facts.world_size, "trainer": facts.trainer, **given_commit(facts),
            "adapter": {"name": self.name,
                        "read": read or {ADAPTER_READ_NOTHING: "no trainer_state.json, checkpoint or TensorBoard "
                                                               "events in the output folder"},
                        "unmeasured": unmeasured, "summary_step": summary_step,
                        **({"unreadable": unreadable} if unreadable else {}),
                        **({"trained": dataclasses.asdict(TrainedSteps(
                            min(trained), max(trained), "its TensorBoard events",
                            tuple(_shown(p, out_dir) for p in events)))} if trained else {}),
                        **({"inherited": f"steps {inherited[0].step}-{inherited[-1].step} of {state_path.name}'s "
                                         "log_history, before the events' first step: the run it resumed from "
                                         "logged them, left out of training.csv"} if inherited else {}),
                        **({"evaluations": _evaluations_note(took_out, evaluations)} if took_out else {}),
                        **({"filtered_nonfinite_loss": f"steps {', '.join(map(str, filtered))}: logged with loss 0 "
                                                       "and a non-finite grad_norm (the Trainer's "
                                                       "logging_nan_inf_filter), read as a non-finite loss"}
                           if filtered else {}),
                        "world_size": "the processes the harness launched"},
        }
        if per_step is not None:
            env["tokens_per_step"] = per_step
        _atomic(out_dir / ENV_JSON, json.dumps(env, indent=2, allow_nan=False))
        # a Trainer writes no env.json: every key is the harness's or this adapter's
        files[ENV_JSON] = FileOrigin(Origin.DERIVED, "from what the harness gave it and what it read (a Trainer "
                                                     "writes no env.json)")
        return Converted({**GIVEN, **BOOKKEEPING}, files)


def _csv_origin(state: Path | None, events: list[Path], trainer_dir: Path) -> FileOrigin:
    """Where the training.csv it wrote came from: ``state``, the saved state it read (None: none,
    or one it could not read), and the TensorBoard events; only its header where neither gave a row."""
    read = [f"{state.relative_to(trainer_dir)}'s log_history"] if state is not None else []
    if events:
        read.append(events_where(events, trainer_dir))
    if not read:  # a state cut off mid-write, and no events
        return FileOrigin(Origin.FILLED, "(its header alone: the Trainer's files gave no row)")
    return FileOrigin(Origin.DERIVED, "from " + " and ".join(read))


def _cell(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return repr(v) if isinstance(v, float) else str(v)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _checkpoints(trainer_dir: Path) -> list[tuple[int, Path]]:
    if not trainer_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in trainer_dir.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())


def _newest_state(trainer_dir: Path) -> Path | None:
    """The output folder's own trainer_state.json (written last, by save_state), else the latest
    checkpoint's."""
    own = trainer_dir / STATE
    if own.is_file():
        return own
    for _, ckpt in reversed(_checkpoints(trainer_dir)):
        if (ckpt / STATE).is_file():
            return ckpt / STATE
    return None


def _filtered_nonfinite(values: dict[str, float]) -> bool:
    """Whether a logged step's loss is the Trainer's non-finite filter's 0 (see the module
    docstring): loss exactly 0 beside a non-finite gradient norm."""
    grad = values.get("grad_norm")
    return values.get("loss") == 0.0 and grad is not None and not math.isfinite(grad)


def _log_history(path: Path) -> tuple[dict[int, dict[str, float]], int | None, dict[int, float], str | None]:
    """Per logged step its loss, lr and grad norm; the step of the summary ``train()`` logs as it
    returns (None: it did not return); the seconds of evaluation after each step that had one; and
    why the file could not be read ('cut off or not JSON (...)'), None where it could. An
    unreadable file gives nothing: its rows are then the events' alone, or missing for the contract
    check to name."""
    try:
        state = json.loads(path.read_text(errors="replace"))  # NaN/Infinity as Python's json writes them
    except json.JSONDecodeError as e:
        return {}, None, {}, f"cut off or not JSON ({e})"
    except OSError as e:
        return {}, None, {}, f"unreadable ({e.strerror or e})"
    history = state.get("log_history", []) if isinstance(state, dict) else None
    if not isinstance(history, list):
        return {}, None, {}, "not a Trainer's state (no log_history list)"
    out: dict[int, dict[str, float]] = {}
    evaluations: dict[int, float] = {}
    summary = None
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(step := entry.get("step"), int):
            continue
        if "train_runtime" in entry:
            summary = step
        for k, v in entry.items():
            if _EVAL_KEY.match(k) and isinstance(v, (int, float)):
                evaluations[step] = evaluations.get(step, 0.0) + float(v)
        values = {col: float(entry[k]) for k, col in _LOGGED.items() if isinstance(entry.get(k), (int, float))}
        if "loss" in values:
            out[step] = values
    return out, summary, evaluations, None


def _first_wall(path: Path) -> float | None:
    """The wall time of an event file's first record (the writer's file_version event: the
    ``Trainer`` opens it as training begins)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
            if len(head) < 12:
                return None
            (length,) = struct.unpack_from("<Q", head)
            payload = fh.read(length)
        for number, wire, value in _fields(payload):
            if number == 1 and wire == 1:
                return struct.unpack("<d", value)[0]
    except (OSError, IndexError, struct.error):
        return None
    return None


def _shown(path: Path, out_dir: Path) -> str:
    """An event file as a finding names it: from the run directory where it lies in it."""
    return str(path.relative_to(out_dir) if path.is_relative_to(out_dir) else path)


def _step_times(rows: list[_Row], start: float | None, began: int,
                evaluations: dict[int, float]) -> tuple[dict[int, float], dict[int, list[int]]]:
    """Seconds per step of each logged step with a wall time: from the logged step before it (the
    first from the events' first record, at ``began``: 0, or the last step logged of the run it
    resumed from), over the steps between them, less the evaluations run in that time: those after
    a step from the one before it (logged before its evaluation began) to the one before this. For
    the first, an evaluation at step 0 (``eval_on_start``) is this run's, one at a ``began`` the
    run resumed from ran in the earlier process. Also, per logged step, the steps whose evaluations
    its time left out."""
    out: dict[int, float] = {}
    took_out: dict[int, list[int]] = {}
    prev_step, prev_wall, from_prev = began, start, began == 0
    for row in rows:
        if row.wall is None:
            prev_wall, from_prev = None, True
            continue
        if prev_wall is not None and row.step > prev_step:
            during = [s for s in sorted(evaluations) if (prev_step <= s if from_prev else prev_step < s) and s < row.step]
            span = row.wall - prev_wall
            evaluated = sum(evaluations[s] for s in during)
            if during and 0 < evaluated < span:  # a longer evaluation than the span is not this span's
                span -= evaluated
                took_out[row.step] = during
            out[row.step] = span / (row.step - prev_step)
        prev_step, prev_wall, from_prev = row.step, row.wall, True
    return out, took_out


def _evaluations_note(took_out: dict[int, list[int]], evaluations: dict[int, float]) -> str:
    """env.json's ``adapter.evaluations``: 'the evaluation after step 4 (2.15 s) left out of step 5's
    time; ...'."""
    parts = []
    for step, during in took_out.items():
        what = ", ".join(f"step {s} ({evaluations[s]:.3g} s)" for s in during)
        parts.append(f"the evaluation{'s' if len(during) > 1 else ''} after {what} left out of step {step}'s time")
    return ("; ".join(parts) + " (the Trainer's eval_runtime: training steps are timed without the evaluations "
            "between them)")


def _untimed(rows: list[_Row], times: dict[int, float]) -> str | None:
    """'no time for steps 5, 6 of 12 logged: no TensorBoard event of step 5, ...': the logged steps
    that ``_step_times`` could not time, where a step the saved state logs has no event; None where
    every logged step has an event."""
    eventless = [row.step for row in rows if row.wall is None]
    if not eventless:
        return None
    untimed = [row.step for row in rows if row.step not in times]
    return (f"no time for step{'s' if len(untimed) > 1 else ''} {', '.join(map(str, untimed))} of {len(rows)} "
            f"logged: no TensorBoard event of step{'s' if len(eventless) > 1 else ''} "
            f"{', '.join(map(str, eventless))}, which {STATE}'s log_history logs (a step's time runs from the "
            "logged step before it)")


class _LiveSteps:
    """The highest step the output folder shows while the ``Trainer`` runs: its events' latest
    logged step, its latest checkpoint, a saved state's ``global_step``. An event file is read
    again only when it grew."""

    def __init__(self, trainer_dir: Path):
        self.trainer_dir = trainer_dir
        self._seen: dict[Path, tuple[int, int | None]] = {}

    def __call__(self) -> int | None:
        if not self.trainer_dir.is_dir():
            return None
        steps = [n for n, _ in _checkpoints(self.trainer_dir)]
        for path in self.trainer_dir.rglob(EVENTS):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if path not in self._seen or self._seen[path][0] != size:
                top = max((s.step for s in read_scalars(path) if s.tag in _TAGS), default=None)
                self._seen[path] = (size, top)
            if self._seen[path][1] is not None:
                steps.append(self._seen[path][1])
        state = self.trainer_dir / STATE
        if state.is_file():
            try:
                step = json.loads(state.read_text(errors="replace")).get("global_step")
            except (json.JSONDecodeError, OSError, AttributeError):
                step = None
            if isinstance(step, int):
                steps.append(step)
        return max(steps, default=None)
