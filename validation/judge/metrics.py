"""The metric catalogue: every number a gate, a report table or a finding reads, as one table of
typed ``Metric`` entries (name, meaning, the contract fields it reads, whether it honours a
gate's window), read by the runbook loader (which names a gate may use), the verdict (what a
trainer's files cannot provide), the report and the docs.

A metric returns None when it cannot be computed, which a gate reports as NO_DATA, never a number
made up. A windowed metric ('last 50 steps') is None when the run did not cover its window: four
steps are no 'last 10 steps'. A metric that reads an optional field the trainer's files lack
(``lacking``) is UNMEASURED, not NO_DATA: the trainer did not fail, it did not say.
"""
from __future__ import annotations

import enum
import math
import statistics
from operator import methodcaller
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from nsa.contract import EXIT_NONFINITE, HALT_NONFINITE
from validation.contract.adapters.base import WrittenBy
from validation.contract.check import adapter_unmeasured
from validation.contract.files import HaltInfo, window_rows
from validation.contract.reruns import Rerun
from validation.contract.torchrun_log import RankFailure
from validation.judge.misses import Miss
from validation.judge.seen import ProcessSeen, RankSilence
from validation.judge.stability import StabilityRule, rise, spikes

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd


@dataclass
class RunData:
    """Everything a metric may read about one finished phase point."""

    out_dir: Path
    world_size: int = 1
    csv: pd.DataFrame | None = None
    heartbeats: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Per rank, its records in file order; csv and heartbeats hold the occurrence of a step
    written last where a resume in place wrote it again (``reruns``)."""
    reruns: dict[str, list[Rerun]] = field(default_factory=dict)
    """Per file, the steps a resume in place wrote again (validation/contract/reruns.py)."""
    env: dict[str, Any] | None = None
    exit_code: int | None = None
    timed_out: bool = False
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped a stalled run (None: no stall)."""
    stacks_tried: int | None = None
    """Processes of ranks whose stacks the harness took (or tried to) when it stopped the run; 0:
    none was left running; None: it did not stop the run."""
    halted: bool = False
    halt: HaltInfo | None = None
    """The .HALT record when there is one (the loss guard's source says the loss went non-finite)."""
    rank_failures: dict[int, RankFailure] = field(default_factory=dict)
    """How ranks ended, as torchrun's log (every node's) reported them: a rank that failed in its
    own right before the others' watchdog fired is the cause of that .HALT, not a stall."""
    slurm_stopped: str | None = None
    """How Slurm ended the run's step without the harness asking (scancel by someone else, a time
    limit, preemption): the ranks were stopped, not failed (validation/contract/nodes.py)."""
    agent_killed: str | None = None
    """'node 1's torchrun agent was killed by SIGKILL': a node's agent itself ended by a signal
    (validation/judge/nodes.py ``agent_killed``)."""
    steps_requested: int | None = None
    """The steps the phase asked for (train points)."""
    launched: bool = True
    """False when the launcher could not start the point's process at all (salloc refused, a
    trainer entry it could not build): nothing ran, so no file of it is missing."""
    misses: list[Miss] = field(default_factory=list)
    """What a pytest or preflight point failed to do (validation/judge/misses.py)."""
    processes: dict[int, ProcessSeen] = field(default_factory=dict)
    """By pid, each process of the run as the harness saw it while it ran (ProcessSeen)."""
    silent_ranks: list[RankSilence] = field(default_factory=list)
    """Of a run the harness stopped: the ranks whose heartbeats had stopped while another's went on
    (RankSilence)."""
    counts: dict[str, float] = field(default_factory=dict)
    """Phase-kind specific numbers: pytest outcome counts, preflight files, profiler results."""
    info: dict[str, Any] = field(default_factory=dict)
    """Phase-kind specific facts that are not numbers (the git SHA preflight read)."""
    written_by: WrittenBy | None = None
    """The contract files a runbook's trainer's adapter wrote, each by where it came from (None: the
    trainer writes the contract itself)."""
    peak_flops: float | None = None
    """One device's peak FLOP/s, from the hardware profile (None where it names none): mfu's divisor."""
    stability: StabilityRule = field(default_factory=StabilityRule)
    """What counts as a spike or a divergence (the profile's rule; validation/judge/stability.py)."""

    @property
    def stopped_by_harness(self) -> bool:
        """The harness ended the run: its stall watch, or the phase timeout."""
        return self.stalled_s is not None or self.timed_out


