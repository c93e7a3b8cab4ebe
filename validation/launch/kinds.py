"""The phase kinds, each run in a subprocess with the phase's hard timeout:

``train`` (the trainer, python or torchrun), ``preflight`` (git SHA, collect_env, nvidia-smi:
fixed commands, nothing from the runbook), ``pytest`` (the project's own tests) and ``profile``
(a train run asked for profile.json through the contract). A ``resume`` point is three train
runs (validation/launch/legs.py), which the session runs one by one.

Each runner fills the point's RunData (what the metrics read) and returns the process result.
"""
from __future__ import annotations

import functools
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from nsa.contract import GPU_TIMELINE, PROFILE_JSON, TRAINING_CSV
from nsa.provenance import SOURCE_STAMP, source_revision
from validation import REPO_ROOT
from validation.contract.adapters import ADAPTERS
from validation.contract.adapters.base import Adapter, RunFacts, WrittenBy
from validation.contract.files import tail
from validation.contract.files import read_gpu_timeline, read_profile
from validation.errors import ArtifactError, HarnessError
from validation.judge.metrics import RunData
from validation.judge.misses import Miss
from validation.judge.pace import device_idle
from validation.judge.record import TRAINER_KINDS
from validation.launch import commands
from validation.launch import foreign as trainer_launch
from validation.launch import launcher
from validation.launch.legs import Leg
from validation.launch import process as runner
from validation.launch.watch import Watch
from validation.runbook.plan import PhasePoint
from validation.runbook.types import Scalar, override_text

Progress = Callable[[str], None]

#: this project's trainer: stop after N steps (checkpointing), and resume from a run directory
OWN_STOP_AFTER = "train.run_steps"
OWN_RESUME_FROM = "train.resume"


class StepProgress:
    """A train point's progress line from its training.csv: step N/total, tokens/s, ETA; once no
    new step has come for QUIET_STEPS steps' time (and QUIET_MIN_S, or half the phase's stall
    allowance where that is shorter: a stall is called at the allowance), how long none has instead
    of an ETA that only grows."""

    QUIET_STEPS = 3
    QUIET_MIN_S = 10.0

    #: lines read back from the file's end for its last step (a trainer's own log has other
    #: lines between its metrics lines)
    TAIL_LINES = 40

    def __init__(self, point: PhasePoint, csv: Path, progress: Progress, read: Callable[[str], Any] | None = None,
                 leg: Leg | None = None):
        self.point, self.csv, self.progress = point, csv, progress
        self.read = read or Adapter().progress
        #: which process of a resume point this is (each of its three starts again at 0 s)
        self.name = point.test_id if leg is None else f"{point.test_id} ({leg.label})"
        self.total = (leg.steps_expected if leg is not None else point.phase.steps) \
            if point.phase.kind in TRAINER_KINDS else None
        stall = point.phase.stall_after_s if point.phase.kind in TRAINER_KINDS else None
        self.quiet_min_s = min(self.QUIET_MIN_S, stall / 2) if stall else self.QUIET_MIN_S
        self.first: tuple[float, int] | None = None  # (elapsed, step) when a step was first seen
        self.latest: tuple[float, int] | None = None  # (elapsed, step) when the last step was first seen

    def __call__(self, elapsed: float) -> None:
        seen = next((r for r in map(self.read, reversed(tail(self.csv, self.TAIL_LINES).splitlines())) if r), None)
        line = f"{self.name}: {elapsed:5.0f}s"
        if seen is not None:
            step, rate = seen
            line += f" step {step}/{self.total}, {_number(rate)} tok/s (global)"
            if self.first is None:
                self.first = (elapsed, step)
            if self.latest is None or step != self.latest[1]:
                self.latest = (elapsed, step)
            (t0, s0), (seen, _) = self.first, self.latest
            per_step = (seen - t0) / (step - s0) if step > s0 else None
            quiet = elapsed - seen
            if per_step is not None and quiet > max(self.quiet_min_s, self.QUIET_STEPS * per_step):
                line += f", no new step for {quiet:.0f}s"
            elif self.total and per_step is not None and elapsed > t0:
                line += f", ETA {(self.total - step) * per_step:.0f}s"
        self.progress(line)


def _number(rate: float | None) -> str:
    return "?" if rate is None or rate != rate else f"{rate:,.0f}"


