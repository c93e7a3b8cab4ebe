"""The phase record: what one run (or skip) of one phase point left behind, as typed data.

One record per (runbook, profile, phase, sweep point), built by ``PhaseRecord.for_point`` for a
run and a skip alike, read by findings and the report through attributes. JSON exists only at
the store boundary (``to_json`` / ``from_json``): the store writes schema 2 and still reads the
schema-1 records that earlier harness versions wrote (the same fields; missing ones default).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from nsa.contract import HEARTBEAT_STAGES_AFTER_STEP
from validation.contract.adapters.base import WrittenBy
from validation.contract.files import HaltInfo
from validation.contract.reruns import Rerun, Restart
from validation.contract.stacks import Frame, Import, StackDump, TakenStack, import_under_way, loader_wait
from validation.contract.torchrun_log import AttemptEnd, RankFailure, last_exception
from validation.errors import StoreError
from validation.judge.asked import Asked
from validation.judge.clock import StepClock
from validation.judge.gates import GateResult, GateVerdict
from validation.judge.memory import MemoryGrowth
from validation.judge.metrics import RunData, compute
from validation.judge.misses import Miss
from validation.judge.nodes import NodesEvidence
from validation.judge.resume import JUDGED as RESUME_JUDGED, Breach, BreachKind, Clue, ClueKind
from validation.judge.seen import ProcessSeen, RankSilence
from validation.judge.stability import NonFinite, Rise, Slowdown, Spike
from validation.judge.unprofiled import NoProfile
from validation.machine import Machine, MachineLoad

Scalar = str | int | float | bool
#: the trainer a record names when the runbook names none
OWN_TRAINER = "nsa.train"
#: phase kinds that run the trainer and judge the artifact contract's files it leaves (a profile
#: phase is a train run asked for profile.json as well; a resume phase runs it three times)
TRAINER_KINDS = ("train", "profile", "resume")
#: the gates a phase kind judges of every point that passed, beyond the runbook's: a stored PASS
#: without one of them was judged by a harness that did not make that check (store/stale.py)
KIND_GATES: dict[str, tuple[str, ...]] = {"resume": RESUME_JUDGED}


class Status(enum.StrEnum):
    """A point's verdict. PASS/FAIL/ERROR decide GO and NO-GO; SKIP (the hardware cannot run it)
    and UNMEASURED (a threshold still to be measured) make a report INCOMPLETE."""

    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"
    UNMEASURED = "UNMEASURED"


def utc_now() -> str:
    """Now, as records store times: ISO 8601, UTC, to the millisecond."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class PointKey:
    runbook: str
    profile: str
    phase: str
    params: dict[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    """A point's numbers for the report's tables, findings and baselines, each a metric of the
    catalogue (validation/judge/metrics.py) over the phase's window, None where it could not be
    computed. Keyed by metric name only at the store boundary (the record's ``metrics``)."""

    toks_per_s_mean: float | None = None
    toks_per_s_stdev: float | None = None
    step_time_s_mean: float | None = None
    step_time_s_median: float | None = None
    mem_reserved_gb_max: float | None = None
    steps_completed: float | None = None
    loss_mean: float | None = None
    loss_drop: float | None = None
    rank_step_time_ratio: float | None = None
    idle_ranks: float | None = None
    fallbacks_total: float | None = None
    tests_failed: float | None = None
    tests_passed: float | None = None
    profiled_steps: float | None = None
    nsa_ranges_found: float | None = None
    python_overhead_frac: float | None = None
    gpu_busy_frac: float | None = None
    gpu_host_pause_ms: float | None = None
    cuda_graphs: float | None = None
    tokens_per_step: float | None = None
    model_flops_per_token: float | None = None
    mfu: float | None = None

    @classmethod
    def of(cls, run: RunData, window: int | None) -> Summary:
        return cls(**{f.name: compute(f.name, run, window) for f in dataclasses.fields(cls)})

    def as_dict(self) -> dict[str, float | None]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """A stored ``metrics`` mapping; names this harness no longer keeps are left out."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: None if v is None else float(v) for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Beat:
    """The last heartbeat of a rank (the fields findings read; the file keeps the rest)."""

    step: int | None = None
    stage: str | None = None
    gpu_util: float | None = None
    ends_steps: bool = True
    """Whether the rank's heartbeats record a step's end at all (a record of a stage written once
    a step is done, nsa/contract.py HEARTBEAT_STAGES_AFTER_STEP, anywhere in its file). Where they
    do not (the seed's format: ranks other than 0 beat only as each step starts), a last record
    within a step does not say that the rank left the step unfinished."""
    every: int | None = None
    """The rank's heartbeat interval in steps, measured from its own records: the largest rise of
    the step from one record to the next (1: it beats every step). None where its records hold
    fewer than two steps. The contract names no cadence (env.json carries none), so a rank whose
    last record lags the run's last step by less than this may still have run every step."""
    pid: int | None = None
    """The writer's process id, as the record says it (the contract's optional ``pid``)."""

    @classmethod
    def of(cls, recs: list[dict[str, Any]]) -> Beat:
        """A rank's last heartbeat of its records (at least one), whether any marks a step's end,
        and the interval between its records' steps."""
        rec = recs[-1]
        step, util = _step(rec), rec.get("gpu_util")
        steps = [s for s in map(_step, recs) if s is not None]
        rises = [b - a for a, b in zip(steps, steps[1:]) if b > a]
        return cls(step, rec.get("stage"),
                   float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else None,
                   any(r.get("stage") in HEARTBEAT_STAGES_AFTER_STEP for r in recs), max(rises, default=None),
                   _whole(rec.get("pid")))

    @property
    def done(self) -> int | None:
        """The last step this record says the rank completed: its step where written once a step
        is done, else the one before (a stage within a step, or no stage: the step had begun)."""
        if self.step is None:
            return None
        return self.step if self.stage in HEARTBEAT_STAGES_AFTER_STEP else self.step - 1


def _step(rec: dict[str, Any]) -> int | None:
    return _whole(rec.get("step"))


def _whole(v: Any) -> int | None:
    """An integer a record holds as one (not a bool, not a float)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def rank_processes(beats: dict[int, Beat], seen: dict[int, ProcessSeen]) -> dict[int, ProcessSeen]:
    """Per rank, the process its last heartbeat's pid names, where the harness saw it."""
    return {r: seen[b.pid] for r, b in beats.items() if b.pid is not None and b.pid in seen}


def last_step_done(beats: Iterable[Beat]) -> int | None:
    """The furthest step any rank's last heartbeat says was completed (None: none says one)."""
    return max((b.done for b in beats if b.done is not None), default=None)


class NotRun(enum.StrEnum):
    """Why an ERROR point's process never ran, so that nothing of the trainer was judged."""

    LAUNCH = "launch"
    """The launcher could not start it (salloc refused, no shared directory, a trainer entry it
    could not build); its error and output are in the point's directory."""
    HARNESS = "harness"
    """The harness itself failed on the point (a defect of the harness: ``HARNESS_ERROR_FILE``)."""


#: the traceback of an unexpected error of the harness on a point, in the point's run directory
HARNESS_ERROR_FILE = "harness_error.txt"


@dataclass
class Evidence:
    """What a person would otherwise dig for."""

    errors: list[str] = field(default_factory=list)
    stderr_tail: str = ""
    stderr_log: str | None = None
    exception: str | None = None
    """The last exception a process of the run raised, from its whole stderr log (torchrun's own
    report that a worker failed skipped: contract/torchrun_log/said.py ``log_exception``), of its last
    attempt under torchrun's --max-restarts."""
    traceback: bool | None = None
    """Whether that log holds a Python traceback of the trainer's own (``log_has_traceback``): a
    trainer that ends on a one-line error prints none. None: a record stored before it was read."""
    halt: HaltInfo | None = None
    rank_failures: dict[int, RankFailure] = field(default_factory=dict)
    stackdumps: dict[int, StackDump] = field(default_factory=dict)
    """Where each rank was: the stack the harness took when it stopped the run, else the
    trainer's own dump."""
    unranked_stacks: list[StackDump] = field(default_factory=list)
    """Stacks of processes whose rank cannot be told: the harness's (with their pid) and a
    trainer's own dumps that do not say their rank."""
    helper_stacks: dict[int, list[StackDump]] = field(default_factory=dict)
    """Stacks the harness took of ranks' helpers (processes below a rank: its data loader's or compiler's
    workers), by the rank they help: where a rank waits for its data loader, a worker's stack says where
    the data is stuck."""
    taken_stacks: list[TakenStack] = field(default_factory=list)
    """What the harness did for each process's stack when it stopped the run (py-spy, SIGUSR1); its
    helpers' are not among them."""
    signalled_pids: list[int] = field(default_factory=list)
    """The processes torchrun's agent says it signalled, ending the ranks still running once one had
    failed (contract/torchrun_log/said.py ``agent_signalled``): a rank the harness then found running among
    them was ending on that signal (a handler of its own that outlasts it), not hung."""
    last_heartbeat: dict[int, Beat] = field(default_factory=dict)
    no_heartbeats: str = ""
    """Why the trainer's files hold no heartbeats at all, as its adapter said ('a Trainer writes no
    per-rank records'); '' where its format has them. A rank without one then says nothing of
    where it was."""
    no_halt: str = ""
    """Why the trainer's format has no .HALT, as its adapter said ('a Trainer writes no .HALT'); ''
    where it has one. A run that exited 0 early then says nothing of one."""
    summary_step: int | None = None
    """Of a format without heartbeats: the step at which the trainer's own summary says its run
    ended (``contract.check.adapter_summary_step``), the furthest step known done where the last
    one logged is earlier; None where it has heartbeats or wrote no summary."""
    rank_step_time_s: dict[int, float] = field(default_factory=dict)
    clock: StepClock | None = None
    """The trainer's logged step time beside the time per step its heartbeats and process showed
    (judge/clock.py); None where that cannot be judged."""
    rank_lateness_s: dict[int, float] = field(default_factory=dict)
    """Of a run of several ranks on one node: per rank, how late it enters the stages of a step
    after the earliest rank (the median over steps; judge/nodes.py ``lateness``). In lock-step
    training the step times agree, and only this tells the rank the others wait for."""
    rank_nearest_s: dict[int, float] = field(default_factory=dict)
    """Of the same runs: per rank, how late it enters the stage of a step where it comes nearest the
    earliest rank (the median over steps of two stages or more; judge/nodes.py ``nearness``): a
    late rank that comes with the others to a stage of each step met them in a collective, where
    they waited for it. Empty where no step has two stages every rank reports, and in records of
    an older harness."""
    fallbacks: dict[str, float] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    written_by: WrittenBy | None = None
    """Of a runbook's trainer read through an adapter: the files of ``files`` the adapter wrote, each by
    where it came from (a Hugging Face Trainer's training.csv, built from its state and events, is no
    file the trainer wrote); None where the trainer writes the contract itself, and in records of
    older harnesses."""
    loss_first: float | None = None
    loss_last: float | None = None
    nonfinite_loss_step: int | None = None
    """The first step whose logged loss is not finite (None: every logged loss is)."""
    nonfinite_loss: NonFinite | None = None
    """What training.csv logs of its non-finite losses, the steps after the first among them
    (judge/stability.py); None where every logged loss is finite, and in records of an older
    harness, which kept ``nonfinite_loss_step`` alone."""
    top_ops: list[str] = field(default_factory=list)
    """The profile phase's kernels with the most device (or CPU) time, with their times."""
    reruns: dict[str, list[Rerun]] = field(default_factory=dict)
    """Per file, the steps a resume in place wrote again; everything above read their later
    occurrence (validation/contract/reruns.py)."""
    restarts: list[Restart] = field(default_factory=list)
    """The later processes of a run restarted into the same files, as its adapter read the trainer's
    log (env.json's ``adapter.restarts``): also those that wrote no step again, which ``reruns`` misses."""
    attempts: list[AttemptEnd] = field(default_factory=list)
    """Each failed attempt of the workers, by torchrun's log (its stderr), in order: under
    ``--max-restarts``, how each process before a restart ended, and the last if it failed."""
    nodes: NodesEvidence | None = None
    """Each node of a launch of several nodes (validation/judge/nodes.py); None for one node."""
    spikes: list[Spike] = field(default_factory=list)
    """Loss and grad-norm spikes over the whole run, by the profile's rule (judge/stability.py)."""
    divergence: Rise | None = None
    """The first NaN-free rise of the loss over the whole run, by the profile's rule."""
    slowdown: Slowdown | None = None
    """Tokens/s that fell and stayed down over the whole run (judge/stability.py)."""
    memory_growth: list[MemoryGrowth] = field(default_factory=list)
    """Ranks whose memory kept growing over the run (judge/memory.py)."""
    resume_clue: Clue | None = None
    """Of a resume point whose loss did not continue: what its curve says of why (judge/resume.py)."""
    resume_breach: Breach | None = None
    """Of a half of a resume point: what it did that it was not asked (ran past its stop, or did not
    resume), its verdict (judge/resume.py)."""
    no_profile: NoProfile | None = None
    """Of a profile point that ran clean: the profile its trainer did not write, and why (None:
    it wrote one, or the point is of another kind)."""
    not_run: NotRun | None = None
    """Of an ERROR point whose process never ran: why (the launch failed, or the harness did)."""
    misses: list[Miss] = field(default_factory=list)
    """Of a pytest or preflight point: what it failed to do (validation/judge/misses.py)."""
    rank_processes: dict[int, ProcessSeen] = field(default_factory=dict)
    """Per rank, its process as the harness saw it (``ProcessSeen``): whether a rank whose heartbeats
    stop early had exited or ran on. Empty where no heartbeat's pid names a process it saw (a record
    of an older harness, a trainer that writes no pid, a node on another host)."""
    silent_ranks: list[RankSilence] = field(default_factory=list)
    """Of a run the harness stopped: the ranks whose heartbeats had shown no new step for stall_s while
    another rank's went on (``RankSilence``), as its watch saw them; empty in records of older harnesses."""

    @property
    def log_exception(self) -> str | None:
        """``exception``; of a record stored before the whole log was read for it (``traceback`` None),
        the last its stderr tail shows. Not the tail's where the log was read: under torchrun's
        --max-restarts the tail may hold an earlier attempt's exception, which is none of the run's end."""
        return self.exception if self.traceback is not None else self.exception or last_exception(self.stderr_tail)

    @classmethod
    def from_json(cls, ev: dict[str, Any]) -> Evidence:
        """A stored record's (or sub-run's) ``evidence`` mapping."""
        return cls(
            errors=list(ev.get("errors") or []), stderr_tail=ev.get("stderr_tail") or "",
            stderr_log=ev.get("stderr_log"), exception=ev.get("exception"), traceback=ev.get("traceback"),
            halt=_halt(ev), loss_first=ev.get("loss_first"),
            loss_last=ev.get("loss_last"), nonfinite_loss_step=_int(ev.get("nonfinite_loss_step")),
            nonfinite_loss=NonFinite(**ev["nonfinite_loss"]) if ev.get("nonfinite_loss") else None, top_ops=list(ev.get("top_ops") or []),
            rank_failures={int(r): RankFailure.from_json(f) for r, f in (ev.get("rank_failures") or {}).items()},
            stackdumps={int(r): _dump(d) for r, d in (ev.get("stackdumps") or {}).items()},
            unranked_stacks=[_dump(d) for d in ev.get("unranked_stacks") or []],
            helper_stacks={int(r): [_dump(d) for d in ds] for r, ds in (ev.get("helper_stacks") or {}).items()},
            taken_stacks=[TakenStack(**t) for t in ev.get("taken_stacks") or []],
            signalled_pids=[int(p) for p in ev.get("signalled_pids") or []],
            last_heartbeat={int(r): Beat(_int(b.get("step")), b.get("stage"), _num(b.get("gpu_util")),
                                         b.get("ends_steps") is not False, _int(b.get("every")), _int(b.get("pid")))
                            for r, b in (ev.get("last_heartbeat") or {}).items()},
            no_heartbeats=str(ev.get("no_heartbeats") or ""),
            no_halt=str(ev.get("no_halt") or ""),
            summary_step=_int(ev.get("summary_step")),
            rank_step_time_s={int(r): float(t) for r, t in (ev.get("rank_step_time_s") or {}).items()},
            clock=StepClock(**ev["clock"]) if ev.get("clock") else None,
            rank_lateness_s={int(r): float(t) for r, t in (ev.get("rank_lateness_s") or {}).items()},
            rank_nearest_s={int(r): float(t) for r, t in (ev.get("rank_nearest_s") or {}).items()},
            fallbacks={str(k): float(v) for k, v in (ev.get("fallbacks") or {}).items()},
            files=list(ev.get("files") or []), written_by=WrittenBy.from_json(ev.get("written_by")),
            nodes=NodesEvidence.from_json(ev.get("nodes")),
            reruns={str(f): [Rerun(**r) for r in rs] for f, rs in (ev.get("reruns") or {}).items()},
            restarts=[Restart(**r) for r in ev.get("restarts") or []],
            attempts=[AttemptEnd(**a) for a in ev.get("attempts") or []],
            spikes=[Spike(**d) for d in ev.get("spikes") or []],
            divergence=Rise(**ev["divergence"]) if ev.get("divergence") else None,
            slowdown=Slowdown(**ev["slowdown"]) if ev.get("slowdown") else None,
            memory_growth=[MemoryGrowth(**m) for m in ev.get("memory_growth") or []],
            resume_clue=Clue(**{**ev["resume_clue"], "kind": ClueKind(ev["resume_clue"]["kind"])})
            if ev.get("resume_clue") else None,
            resume_breach=Breach(**{**ev["resume_breach"], "kind": BreachKind(ev["resume_breach"]["kind"]),
                                    "files": tuple(ev["resume_breach"].get("files", ()))})
            if ev.get("resume_breach") else None,
            no_profile=NoProfile(**ev["no_profile"]) if ev.get("no_profile") else None,
            not_run=NotRun(ev["not_run"]) if ev.get("not_run") else None,
            misses=[Miss(m) for m in ev.get("misses") or []],
            rank_processes={int(r): ProcessSeen(**p) for r, p in (ev.get("rank_processes") or {}).items()},
            silent_ranks=[RankSilence.from_json(s) for s in ev.get("silent_ranks") or []])


@dataclass(frozen=True)
class RunSigns:
    """What one run's whole training.csv and heartbeats say of how it trained, by the profile's
    rules (judge/stability.py, judge/memory.py): the findings of spikes, divergence, a non-finite
    loss, a slowdown and memory growth read it. A point of one process keeps it in its evidence;
    a repeated point keeps each repeat's in its sub-run, so that a spike in a repeat other than the
    one that decided the record is found and named with its repeat."""

    spikes: list[Spike] = field(default_factory=list)
    divergence: Rise | None = None
    slowdown: Slowdown | None = None
    memory_growth: list[MemoryGrowth] = field(default_factory=list)
    nonfinite_loss_step: int | None = None
    halted_nonfinite: bool = False
    """The trainer stopped on a non-finite loss itself (.HALT source nonfinite)."""
    failed_gates: list[str] = field(default_factory=list)
    """The metrics of the run's gates that failed (or had no data): a failed gate on spikes makes
    their finding critical, and a failed loss_finite gate names the non-finite loss itself."""

    @classmethod
    def of(cls, ev: Evidence, failed_gates: list[str]) -> RunSigns:
        """A run's signs as its record's evidence holds them."""
        return cls(list(ev.spikes), ev.divergence, ev.slowdown, list(ev.memory_growth), ev.nonfinite_loss_step,
                   ev.halt is not None and ev.halt.source == "nonfinite", list(failed_gates))

    @classmethod
    def from_json(cls, d: Any) -> RunSigns | None:
        """A stored sub-run's signs; None where a record of an older harness kept none."""
        if not isinstance(d, dict):
            return None
        return cls([Spike(**x) for x in d.get("spikes") or []], Rise(**d["divergence"]) if d.get("divergence") else None,
                   Slowdown(**d["slowdown"]) if d.get("slowdown") else None,
                   [MemoryGrowth(**m) for m in d.get("memory_growth") or []], _int(d.get("nonfinite_loss_step")),
                   bool(d.get("halted_nonfinite")), [str(m) for m in d.get("failed_gates") or []])


@dataclass(frozen=True)
class SubRun:
    """One process of a point that runs several (the repeats of a repeated point; the resume
    phase's uninterrupted reference, first half and resumed second half), each in a directory of
    its own beside the others, with its own verdict and numbers."""

    name: str
    """Its directory's name inside the point's run directory ('repeat2', 'first')."""
    label: str
    """What it is, for people ('repeat 2 of 3', 'first half (steps 1-3)')."""
    out_dir: str
    """Its artifact directory, relative to the results directory."""
    status: Status
    reason: str
    exit_code: int | None = None
    metrics: Summary = field(default_factory=Summary)
    first_step: int | None = None
    """The first and last step its training.csv logged (None: none)."""
    last_step: int | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    command: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    """The files it wrote into its directory and, with a trailing slash, its folders."""
    signs: RunSigns | None = None
    """What its whole run says of how it trained (spikes, divergence, ...); None in records of
    older harnesses, which kept only the deciding process's, in the record's evidence."""
    gates: list[GateResult] = field(default_factory=list)
    """Its own gates' results, as its process alone read them (empty in records of older harnesses).
    A repeat is judged against the phase's gates, so that its failed gate is a finding of that
    repeat whichever repeat decided the record; a resume point's gates are the point's, over the
    resumed run (the record's), and no finding reads its processes' own."""
    timed_out: bool = False
    stalled_s: float | None = None
    timeout_quiet_s: float | None = None
    wall_s: float = 0.0
    """How its process ended and how long it ran, as the record's own fields say of the one it keeps."""
    evidence: Evidence | None = None
    """Its process's evidence (where each rank was, how it ended), so that a repeat that crashed or
    stalled is a finding of its own whichever repeat decided the record; None in records of older
    harnesses."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SubRun:
        return cls(d["name"], d["label"], d["out_dir"], Status(d["status"]), d.get("reason") or "", _int(d.get("exit_code")),
                   Summary.from_json(d.get("metrics") or {}), _int(d.get("first_step")), _int(d.get("last_step")),
                   _num(d.get("loss_first")), _num(d.get("loss_last")), list(d.get("command") or []),
                   list(d.get("files") or []), RunSigns.from_json(d.get("signs")),
                   [GateResult.from_json(g) for g in d.get("gates") or []], bool(d.get("timed_out")),
                   _num(d.get("stalled_s")), _num(d.get("timeout_quiet_s")), _num(d.get("wall_s")) or 0.0,
                   Evidence.from_json(d["evidence"]) if isinstance(d.get("evidence"), dict) else None)


@dataclass(frozen=True)
class Route:
    """The attention backend a branch used (env.json's attention_backends)."""

    backend: str
    reason: str = ""
    calls: int | None = None
    fallback: bool = False

    @classmethod
    def from_env(cls, b: dict[str, Any]) -> Route:
        return cls(str(b.get("backend")), str(b.get("reason") or ""), _int(b.get("calls")), bool(b.get("fallback")))


def routes(backends: Any) -> dict[str, Route]:
    """env.json's attention_backends ({branch: {backend, reason, calls, fallback}}) as Routes."""
    return {s: Route.from_env(b) for s, b in (backends or {}).items() if isinstance(b, dict)}


#: seconds without a new step that still count as progressing at a timeout, whatever the pace
PROGRESS_FLOOR_S = 5.0


@dataclass
class PhaseRecord:
    key: PointKey
    test_id: str
    kind: str
    status: Status
    reason: str
    sweep_index: int = 0
    params_order: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: str = field(default_factory=lambda: utc_now())
    """When the point started (UTC, to the millisecond); with ``wall_s``, when it ran (timed points
    that overlapped shared the machine, validation/judge/timing.py). Records of older harnesses
    hold when they were stored, to the second."""
    wall_s: float = 0.0
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Scalar] = field(default_factory=dict)
    steps: int | None = None
    timeout_s: float = 0.0
    out_dir: str = ""
    """The run's artifact directory, relative to the results directory ('' when nothing ran)."""
    exit_code: int | None = None
    timed_out: bool = False
    stalled_s: float | None = None
    """Seconds without progress when the harness stopped the run as stalled; None: no stall."""
    timeout_quiet_s: float | None = None
    """On a timeout: seconds since the run's files last showed a new step (None: no step yet)."""
    world_size: int = 1
    gates: list[GateResult] = field(default_factory=list)
    window: str = "all steps"
    metrics: Summary = field(default_factory=Summary)
    """Summary numbers over the phase's gate window."""
    evidence: Evidence = field(default_factory=Evidence)
    hardware: Machine | None = None
    """The machine that ran (or skipped) the point."""
    load: MachineLoad | None = None
    """How busy other work kept that machine's cores while the point ran (of a point of several
    processes, the busiest); None where nothing ran long enough, and in records of older harnesses."""
    accelerator: str = "cpu"
    """What the profile runs on ('cuda' or 'cpu'): advice about CUDA is only for CUDA runs."""
    git_sha: str | None = None
    """This repository's commit (the harness's, and the trainer's when it is nsa.train)."""
    git_sha_source: str | None = None
    backends: dict[str, Route] = field(default_factory=dict)
    env_seen: dict[str, str] = field(default_factory=dict)
    noop_toggles: dict[str, str] = field(default_factory=dict)
    trainer: str = OWN_TRAINER
    """The trainer that ran: this project's, or the name of a runbook's ``trainer:`` entry."""
    trainer_sha: str | None = None
    """The trainer's own commit: env.json's git_sha, else its root's own repository; for this
    project's trainer the same as git_sha."""
    trainer_sha_source: str | None = None
    cwd: str = ""
    """The working directory of the command when not this repository (a runbook trainer's root)."""
    runbook_arg: str = ""
    """How a command line names the runbook the point ran from: its name under runbooks/, else its
    path ('' in records of older harnesses), so that ``report`` judges the store against it."""
    profile_arg: str = ""
    slurm_job_id: str | None = None
    """The Slurm job the point ran in (launcher kind slurm)."""
    asked: Asked | None = None
    """What the runbook asked of the point when it ran (judge/asked.py): a report judges the
    record against the runbook as it is now. None in records of older harnesses."""
    runs: list[SubRun] = field(default_factory=list)
    """The processes of a point that ran several, in the order they ran (empty for one process);
    the record's own exit code, command, evidence and out_dir are those of the one that decided
    its verdict (of a repeated point its most severe failure, session/repeats.py; of a resume point
    the first that failed, else the resumed second half)."""

    @classmethod
    def for_point(cls, point, status: Status, reason: str, **fields: Any) -> PhaseRecord:
        """The one constructor of run and skip records: what the point itself says, then what
        the run (if any) measured."""
        base = dict(key=PointKey(**point.key()), test_id=point.test_id, kind=point.phase.kind, status=status,
                    reason=reason, sweep_index=point.index, params_order=list(point.params), env=dict(point.env),
                    overrides=dict(point.overrides), timeout_s=point.phase.timeout_s, world_size=point.nproc,
                    runbook_arg=point.runbook.cli_name, profile_arg=point.profile.cli_name,
                    accelerator=point.profile.hardware.accelerator, asked=Asked.of(point, TRAINER_KINDS))
        return cls(**{**base, **fields})

    @property
    def phase(self) -> str:
        return self.key.phase

    @property
    def ran_at(self) -> str | None:
        """The commit of the trainer that ran the point (this repository's for its own trainer, and
        for a pytest or preflight point, which run this repository's code); None for a runbook's own
        trainer whose commit nothing recorded (its env.json names none and its root is no repository
        of its own): the harness's commit, in git_sha, is not the trainer's."""
        if self.trainer_sha:
            return self.trainer_sha
        return self.git_sha if self.own_trainer or self.kind not in TRAINER_KINDS else None

    @property
    def ran(self) -> bool:
        """A process ran and exited by itself (no timeout): its artifacts are complete."""
        return self.exit_code is not None and not self.timed_out

    @property
    def stopped_by_harness(self) -> bool:
        """The harness ended the run: its stall watch, or the phase timeout."""
        return self.stalled_s is not None or self.timed_out

    @property
    def progressing_at_timeout(self) -> bool:
        """Timed out while its steps still came at their pace: the last new step no longer before
        the timeout than three of its mean step times (the CSV's; else the wall time per step),
        with a floor for the harness's polling and the trainer's buffered writes, and no rank's
        heartbeats silent for stall_s while the others went on (``Evidence.silent_ranks``: that rank
        hung, whatever the others' pace). Such a run was slow or its timeout short, not hung: no
        finding may call it a stall or a hang."""
        if not self.timed_out or self.timeout_quiet_s is None or not self.metrics.steps_completed:
            return False
        if self.evidence.silent_ranks:
            return False
        step_s = self.metrics.step_time_s_mean or self.wall_s / self.metrics.steps_completed
        return self.timeout_quiet_s <= max(3 * step_s, PROGRESS_FLOOR_S)

    @property
    def part(self) -> str:
        """Which of its processes the record's exit code and evidence describe ('first half (steps
        1-3)'), '' for a point of one process."""
        return next((s.label for s in self.runs if s.out_dir == self.out_dir), "")

    @property
    def halves(self) -> tuple[SubRun, SubRun] | None:
        """Of a resume point whose record holds the resumed run (its second half ran clean, so its
        gates read the first half's steps and the second's): the two halves' sub-runs; None for
        any other record (a resume point whose first or second half failed holds that one alone)."""
        first = next((s for s in self.runs if s.name == "first" and s.out_dir != self.out_dir), None)
        second = next((s for s in self.runs if s.name == "second" and s.out_dir == self.out_dir), None)
        if self.kind != "resume" or first is None or second is None or second.status != Status.PASS:
            return None
        return first, second

    @property
    def failed(self) -> bool:
        return self.status in (Status.FAIL, Status.ERROR)

    @property
    def own_trainer(self) -> bool:
        """Whether this project's trainer ran (its config keys and behaviour may be named)."""
        return self.trainer == OWN_TRAINER

    def failed_gates(self) -> list[GateResult]:
        return [g for g in self.gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]

    # --- JSON at the store boundary ----------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Any, where: str) -> PhaseRecord:
        """A stored record (schema 1 or 2); a StoreError naming ``where`` when it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
            raise StoreError(f"{where}: not a phase record (no 'key' object)")
        try:
            evidence = Evidence.from_json(dict(data.get("evidence") or {}))
            known = {f.name for f in dataclasses.fields(cls)}
            plain = {k: v for k, v in data.items() if k in known and k not in ("key", "evidence", "gates", "backends",
                                                                               "status", "hardware", "metrics", "runs",
                                                                               "asked", "load")}
            return cls(key=PointKey(**data["key"]), status=Status(data["status"]), evidence=evidence,
                       runs=[SubRun.from_json(d) for d in data.get("runs") or []], asked=Asked.from_json(data.get("asked")),
                       metrics=Summary.from_json(data.get("metrics") or {}),
                       gates=[GateResult.from_json(g) for g in data.get("gates") or []],
                       backends=routes(data.get("backends")),
                       hardware=Machine.from_json(data["hardware"]) if data.get("hardware") else None,
                       load=MachineLoad.from_json(data.get("load")), **plain)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{where}: malformed phase record ({exc!r})") from None


def _plain(obj: Any) -> Any:
    """Dataclasses, enums and dicts with int keys as JSON-ready values."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _dump(d: dict[str, Any]) -> StackDump:
    frames = [Frame(**fr) for fr in d.get("frames") or []]
    imp = d.get("importing")
    # a record stored before dumps said their import and loader wait reads them from the frames it kept
    importing = (import_under_way(frames) if "importing" not in d else
                 Import(_frame(imp.get("module")), _frame(imp.get("origin")), bool(imp.get("torch_code")))
                 if isinstance(imp, dict) else None)
    loader = _frame(d.get("loader")) if "loader" in d else loader_wait(frames)
    return StackDump(d["path"], frames, d.get("header"), d.get("source") or "trainer", d.get("pid"), importing, loader)


def _frame(d: dict[str, Any] | None) -> Frame | None:
    return Frame(**d) if isinstance(d, dict) else None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _halt(ev: dict[str, Any]) -> HaltInfo | None:
    h = ev.get("halt")
    if isinstance(h, dict):  # schema 2
        return HaltInfo(**h)
    if not h:  # schema 1 kept a flag and the record apart
        return None
    rec = ev.get("halt_record") or {}
    return HaltInfo(rec.get("source"), _int(rec.get("step")), rec.get("losses"), _num(rec.get("grad_norm")))