class Source(enum.StrEnum):
    """Where a metric's input comes from: a contract file, or what the harness saw itself."""

    CSV = "training.csv"
    HEARTBEAT = "heartbeat_rank{R}.jsonl"
    ENV = "env.json"
    HALT = ".HALT"
    PROCESS = "the process"
    """Exit code and timeout, as the harness saw them."""
    JUNIT = "pytest's JUnit XML"
    PREFLIGHT = "preflight"
    PROFILE = "profile.json"
    TIMELINE = "gpu_timeline.json.gz"
    HARDWARE = "the hardware profile"
    """A number of the profile's hardware section, not of the trainer's files."""


@dataclass(frozen=True)
class Input:
    """One field a metric reads. An optional one is a field the contract recommends but does not
    require: a run whose files lack it cannot provide the metric (UNMEASURED)."""

    source: Source
    name: str
    optional: bool = False

    def describe(self) -> str:
        return f"{self.source} {self.name}" + (" (optional)" if self.optional else "")


Compute = Callable[[RunData, "int | None"], "float | None"]


class Timing(enum.Enum):
    """How other work on the machine moves a timing, so how far it can: ``MachineLoad.slowdown``
    bounds how much slower the point ran than it would have alone."""

    SPEED = "speed"
    """Work per second (tokens/s, MFU): at most ``slowdown`` times lower than alone."""
    DURATION = "duration"
    """Seconds per step: at most ``slowdown`` times longer than alone."""
    SPREAD = "spread"
    """A spread, ratio or share of time (steadiness, stragglers, GPU busy): moved, by no bound."""


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    reads: tuple[Input, ...]
    windowed: bool
    """Honours a gate's window ('last N steps' of training.csv); otherwise it describes the run."""
    compute: Compute = field(repr=False, compare=False)
    too_short: Callable[[RunData, int | None], str] | None = field(default=None, repr=False, compare=False)
    """Why a run whose files cover the window still gives no value: too few logged steps for the
    rule (a trainer that logs every k steps), or a value its rule cannot take (a non-finite loss);
    None where that cannot happen."""
    timing: Timing | None = None
    """A timing measures the machine as much as the trainer, so other work on the machine moves it
    (validation/judge/timing.py); None: not a timing."""

    def optional_inputs(self) -> tuple[Input, ...]:
        return tuple(i for i in self.reads if i.optional)


# --- training.csv --------------------------------------------------------------------------------

def window_covered(csv: pd.DataFrame | None, last: int | None) -> bool:
    """Whether the run's logged steps cover a window of the last ``last`` steps: its lower end lies
    at or after the first step the first logged row stands for. A row stands for the steps since
    the row before; the first, for as many as the gap between the first two rows (a trainer that
    logs every 4 steps logs step 4 for steps 1-4), one where a single row was logged. So a run from
    step 1 covers 'last 10 steps' once it logged step 10, and one resumed after step 100 covers
    none reaching below step 101. The whole run (None) is covered when anything was logged."""
    if csv is None or csv.empty:
        return False
    if last is None:
        return True
    steps = sorted(set(int(s) for s in csv["step"]))
    every = steps[1] - steps[0] if len(steps) > 1 else 1
    return steps[-1] - last >= steps[0] - every


def _col(run: RunData, col: str, last: int | None) -> pd.Series | None:
    if not window_covered(run.csv, last):
        return None
    return window_rows(run.csv, last)[col]


def _reduce(col: str, reduce: Callable[[pd.Series], float]) -> Compute:
    def f(run: RunData, last: int | None) -> float | None:
        s = _col(run, col, last)
        return None if s is None or s.empty else float(reduce(s))
    return f


