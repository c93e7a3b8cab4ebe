"""Phase runners: run one phase point, collect its artifacts and evidence, evaluate its gates,
and return the JSON-ready record the store keeps.

Kinds: ``train`` (the trainer, python or torchrun), ``preflight`` (git SHA, collect_env,
nvidia-smi: fixed commands, nothing from the runbook), ``pytest`` (the project's own tests) and
``profile`` (a bounded torch.profiler run, validation/profile_phase.py). Every kind runs in a
subprocess with the phase's hard timeout.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
import signal
import uuid
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

from nsa.provenance import SOURCE_STAMP, source_revision

from . import REPO_ROOT, runner
from .artifacts import (halted, main_thread_frames, parse_stackdump, read_env_json, read_heartbeats,
                        read_training_csv, stackdumps)
from .runner import tail
from .errors import ArtifactError, StoreError
from .gates import FAIL, NO_DATA, UNMEASURED, GateResult, check
from .metrics import RunData, compute, fallback_counters, rank_step_times
from .plan import PhasePoint

Progress = Callable[[str], None]
PASSED, FAILED, ERROR, SKIPPED = "PASS", "FAIL", "ERROR", "SKIP"
MAX_FRAMES = 8


def run_dir(results_dir: Path, point: PhasePoint) -> Path:
    """results/runs/<runbook>/<profile>/<phase>/<slug>; every part was validated as a safe name."""
    root = (results_dir / "runs").resolve()
    d = (root / point.runbook.name / point.profile.name / point.phase.name / point.slug).resolve()
    if root not in d.parents:
        raise StoreError(f"run directory {d} would leave {root}")
    return d


def execute(point: PhasePoint, results_dir: Path, hw: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
    out_dir = run_dir(results_dir, point)
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a re-run replaces its own artifacts, nothing else
    out_dir.mkdir(parents=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    kind = point.phase.kind
    run = RunData(out_dir=out_dir, world_size=point.nproc)
    errors: list[str] = []
    proc = _KINDS[kind](point, out_dir, run, errors, progress)
    run.exit_code, run.timed_out = proc.exit_code, proc.timed_out
    if kind == "train":
        _collect_train(run, errors)
    gates = evaluate(point, run)
    status, reason = verdict(kind, run, errors, gates)
    window = next((g.window.last for g in point.gates() if g.window.last), None)
    return {
        "key": point.key(),
        "test_id": point.test_id,
        "run_id": uuid.uuid4().hex,
        "kind": kind,
        "sweep_index": point.index,
        "params_order": list(point.params),
        "status": status,
        "reason": reason,
        "started": started,
        "wall_s": round(proc.wall_s, 2),
        "command": proc.argv,
        "env": point.env,
        "overrides": point.overrides,
        "steps": point.phase.steps if kind == "train" else None,
        "timeout_s": point.phase.timeout_s,
        "out_dir": str(out_dir.relative_to(results_dir.resolve())),
        "exit_code": proc.exit_code,
        "timed_out": proc.timed_out,
        "world_size": run.world_size,
        "gates": [g.__dict__ for g in gates],
        "window": f"last {window} steps" if window else "all steps",
        "metrics": _summary_metrics(run, window),
        "evidence": evidence(run, proc, errors),
        "hardware": hw,
        "git_sha": run.info.get("git_sha") or (run.env or {}).get("git_sha"),
        "git_sha_source": run.info.get("git_sha_source") or (run.env or {}).get("git_sha_source"),
        "backends": (run.env or {}).get("attention_backends"),
        "env_seen": dict((run.env or {}).get("env") or {}),
        "noop_toggles": dict((run.env or {}).get("noop_toggles") or {}),
    }


# ------------------------------------------------------------------------------------- kinds
def _progress_cb(point: PhasePoint, out_dir: Path, progress: Progress | None):
    if progress is None:
        return None
    total = point.phase.steps if point.phase.kind == "train" else None

    def cb(elapsed: float) -> None:
        step = _last_step(out_dir / "training.csv")
        where = f" step {step}/{total}" if step is not None else ""
        progress(f"{point.test_id}: {elapsed:5.1f}s{where}")
    return cb


def _last_step(csv: Path) -> int | None:
    last = tail(csv, 1).split(",", 1)[0]
    return int(last) if last.isdigit() else None


def _train(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    args = ["--config", point.phase.config, "--out-dir", str(out_dir), "--steps", str(point.phase.steps)]
    if point.overrides:
        args += ["--override", " ".join(f"{k}={_fmt(v)}" for k, v in point.overrides.items())]
    launcher = point.phase.launcher
    if launcher.kind == "torchrun":
        argv = runner.torchrun_argv(launcher.module, launcher.nproc, args, launcher.torchrun_args)
    else:
        argv = runner.python_argv(launcher.module, args)
    return runner.run(argv, env=runner.child_env(point.env), cwd=REPO_ROOT, timeout_s=point.phase.timeout_s,
                      log_dir=out_dir, on_poll=_progress_cb(point, out_dir, progress))


def _fmt(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _pytest(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    missing = [t for t in point.phase.tests if not (REPO_ROOT / t.split("::")[0]).exists()]
    if missing:
        errors.append(f"test path(s) not found under {REPO_ROOT}: {', '.join(missing)}")
    junit = out_dir / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--junitxml={junit}", *point.phase.tests, *point.phase.pytest_args]
    proc = runner.run(argv, env=runner.child_env(point.env), cwd=REPO_ROOT, timeout_s=point.phase.timeout_s,
                      log_dir=out_dir, log_name="pytest", on_poll=_progress_cb(point, out_dir, progress))
    run.counts.update(junit_counts(junit, errors))
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


def _preflight(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    """The code's commit (git or the SOURCE_SHA stamp), collect_env and nvidia-smi, each a fixed
    command with its own timeout."""
    env = runner.child_env(point.env)
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
    else:
        missing += 1
        errors.append(f"git describe failed (exit {last.exit_code}: {last.stderr_tail(3)}) and there is no "
                      f"{SOURCE_STAMP} stamp naming the commit")
    wanted = [("collect_env.txt", [sys.executable, "-m", "torch.utils.collect_env"], True),
              ("nvidia_smi.xml", ["nvidia-smi", "-q", "-x"], point.profile.hardware.accelerator == "cuda")]
    for name, argv, required in wanted:
        if argv[0] == "nvidia-smi" and shutil.which("nvidia-smi") is None:
            if required:
                missing += 1
                errors.append("nvidia-smi is not installed on this machine")
            continue
        last = runner.run(argv, env=env, cwd=REPO_ROOT, timeout_s=budget, log_dir=out_dir, log_name=Path(name).stem)
        wall += last.wall_s
        if last.exit_code == 0 and last.stdout_path.stat().st_size:
            shutil.copyfile(last.stdout_path, out_dir / name)
        elif required:
            missing += 1
            errors.append(f"{' '.join(argv[:3])} failed (exit {last.exit_code}): {last.stderr_tail(3)}")
    run.counts["preflight_missing"] = float(missing)
    run.info["git_sha"] = sha
    run.info["git_sha_source"] = source
    return runner.ProcResult(last.argv, 0 if not missing else 1, False, wall, last.stdout_path, last.stderr_path)


def _profile(point: PhasePoint, out_dir: Path, run: RunData, errors: list[str], progress) -> runner.ProcResult:
    args = ["--config", point.phase.config, "--out-dir", str(out_dir), "--steps", str(point.phase.steps)]
    if point.overrides:
        args += ["--override", " ".join(f"{k}={_fmt(v)}" for k, v in point.overrides.items())]
    proc = runner.run(runner.python_argv("validation.profile_phase", args), env=runner.child_env(point.env),
                      cwd=REPO_ROOT, timeout_s=point.phase.timeout_s, log_dir=out_dir, log_name="profile",
                      on_poll=_progress_cb(point, out_dir, progress))
    path = out_dir / "profile.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            run.counts.update({k: float(v) for k, v in data.get("counts", {}).items()})
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            errors.append(f"{path}: unreadable ({exc})")
    elif not proc.timed_out:
        errors.append(f"{path}: the profiler wrote no results")
    return proc


_KINDS = {"train": _train, "pytest": _pytest, "preflight": _preflight, "profile": _profile}


# ------------------------------------------------------------------------ evidence & verdicts
def _collect_train(run: RunData, errors: list[str]) -> None:
    for reader, attr in ((read_training_csv, "csv"), (read_heartbeats, "heartbeats"), (read_env_json, "env")):
        try:
            setattr(run, attr, reader(run.out_dir))
        except ArtifactError as exc:
            errors.append(str(exc))
    run.halted = halted(run.out_dir)
    if run.env and isinstance(run.env.get("world_size"), int):
        run.world_size = run.env["world_size"]
    if not run.heartbeats:
        errors.append(f"{run.out_dir}: no heartbeat_rank*.jsonl written")
    if run.env is None:
        errors.append(f"{run.out_dir / 'env.json'}: missing")


def evaluate(point: PhasePoint, run: RunData) -> list[GateResult]:
    out = []
    for g in point.gates():
        value = compute(g.metric, run, g.window.last)
        out.append(GateResult(g.metric, g.op, g.threshold, g.window.describe(), value,
                              check(value, g.op, g.threshold), g.threshold_ref, g.description))
    return out


def verdict(kind: str, run: RunData, errors: list[str], gates: list[GateResult]) -> tuple[str, str]:
    """Process failures first (they explain everything after), then contract violations, then gates."""
    if run.timed_out:
        return FAILED, "timed out: killed by the harness at the phase timeout"
    if run.halted:
        rec = halt_record(run.out_dir)
        if rec.get("source") == "nonfinite":  # the trainer's NaN/inf guard, not a stall
            return FAILED, (f"non-finite loss at step {rec.get('step')}: loss per rank {rec.get('losses')}, "
                            f"grad_norm {rec.get('grad_norm')} (trainer .HALT)")
        if rec.get("source") not in (None, "watchdog"):
            return FAILED, f"stopped by a .HALT from {rec.get('source')}: {rec}"
        return FAILED, "watchdog wrote .HALT: no rank made progress"
    if run.exit_code not in (0, None):
        what = {"pytest": "tests failed", "preflight": "preflight incomplete"}.get(kind, "trainer crashed")
        return FAILED, f"{what} (exit code {run.exit_code})"
    if errors:
        return ERROR, errors[0]
    bad = [g for g in gates if g.verdict in (FAIL, NO_DATA)]
    if bad:
        return FAILED, "; ".join(_gate_text(g) for g in bad)
    if any(g.verdict == UNMEASURED for g in gates):
        return "UNMEASURED", "threshold(s) to be measured for this profile: " + ", ".join(
            g.threshold_ref or g.metric for g in gates if g.verdict == UNMEASURED)
    return PASSED, f"{len(gates)} gate(s) passed" if gates else "completed (no gates)"


def _gate_text(g: GateResult) -> str:
    val = "no data" if g.value is None else f"{g.value:.4g}"
    return f"{g.metric} = {val}, needs {g.op} {g.threshold:g} ({g.window})"


def evidence(run: RunData, proc: runner.ProcResult, errors: list[str]) -> dict[str, Any]:
    """What a person would otherwise dig for: stderr tail, last heartbeat and stack per rank."""
    dumps = {}
    for rank, path in stackdumps(run.out_dir).items():
        text = path.read_text(errors="replace")
        frames = main_thread_frames(parse_stackdump(text))
        header = next((ln.strip("= ").strip() for ln in text.splitlines() if ln.startswith("===")), None)
        dumps[str(rank)] = {"path": path.name, "frames": frames[:MAX_FRAMES], "header": header}
    last_beat = {str(r): recs[-1] for r, recs in run.heartbeats.items() if recs}
    return {
        "errors": errors,
        "stderr_tail": proc.stderr_tail(),
        "stderr_log": proc.stderr_path.name,
        "halt": run.halted,
        "halt_record": halt_record(run.out_dir) if run.halted else None,
        "rank_failures": rank_failures(proc.stderr_path),
        "stackdumps": dumps,
        "last_heartbeat": last_beat,
        "rank_step_time_s": {str(r): round(t, 6) for r, t in rank_step_times(run.heartbeats).items()},
        "fallbacks": fallback_counters(run),
        "files": sorted(p.name for p in run.out_dir.iterdir() if p.is_file()),
    }


def halt_record(out_dir: Path) -> dict[str, Any]:
    """The .HALT file's JSON record ({} for an operator's empty or free-text .HALT)."""
    try:
        rec = json.loads((Path(out_dir) / ".HALT").read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


_RANK_LINE = re.compile(r"^\[rank(\d+)\]: (.*)$")
_TR_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank")
_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Fault|Interrupt|Failure)\b")
_TR_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+)")


def rank_failures(stderr_path: Path, max_bytes: int = 1 << 20) -> dict[str, dict[str, Any]]:
    """Per rank, from a torchrun log: the exception its traceback ended with (torchrun prefixes
    each worker's lines with ``[rankN]:``; they are often far above the tail) and the exit code
    torchrun reported for it (negative: killed by that signal)."""
    try:
        with open(stderr_path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    rank = None
    for ln in text.splitlines():
        m = _RANK_LINE.match(ln)
        if m and _EXC.match(m.group(2)):
            out.setdefault(m.group(1), {})["exception"] = m.group(2).strip()
        t = _TR_RANK.match(ln)
        if t:
            rank = t.group(1)
        e = _TR_EXIT.match(ln)
        if e and rank is not None:
            code = int(e.group(1))
            entry = out.setdefault(rank, {})
            entry["exit_code"] = code
            if code < 0:
                try:
                    entry["signal"] = signal.Signals(-code).name
                except ValueError:
                    entry["signal"] = f"signal {-code}"
            rank = None
    return out


def _summary_metrics(run: RunData, window: int | None) -> dict[str, float | None]:
    """Numbers kept for the report's tables, over the phase's gate window (the first gate that
    names one: 'last 50 steps' for the bucket sweep); gates keep their own windowed values."""
    names = ("toks_per_s_mean", "toks_per_s_stdev", "step_time_s_mean", "mem_reserved_gb_max", "steps_completed",
             "loss_mean", "rank_step_time_ratio", "idle_ranks", "fallbacks_total", "tests_failed", "tests_passed",
             "profiled_steps", "nsa_ranges_found", "python_overhead_frac", "gpu_busy_frac", "cuda_graphs",
             "tokens_per_step")
    return {n: compute(n, run, window) for n in names}


def skip_record(point: PhasePoint, reason: str, hw: dict[str, Any]) -> dict[str, Any]:
    """A point that did not run here (hardware short of the profile): stored so the report can
    say INCOMPLETE and why, never silently dropped."""
    return {
        "key": point.key(), "test_id": point.test_id, "run_id": uuid.uuid4().hex, "kind": point.phase.kind,
        "sweep_index": point.index, "params_order": list(point.params),
        "status": SKIPPED, "reason": reason, "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": 0.0, "command": [], "env": point.env, "overrides": point.overrides, "steps": None,
        "timeout_s": point.phase.timeout_s, "out_dir": "", "exit_code": None, "timed_out": False,
        "world_size": point.nproc, "gates": [], "window": "all steps", "metrics": {},
        "evidence": {"errors": [], "stderr_tail": "", "stderr_log": None, "halt": False, "stackdumps": {},
                     "last_heartbeat": {}, "rank_step_time_s": {}, "fallbacks": {}, "files": []},
        "hardware": hw, "git_sha": None, "backends": None, "env_seen": {}, "noop_toggles": {},
    }