def _poll(point: PhasePoint, out_dir: Path, progress: Progress | None, csv: Path | None = None,
          adapter: Adapter | None = None, leg: Leg | None = None):
    """Progress from ``csv`` (the contract's training.csv in out_dir unless a trainer's own, read
    by its adapter); ``leg``: which process of a resume point."""
    read = functools.partial(adapter.progress, world_size=point.nproc) if adapter is not None else None
    return None if progress is None else StepProgress(point, csv or out_dir / TRAINING_CSV, progress, read, leg)


def override_args(point: PhasePoint, leg: Leg | None = None) -> list[str]:
    """The trainer's --config/--steps/--override arguments for this point (and, for one process
    of a resume point, the keys that stop or resume it)."""
    args = ["--config", point.phase.config, "--steps", str(point.phase.steps)]
    overrides = {**point.overrides, **own_overrides(leg)}
    if overrides:
        args += ["--override", " ".join(f"{k}={override_text(v)}" for k, v in overrides.items())]
    return args


def own_overrides(leg: Leg | None) -> dict[str, Scalar]:
    """The config keys that stop or resume this project's trainer."""
    if leg is None:
        return {}
    out: dict[str, Scalar] = {}
    if leg.stop_after is not None:
        out[OWN_STOP_AFTER] = leg.stop_after
    if leg.resume_from is not None:
        out[OWN_RESUME_FROM] = str(leg.resume_from)
    return out


def train(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress,
          leg: Leg | None = None) -> runner.ProcResult:
    """A train run of the point into ``out_dir``; ``leg``: which process of a resume point. This
    project's trainer runs from this repository and writes the contract's files itself; a
    runbook's own trainer is launched from its root into its own directory as its launch plan
    says (launch/foreign.py), then its adapter writes the contract files into ``out_dir``, which
    the harness reads as for this project's trainer."""
    spec = point.runbook.trainer
    began = time.monotonic()
    adapter = ADAPTERS[spec.adapter] if spec is not None else None
    trainer_dir = adapter.trainer_dir(out_dir) if adapter is not None else out_dir
    csv = adapter.progress_csv(trainer_dir) if adapter is not None else out_dir / TRAINING_CSV
    doing = "launch" if spec is None else f"trainer {spec.name}"  # what a HarnessError stopped, as it says
    try:
        if spec is None:
            target, args = point.phase.launcher.module, override_args(point, leg) + ["--out-dir", str(out_dir)]
            env, cwd = point.env, REPO_ROOT
        else:
            root, why = spec.root.resolve()
            if root is None:
                raise HarnessError(why)
            plan = trainer_launch.build(point, spec, root, out_dir, trainer_dir, leg)
            run.info.update(trainer=spec.name, trainer_sha=plan.trainer_sha,
                            trainer_sha_source=plan.trainer_sha_source, git_sha=plan.harness_sha,
                            git_sha_source=plan.harness_sha_source, env=plan.set_env, cwd=str(plan.cwd))
            target, args, env, cwd = plan.entry, plan.args, plan.env, plan.cwd
        doing = "launch"  # the launcher could not start it (no Slurm allocation, no shared directory)
        proc = launcher.run_trainer(point.phase.launcher, target, args, env=commands.child_env(env, root=cwd), cwd=cwd,
                                    timeout_s=point.phase.timeout_s, out_dir=out_dir,
                                    on_poll=_poll(point, out_dir, progress, csv, adapter, leg),
                                    watch=_watch(point, out_dir, trainer_dir, csv, adapter,
                                                 leg.steps_expected if leg is not None else point.phase.steps))
    except HarnessError as exc:
        return _not_launched(f"{doing}: {exc}", out_dir, run, errors, began)
    if adapter is not None:  # also of a trainer that died before making its folder: the adapter says what its
        trainer_dir.mkdir(parents=True, exist_ok=True)  # format lacks (heartbeats), not a contract run's words
        converted = adapter.convert(trainer_dir, out_dir, RunFacts(point.nproc, spec.name, plan.trainer_sha,
                                                                   plan.trainer_sha_source, plan.tokens_per_step))
        run.written_by = WrittenBy(adapter.name, converted.files)  # the report says whose each file is
    return proc