def _pstdev(s: pd.Series) -> float:
    """Population stdev (statistics.pstdev: over the n values, not n - 1); nan where a value
    is not finite, as the mean is (statistics.pstdev raised AttributeError on a nan and the point
    became 'the harness failed')."""
    values = s.tolist()
    return statistics.pstdev(values) if all(math.isfinite(v) for v in values) else math.nan


def _cv(run: RunData, last: int | None) -> float | None:
    s = _col(run, "toks_per_s", last)
    if s is None or s.empty or s.mean() == 0:
        return None
    return float(_pstdev(s) / s.mean())


def _per_gpu(run: RunData, last: int | None) -> float | None:
    s = _col(run, "toks_per_s", last)
    return None if s is None or s.empty else float(s.mean()) / max(run.world_size, 1)


def _mem_growth(run: RunData, last: int | None) -> float | None:
    """Reserved memory at the end of the window minus at its start: ~0 on a plateau."""
    s = _col(run, "mem_reserved_gb", last)
    return None if s is None or len(s) < 2 else float(s.iloc[-1] - s.iloc[0])


#: loss_drop compares the mean loss of this many logged steps at each end of its window
LOSS_DROP_ROWS = 3


def _loss_drop(run: RunData, last: int | None) -> float | None:
    """Mean loss of the first k logged steps of the window minus the mean of its last k, with
    k = min(LOSS_DROP_ROWS, rows // 2); None with fewer than 2 rows or a non-finite loss there."""
    s = _col(run, "loss", last)
    if s is None or len(s) < 2:
        return None
    k = min(LOSS_DROP_ROWS, len(s) // 2)
    head, tail = s.iloc[:k], s.iloc[-k:]
    if not all(math.isfinite(v) for v in (*head, *tail)):
        return None
    return float(head.mean() - tail.mean())


def _loss_drop_unjudged(run: RunData, last: int | None) -> str:
    """Why loss_drop has no value over a window the run covered: 'the window holds 1 logged
    step; 2 are needed', or 'the loss of steps 10, 11, 12 it compares (the first and the last 3
    logged) is not finite' (a run gone NaN: 'no data' alone reads as steps not logged)."""
    rows = window_rows(run.csv, last)
    if len(rows) < 2:
        return f"the window holds {len(rows)} logged step(s); 2 are needed"
    k = min(LOSS_DROP_ROWS, len(rows) // 2)
    steps, losses = rows["step"].tolist(), rows["loss"].tolist()
    bad = [int(steps[i]) for i in (*range(k), *range(len(rows) - k, len(rows))) if not math.isfinite(losses[i])]
    return (f"the loss of step{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} it compares (the first and "
            f"the last {k} logged) is not finite") if bad else ""


def _loss_finite(run: RunData, last: int | None) -> float | None:
    """0 when a logged loss is not finite, or when the trainer said so without logging the step
    (a non-finite .HALT, or the contract's exit code for it): a NaN that never reached the CSV
    is still a NaN."""
    said_nonfinite = (run.exit_code == EXIT_NONFINITE or (run.halt is not None and run.halt.source == HALT_NONFINITE)
                      or _a_rank_exited_nonfinite(run))
    if said_nonfinite:
        return 0.0
    s = _col(run, "loss", None)
    return None if s is None else float(all(math.isfinite(v) for v in s))


def _a_rank_exited_nonfinite(run: RunData) -> bool:
    """A rank whose process exited with the contract's code for a non-finite loss, as torchrun's log
    says: under torchrun the harness sees torchrun's own exit code (1), never the rank's 4, so a
    trainer that stops on a NaN with exit 4 and writes no .HALT read as finite there, and not when
    the same trainer ran as one process."""
    return any(f.stopped_nonfinite for f in run.rank_failures.values())


def _finite(rows: pd.DataFrame, col: str) -> pd.DataFrame:
    return rows[rows[col].map(math.isfinite)]


def _spike_count(col: str) -> Compute:
    """Spikes of ``col`` at the window's steps, each scored against the steps before it (which
    may lie before the window); None when the run is too short for any step to be scored."""
    def f(run: RunData, last: int | None) -> float | None:
        if not window_covered(run.csv, last) or col not in run.csv:
            return None
        rows = _finite(run.csv, col)
        if len(rows) <= run.stability.window:
            return None
        in_window = set(window_rows(run.csv, last)["step"].astype(int))
        found = spikes(rows["step"].tolist(), rows[col].tolist(), run.stability, col)
        return float(sum(1 for s in found if s.step in in_window))
    return f


def _spikes_too_short(col: str) -> Callable[[RunData, int | None], str]:
    def f(run: RunData, last: int | None) -> str:
        n = len(_finite(run.csv, col)) if run.csv is not None and col in run.csv else 0
        w = run.stability.window
        return (f"the run logged {n} step(s) with a finite {col}; a step is scored against the {w} logged before "
                f"it (spike_window), so more than {w} are needed")
    return f


def _diverging_too_short(run: RunData, last: int | None) -> str:
    n = len(_finite(window_rows(run.csv, last), "loss")) if run.csv is not None else 0
    w = run.stability.diverge_window
    return (f"the window holds {n} logged step(s) with a finite loss; two disjoint windows of diverge_window = {w} "
            f"logged steps are needed ({2 * w})")


def _loss_diverging(run: RunData, last: int | None) -> float | None:
    """1 when the window holds a NaN-free rise of the loss (stability.rise); None when it holds
    fewer than two disjoint windows of finite losses."""
    if not window_covered(run.csv, last):
        return None
    rows = _finite(window_rows(run.csv, last), "loss")
    if len(rows) < 2 * run.stability.diverge_window:
        return None
    return float(rise(rows["step"].tolist(), rows["loss"].tolist(), run.stability) is not None)


def _steps(run: RunData, last: int | None) -> float | None:
    return None if run.csv is None or run.csv.empty else float(run.csv["step"].max())


# --- heartbeats ----------------------------------------------------------------------------------

def step_gaps(recs: list[dict[str, Any]]) -> list[float]:
    """A rank's wall time per step between consecutive steps its heartbeats name (the first record
    of each step, 'time'), each gap divided by the steps it spans: a trainer may beat every N steps."""
    by_step: dict[int, float] = {}
    for r in recs:
        if isinstance(r.get("step"), (int, float)) and isinstance(r.get("time"), (int, float)):
            by_step.setdefault(int(r["step"]), float(r["time"]))
    steps = sorted(by_step)
    return [(by_step[b] - by_step[a]) / (b - a) for a, b in zip(steps, steps[1:]) if b > a]


def rank_step_times(heartbeats: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Per rank, the median wall time between consecutive logged steps (heartbeat 'time')."""
    return {rank: statistics.median(gaps) for rank, recs in heartbeats.items() if (gaps := step_gaps(recs))}


def _rank_ratio(run: RunData, last: int | None) -> float | None:
    if not run.heartbeats:
        return None
    if run.world_size < 2:
        return 1.0
    times = rank_step_times(run.heartbeats)
    if len(times) < run.world_size or min(times.values()) <= 0:
        return None
    return max(times.values()) / min(times.values())


def ranks_progressing(heartbeats: dict[int, list[dict[str, Any]]]) -> set[int]:
    """Ranks whose heartbeats show more than one distinct step."""
    return {r for r, recs in heartbeats.items() if len({x.get("step") for x in recs if "step" in x}) > 1}


def _idle_ranks(run: RunData, last: int | None) -> float | None:
    """Ranks of the world that made no step progress, or whose GPU read ~idle at every sample
    (heartbeat gpu_util < 5%) while another rank's was busy (median >= 50%) and, where the
    heartbeats say what memory each rank holds (mem_alloc_gb), held next to none of it (under 5%
    of the busy rank's): the seeds' FSDP run, GPU 0 at 99% and 27 GB, GPU 1 at 0% and 4 MB.

    NVML's reading is the share of time a kernel was resident, and a rank that waits for its peer
    in an NCCL collective keeps a kernel resident while it spins: in a healthy DDP run one rank's GPU
    may read busy and the other's near idle at almost every sample, the rank that arrives late reading
    idle. Both ranks hold the same model and its memory, which is what tells them from an idle rank."""
    if not run.heartbeats:
        return None
    idle = set(range(run.world_size)) - ranks_progressing(run.heartbeats)
    util = {r: u for r, recs in run.heartbeats.items() if (u := _readings(recs, "gpu_util"))}
    busy = [r for r, u in util.items() if statistics.median(u) >= 50]
    if busy:
        held = {r: max(m) for r, recs in run.heartbeats.items() if (m := _readings(recs, "mem_alloc_gb"))}
        most = max((held[r] for r in busy if r in held), default=None)
        idle |= {r for r, u in util.items()
                 if max(u) < 5 and (most is None or r not in held or held[r] < 0.05 * most)}
    return float(len(idle))


def _readings(recs: list[dict[str, Any]], name: str) -> list[float]:
    """A heartbeat field's numeric readings across a rank's records."""
    return [float(r[name]) for r in recs if _number(r.get(name))]


def fallback_counters(run: RunData) -> dict[str, float]:
    """Fallback counters: the last heartbeat's ``fallbacks``/``fb_*`` counters summed over ranks."""
    totals: dict[str, float] = {}
    for recs in run.heartbeats.values():
        last: dict[str, float] = {}
        for r in recs:
            for k, v in _counter_items(r):
                last[k] = v
        for k, v in last.items():
            totals[k] = totals.get(k, 0.0) + v
    return totals


def _counter_items(rec: dict[str, Any]) -> Iterator[tuple[str, float]]:
    fb = rec.get("fallbacks")
    if isinstance(fb, dict):
        for k, v in fb.items():
            if _number(v):
                yield str(k), float(v)
    for k, v in rec.items():
        if k.startswith("fb_") and _number(v):
            yield k, float(v)


def _fallbacks(run: RunData, last: int | None) -> float | None:
    if not run.heartbeats:
        return None
    return float(sum(fallback_counters(run).values()))


# --- env.json, the process, the other phase kinds ------------------------------------------------

def _backends_recorded(run: RunData, last: int | None) -> float | None:
    if run.env is None or run.env.get("attention_backends") is None:
        return None
    return float(bool(run.env["attention_backends"]))


def _tokens_per_step(run: RunData, last: int | None) -> float | None:
    value = (run.env or {}).get("tokens_per_step")
    return float(value) if _number(value) else None


def _model_flops(run: RunData, last: int | None) -> float | None:
    value = (run.env or {}).get("model_flops_per_token")
    return float(value) if _number(value) and value > 0 else None


def _mfu(run: RunData, last: int | None) -> float | None:
    """Model FLOPs utilisation: global tokens/s (mean over the window) x the model's training
    FLOPs per token, over the peak FLOP/s of every device of the run."""
    toks, flops = _col(run, "toks_per_s", last), _model_flops(run, None)
    if toks is None or toks.empty or flops is None or not run.peak_flops:
        return None
    return float(toks.mean()) * flops / (run.peak_flops * max(run.world_size, 1))


def _exit_code(run: RunData, last: int | None) -> float | None:
    return None if run.exit_code is None else float(run.exit_code)


def _count(name: str) -> Compute:
    return lambda run, last: run.counts.get(name)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _csv(name: str, optional: bool = False) -> Input:
    return Input(Source.CSV, name, optional)


def _profile(name: str) -> Input:
    return Input(Source.PROFILE, name, optional=True)


_TOKS, _LOSS, _STEP = _csv("toks_per_s"), _csv("loss"), _csv("step")
_TIMELINE = Input(Source.TIMELINE, "device_intervals_us", optional=True)
_BEATS = Input(Source.HEARTBEAT, "step")

CATALOGUE: tuple[Metric, ...] = (
    Metric("toks_per_s_mean", "mean global tokens/s over the window", (_TOKS,), True,
           _reduce("toks_per_s", methodcaller("mean")), timing=Timing.SPEED),
    Metric("toks_per_s_stdev", "population stdev of tokens/s over the window", (_TOKS,), True,
           _reduce("toks_per_s", _pstdev), timing=Timing.SPREAD),
    Metric("toks_per_s_cv", "stdev / mean of tokens/s over the window (steadiness)", (_TOKS,), True, _cv, timing=Timing.SPREAD),
    Metric("toks_per_s_per_gpu", "mean tokens/s over the window divided by world size",
           (_TOKS, Input(Source.ENV, "world_size")), True, _per_gpu, timing=Timing.SPEED),
    Metric("step_time_s_mean", "mean step time over the window", (_csv("step_time_s", True),), True,
           _reduce("step_time_s", methodcaller("mean")), timing=Timing.DURATION),
    Metric("step_time_s_median", "median step time over the window: the typical step, which a slow first step "
                                 "(a compile, a warm-up) in the window does not move", (_csv("step_time_s", True),), True,
           _reduce("step_time_s", methodcaller("median")), timing=Timing.DURATION),
    Metric("loss_mean", "mean loss over the window", (_LOSS,), True, _reduce("loss", methodcaller("mean"))),
    Metric("loss_drop", f"mean loss of the window's first k logged steps minus the mean of its last k "
                        f"(k = {LOSS_DROP_ROWS}, or half the rows when fewer; nats): > 0 when the model learns",
           (_LOSS,), True, _loss_drop, _loss_drop_unjudged),
    Metric("loss_finite", "1 when every logged loss is finite and the trainer did not stop on a non-finite one "
                          "(.HALT source nonfinite, exit code 4 of the process or of any rank)",
           (_LOSS, Input(Source.HALT, "source"), Input(Source.PROCESS, "exit code")), False, _loss_finite),
    Metric("loss_spikes", "logged steps of the window whose loss lies far above the steps before it: robust z-score "
                          "against the rolling median and MAD (at least 1% of the median) of the previous "
                          "spike_window steps above spike_z (profile; defaults 20 steps, 6)", (_LOSS,), True, _spike_count("loss"),
           _spikes_too_short("loss")),
    Metric("grad_norm_spikes", "logged steps of the window whose gradient norm lies far above the steps before it "
                               "(the rule of loss_spikes)", (_csv("grad_norm", True),), True,
           _spike_count("grad_norm"), _spikes_too_short("grad_norm")),
    Metric("loss_diverging", "1 when the loss rises without going NaN: the median loss of diverge_window logged steps "
                             "of the window lies more than diverge_rise nats above the lowest median of an earlier, "
                             "disjoint window (profile; defaults 20 steps, 0.2 nats)", (_LOSS,), True,
           _loss_diverging, _diverging_too_short),
    Metric("mem_reserved_gb_max", "peak reserved memory over the window", (_csv("mem_reserved_gb", True),), True,
           _reduce("mem_reserved_gb", methodcaller("max"))),
    Metric("mem_alloc_gb_max", "peak allocated memory over the window", (_csv("mem_alloc_gb", True),), True,
           _reduce("mem_alloc_gb", methodcaller("max"))),
    Metric("mem_growth_gb", "reserved memory growth across the window (plateau ~ 0)",
           (_csv("mem_reserved_gb", True),), True, _mem_growth),
    Metric("steps_completed", "last step logged in training.csv", (_STEP,), False, _steps),
    Metric("exit_code", "trainer exit status", (Input(Source.PROCESS, "exit code"),), False, _exit_code),
    Metric("timed_out", "1 when the harness killed the run at its timeout", (Input(Source.PROCESS, "timeout"),),
           False, lambda run, last: float(run.timed_out)),
    Metric("halt", "1 when a .HALT file exists", (Input(Source.HALT, "file"),), False,
           lambda run, last: float(run.halted)),
    Metric("rank_step_time_ratio", "slowest / fastest rank's median step time (heartbeats)",
           (_BEATS, Input(Source.HEARTBEAT, "time")), False, _rank_ratio, timing=Timing.SPREAD),
    Metric("idle_ranks", "ranks with no step progress, or ~0% GPU use at every reading (heartbeat gpu_util < 5%, "
                         "where written) while another rank's median is at least 50%, holding under 5% of its "
                         "memory where the heartbeats carry mem_alloc_gb", (_BEATS,), False, _idle_ranks),
    Metric("fallbacks_total", "sum of fallback counters in the last heartbeat of each rank",
           (Input(Source.HEARTBEAT, "fallbacks", True),), False, _fallbacks),
    Metric("backends_recorded", "1 when env.json records the attention backend per branch",
           (Input(Source.ENV, "attention_backends", True),), False, _backends_recorded),
    Metric("tokens_per_step", "global tokens per optimizer step (env.json)",
           (Input(Source.ENV, "tokens_per_step", True),), False, _tokens_per_step),
    Metric("model_flops_per_token", "the model's training FLOPs per token: forward and backward (3x forward), "
                                    "no recomputation (env.json; nsa/model/flops.py counts this project's)",
           (Input(Source.ENV, "model_flops_per_token", True),), False, _model_flops),
    Metric("mfu", "model FLOPs utilisation: mean tokens/s over the window x model_flops_per_token / (the profile's "
                  "peak_bf16_tflops x world size)",
           (_TOKS, Input(Source.ENV, "model_flops_per_token", True), Input(Source.ENV, "world_size"),
            Input(Source.HARDWARE, "peak_bf16_tflops")), True, _mfu, timing=Timing.SPEED),
    Metric("tests_failed", "pytest failures + errors in a pytest phase", (Input(Source.JUNIT, "failures"),), False,
           _count("tests_failed")),
    Metric("tests_passed", "pytest passes in a pytest phase", (Input(Source.JUNIT, "tests"),), False,
           _count("tests_passed")),
    Metric("preflight_missing", "preflight artifacts that could not be recorded",
           (Input(Source.PREFLIGHT, "git SHA, collect_env, nvidia-smi"),), False, _count("preflight_missing")),
    Metric("profiled_steps", "steps measured under the profiler", (_profile("profiled_steps"),), False,
           _count("profiled_steps")),
    Metric("nsa_ranges_found", "NSA ranges (eager), kernel ops (nsa::*, compiled) and Triton kernels (graph "
                               "replays) seen by the profiler", (_profile("nsa_ranges"),), False,
           _count("nsa_ranges_found")),
    Metric("python_overhead_frac", "share of profiled CPU time outside aten ops",
           (_profile("python_overhead_frac"),), False, _count("python_overhead_frac"), timing=Timing.SPREAD),
    Metric("gpu_busy_frac", "share of the profiled wall time the GPU ran work: computed by the harness from the "
                            "trainer's gpu_timeline.json.gz where it left one (judge/pace.py), else profile.json's",
           (_profile("gpu_busy_frac"), _TIMELINE), False, _count("gpu_busy_frac"), timing=Timing.SPREAD),
    Metric("gpu_host_pause_ms", "ms a profiled step the GPU sat idle in gaps of 1 ms or more: the host pausing it "
                                "(a sync, an optimizer's launches, data); gpu_timeline.json.gz",
           (_TIMELINE,), False, _count("gpu_host_pause_ms"), timing=Timing.SPREAD),
    Metric("cuda_graphs", "1 when the profiled steps were CUDA-graph replays", (_profile("cuda_graphs"),), False,
           _count("cuda_graphs")),
)
METRICS: dict[str, Metric] = {m.name: m for m in CATALOGUE}
#: the metrics a profile phase reads from the trainer's profile.json and GPU timeline
PROFILE_METRICS = tuple(m.name for m in CATALOGUE
                        if any(i.source in (Source.PROFILE, Source.TIMELINE) for i in m.reads))


def compute(name: str, run: RunData, last: int | None) -> float | None:
    value = METRICS[name].compute(run, last if METRICS[name].windowed else None)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


# --- what a run's files lack ---------------------------------------------------------------------

def unprovided_by_files(run: RunData) -> dict[str, str]:
    """The metrics whose optional inputs this run's files do not carry, each with what is missing:
    a training.csv column with no value in any row, an env.json key that is absent (or null),
    heartbeats without any fallback counter, a profile field the trainer did not write; and those
    reading a training.csv column an adapter said its trainer's files cannot give, a required one
    too (a Hugging Face Trainer's tokens/s without the runbook's tokens per step, or of a step its
    TensorBoard events do not time: UNMEASURED, not no data)."""
    out = {}
    said = adapter_unmeasured(run.env)  # an adapter's columns its trainer's files cannot give, required ones too
    for m in CATALOGUE:
        # a column the adapter names, with its words, whether it has no value or lacks some steps'
        adapted = [i for i in m.reads if i.source == Source.CSV and i.name in said]
        missing = [f"{i.source} has no {i.name}" for i in m.optional_inputs() if i not in adapted and not _carries(run, m, i)]
        missing += [f"{i.source} has no {i.name}{'' if _none_in(run, i.name) else ' of every logged step'}: "
                    f"{said[i.name]}" for i in adapted]
        if missing:
            out[m.name] = "; ".join(missing)
    return out


def _none_in(run: RunData, col: str) -> bool:
    """Whether no row of the run's training.csv holds a value of ``col`` (or it has none read)."""
    return run.csv is None or col not in run.csv or not run.csv[col].notna().any()


def _carries(run: RunData, metric: Metric, inp: Input) -> bool:
    # a required file that was not read (missing or malformed: its own error names it) says nothing
    # of the fields it lacks; its metrics are no data, not UNMEASURED "training.csv has no ..."
    if inp.source == Source.CSV:
        return run.csv is None or (inp.name in run.csv and bool(run.csv[inp.name].notna().any()))
    if inp.source == Source.ENV:
        return run.env is None or run.env.get(inp.name) is not None
    if inp.source == Source.HEARTBEAT and not run.heartbeats:
        return True
    if inp.source == Source.HEARTBEAT and inp.name == "fallbacks":
        return any(next(_counter_items(r), None) is not None for recs in run.heartbeats.values() for r in recs)
    if inp.source == Source.HEARTBEAT:
        return any(inp.name in r for recs in run.heartbeats.values() for r in recs)
    return metric.compute(run, None) is not None  # a profile field: its value is the metric's


def reading(fields: frozenset[str]) -> dict[str, frozenset[str]]:
    """The metrics that read any of ``fields`` (optional input names), each with those it reads."""
    out = {}
    for m in CATALOGUE:
        hit = frozenset(i.name for i in m.optional_inputs()) & fields
        if hit:
            out[m.name] = hit
    return out


def costs() -> dict[str, tuple[str, ...]]:
    """Per optional input name, the metrics that cannot be computed without it (for the contract
    check, which names them beside a missing field)."""
    out: dict[str, list[str]] = {}
    for m in CATALOGUE:
        for i in m.optional_inputs():
            out.setdefault(i.name, []).append(m.name)
    return {k: tuple(v) for k, v in out.items()}


def declared_unprovided(trainer: str, lacks: frozenset[str], provides: tuple[str, ...] | None) -> dict[str, str]:
    """Metrics a runbook's trainer says it cannot provide: those reading a field its adapter's
    format lacks, and (when it lists the metrics it provides) every metric it does not list."""
    out = {m: f"trainer {trainer}'s files lack {', '.join(sorted(f))}" for m, f in reading(lacks).items()}
    if provides is not None:
        out.update({m: f"trainer {trainer} does not list it among its metrics"
                    for m in METRICS if m not in provides and m not in out})
    return out


def uncovered(metric: Metric, window, run: RunData) -> str:
    """Why a windowed gate on ``metric`` over ``window`` (a gate's Window) has no value, when it is
    that the run did not cover the window or logged too few steps in it for the metric's rule."""
    if not metric.windowed or run.csv is None or run.csv.empty:
        return ""
    if window_covered(run.csv, window.last):
        return metric.too_short(run, window.last) if metric.too_short else ""
    first, last = int(run.csv["step"].min()), int(run.csv["step"].max())
    return f"the run logged steps {first}..{last}, which do not cover the {window.describe()}"