def _watch(point: PhasePoint, out_dir: Path, progress_dir: Path, csv: Path, adapter: Adapter | None,
           last_step: int) -> Watch:
    """A train point's progress (its heartbeats and CSV in ``progress_dir``, or the file its
    adapter reads progress from, or what its adapter's ``live_steps`` reads there) watched for
    stalls, up to ``last_step``, the last step the trainer is asked to complete; stacks go into
    the run directory ``out_dir``."""
    step_of = None
    if adapter is not None and adapter.progress_csv(progress_dir).name != TRAINING_CSV:
        def step_of(line: str) -> int | None:
            seen = adapter.progress(line)
            return seen[0] if seen else None
    live_steps = adapter.live_steps(progress_dir) if adapter is not None else None
    return Watch(progress_dir, csv, point.phase.stall_after_s, point.phase.startup_after_s, out_dir,
                 point.phase.launcher.kind == "python", step_of, live_steps, last_step)


def _not_launched(why: str, out_dir: Path, run: RunData, errors: list[str], began: float) -> runner.ProcResult:
    """A trainer that could not be started: the reason is the point's first error and its log; its
    wall time is that of what ran before the error (``began``: time.monotonic() when the launch
    began: a salloc that waited, then refused), not 0."""
    run.launched = False
    errors.append(why)
    stderr = out_dir / "trainer.stderr.log"
    stderr.write_text(f"[nsa-validate] not launched: {why}\n")
    return runner.ProcResult([], None, False, time.monotonic() - began, stderr, stderr)


def pytest_(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    missing = [t for t in point.phase.tests if not (REPO_ROOT / t.split("::")[0]).exists()]
    if missing:
        run.misses.append(Miss.TEST_PATHS)
        errors.append(f"test path(s) not found under {REPO_ROOT}: {', '.join(missing)}")
    junit = out_dir / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--junitxml={junit}", *point.phase.tests, *point.phase.pytest_args]
    # the tests run this repository's code: its commit is the one they ran at, recorded as a
    # runbook trainer's point records the harness's (git describe at the root, else its stamp)
    run.info["git_sha"], run.info["git_sha_source"] = trainer_launch.revision(REPO_ROOT, out_dir, "harness_git")
    run.info["cwd"] = str(REPO_ROOT)  # its test paths are relative to it: the Reproduce line starts with `cd` there
    proc = runner.run(argv, env=commands.child_env(point.env), cwd=REPO_ROOT, timeout_s=point.phase.timeout_s,
                      log_dir=out_dir, log_name="pytest", on_poll=_poll(point, out_dir, progress))
    before = len(errors)
    run.counts.update(junit_counts(junit, errors))
    if len(errors) > before:
        run.misses.append(Miss.JUNIT)
    return proc


def junit_counts(path: Path, errors: list[str]) -> dict[str, float]:
    if not path.is_file():
        errors.append(f"{path}: pytest wrote no JUnit XML")
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        errors.append(f"{path}: unreadable JUnit XML ({exc})")
        return {}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        errors.append(f"{path}: no <testsuite> element")
        return {}
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"tests_failed": float(n["failures"] + n["errors"]),
            "tests_passed": float(n["tests"] - n["failures"] - n["errors"] - n["skipped"])}


def preflight(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    """The code's commit (git or the SOURCE_SHA stamp), collect_env and nvidia-smi, each a fixed
    command with its own timeout."""
    env = commands.child_env(point.env)
    budget = max(point.phase.timeout_s / 3, 5.0)
    missing = 0
    git_runs: list[runner.ProcResult] = []

    def git(*args: str) -> str | None:
        proc = runner.run(["git", *args], env=env, cwd=REPO_ROOT, timeout_s=budget, log_dir=out_dir,
                          log_name="git_" + args[0].replace("-", "_"))
        git_runs.append(proc)
        return proc.stdout_path.read_text().strip() if proc.exit_code == 0 else None

    sha, source = source_revision(REPO_ROOT, git)
    last = git_runs[0]  # git describe
    wall = sum(p.wall_s for p in git_runs)
    if sha:
        (out_dir / "git_sha.txt").write_text(sha + "\n")
    elif slow := next((p for p in git_runs if p.timed_out), None):
        missing += 1
        run.misses.append(Miss.TIMED_OUT)
        errors.append(f"{_ran(slow)} did not finish within {budget:g} s and was killed (its output: "
                      f"{slow.stderr_path.name}); there is no {SOURCE_STAMP} stamp naming the commit")
    else:
        missing += 1
        run.misses.append(Miss.GIT_SHA)
        errors.append(f"git describe failed (exit {last.exit_code}: {last.stderr_tail(3)}) and there is no "
                      f"{SOURCE_STAMP} stamp naming the commit")
    wanted = [("collect_env.txt", [sys.executable, "-m", "torch.utils.collect_env"], True),
              ("nvidia_smi.xml", ["nvidia-smi", "-q", "-x"], point.profile.hardware.accelerator == "cuda")]
    for name, argv, required in wanted:
        if argv[0] == "nvidia-smi" and shutil.which("nvidia-smi") is None:
            if required:
                missing += 1
                run.misses.append(Miss.NVIDIA_SMI)
                errors.append("nvidia-smi is not installed on this machine")
            continue
        last = runner.run(argv, env=env, cwd=REPO_ROOT, timeout_s=budget, log_dir=out_dir, log_name=Path(name).stem)
        wall += last.wall_s
        if last.exit_code == 0 and last.stdout_path.stat().st_size:
            shutil.copyfile(last.stdout_path, out_dir / name)
        elif required and last.timed_out:
            missing += 1
            run.misses.append(Miss.TIMED_OUT)
            errors.append(f"{_ran(last)} did not finish within {budget:g} s and was killed (its output: "
                          f"{last.stderr_path.name})")
        elif required:
            missing += 1
            run.misses.append(Miss.NVIDIA_SMI if argv[0] == "nvidia-smi" else Miss.COLLECT_ENV)
            errors.append(f"{' '.join(argv[:3])} failed (exit {last.exit_code}): {last.stderr_tail(3)}")
    run.counts["preflight_missing"] = float(missing)
    run.info["git_sha"] = sha
    run.info["git_sha_source"] = source
    return runner.ProcResult(last.argv, 0 if not missing else 1, False, wall, last.stdout_path, last.stderr_path)


def _ran(proc: runner.ProcResult) -> str:
    """A preflight command as a person would type it: 'git describe', 'python -m torch.utils.collect_env'."""
    argv = list(proc.argv)
    if Path(argv[0]).name == "git":
        return " ".join(argv[:2])
    return " ".join(["python" if argv[0] == sys.executable else argv[0], *argv[1:]])


#: how far the trainer's gpu_busy_frac may lie from the harness's own computation over the same
#: timeline (both take the union of the same intervals: only rounding separates them)
BUSY_CLAIM_TOLERANCE = 1e-3


def profile(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    """A train run asked for a profile through the contract (``PhasePoint.env`` carries the
    request); the trainer's profile.json, when it wrote one, fills the profile metrics. One that
    wrote none leaves them unmeasured (session/point.py says why). Where it also left its GPU
    timeline, the harness computes the GPU's busy share and idle gaps itself (judge/pace.py), and
    a profile.json whose gpu_busy_frac disagrees with its own timeline is an error, not a verdict."""
    proc = train(point, out_dir, run, errors, progress)
    read_profile_evidence(out_dir, run, errors)
    return proc


def read_profile_evidence(out_dir: Path, run: RunData, errors: list[str]) -> None:
    """The profile metrics of the trainer's profile.json and GPU timeline into ``run.counts``
    (and its top ops into ``run.info``); what is wrong with them into ``errors``."""
    try:
        found = read_profile(out_dir)
        timeline = read_gpu_timeline(out_dir) if found is not None else None
    except ArtifactError as exc:
        errors.append(str(exc))
        return
    if found is None:
        return
    run.counts.update({"profiled_steps": float(found.profiled_steps), "nsa_ranges_found": float(len(found.nsa_ranges)),
                       "cuda_graphs": float(found.cuda_graphs)})
    run.counts.update({k: v for k, v in (("gpu_busy_frac", found.gpu_busy_frac),
                                         ("python_overhead_frac", found.python_overhead_frac)) if v is not None})
    run.info["top_ops"] = found.top_ops
    if timeline is not None and found.profiled_steps > 0:
        idle = device_idle(timeline.intervals_us, timeline.window_us, found.profiled_steps)
        run.counts.update({"gpu_busy_frac": idle.busy_frac, "gpu_host_pause_ms": idle.host_pause_ms})
        claimed = found.gpu_busy_frac
        if claimed is not None and abs(claimed - idle.busy_frac) > BUSY_CLAIM_TOLERANCE:
            errors.append(f"{PROFILE_JSON} says gpu_busy_frac {claimed:.4f}, its own {GPU_TIMELINE} gives "
                          f"{idle.busy_frac:.4f}: the trainer's figure is not what its timeline shows")


KINDS = {"train": train, "pytest": pytest_, "preflight": preflight, "profile": profile}
