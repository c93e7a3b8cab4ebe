"""The report's tables as rows for the template: gates, per-phase results, failure evidence,
artifacts and the command that reproduces each point. Records in, plain rows out."""
from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
from pathlib import Path
from typing import Any

from nsa.contract import TRAINING_CSV
from validation import REPO_ROOT
from validation.judge.diagnosis.blame import Kind
from validation.judge.diagnosis.decide import diagnose
from validation.judge.findings.finding import point_label, repeat_part
from validation.judge.findings.headline import verdict_line
from validation.judge.gates import REPEAT_LOSS_METRIC, shown_window
from validation.judge.interval import CONFIDENCE, Interval, interval, repeat_values
from validation.judge.metrics import METRICS
from validation.judge.nodes import NodesEvidence
from validation.judge.provenance import short_commit
from validation.judge.record import OWN_TRAINER, Evidence, PhaseRecord, Status, SubRun, Summary
from validation.judge.unsteady import heartbeat_files
from validation.launch.foreign import CONFIG_COPY

#: the pytest test that runs one phase point (validation/tests/test_acceptance.py)
#: the acceptance tests, named by absolute path: a Reproduce line runs as printed from any directory
ACCEPTANCE_TESTS = REPO_ROOT / "validation" / "tests" / "test_acceptance.py"


def gate_rows(records: list[PhaseRecord]) -> list[dict[str, Any]]:
    """One row per gate: what differs from gate to gate (its value, threshold, window, verdict and
    its own note); what its metric checks is said once, under the table (``metric_legend``), and
    the training.csv files a point's gates read are linked on its first row."""
    rows = []
    for r in records:
        csvs = _gated_csvs(r)
        for i, g in enumerate(r.gates):
            thr: Any = g.threshold if g.threshold is not None else "to be measured"
            if g.threshold_ref:
                thr = f"{cell(thr)} ({g.threshold_ref})"
            # the runbook's words for the gate, else the catalogue's for its metric
            meaning = g.description or (METRICS[g.metric].description if g.metric in METRICS else "")
            rows.append({"phase": r.phase, "point": point_label(r) if g.metric == REPEAT_LOSS_METRIC else gated_run(r),
                         "metric": g.metric, "value": g.value, "op": g.op,
                         "threshold": thr, "window": shown_window(g.metric, g.window), "verdict": str(g.verdict), "csvs": [] if i else csvs,
                         "description": meaning, "note": g.note})
    return rows


def metric_legend(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each metric of the gates table checks, once, in the order the table first names it; a
    metric whose gates carry different words (a runbook's own) once per wording, with its phases."""
    words: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        if row["description"]:
            phases = words.setdefault(row["metric"], {}).setdefault(row["description"], [])
            if row["phase"] not in phases:
                phases.append(row["phase"])
    return [{"metric": metric, "description": text, "phases": phases if len(by_text) > 1 else []}
            for metric, by_text in words.items() for text, phases in by_text.items()]


def _gated_csvs(r: PhaseRecord) -> list[tuple[str, str]]:
    """The training.csv files a record's gates read, each as (link text, path): of a resume point
    whose gates read the resumed run, the first half's (its steps up to the resume) and the second
    half's, each named by its directory; else the record's own run's; none for a point that runs no
    trainer. One an adapter built says so: it is no file the trainer wrote."""
    if r.halves is not None:
        return [(_csv_text(f"{s.name}/{TRAINING_CSV}", s.evidence), f"{s.out_dir}/{TRAINING_CSV}") for s in r.halves]
    if r.kind not in ("train", "resume") or not r.out_dir:
        return []
    return [(_csv_text(TRAINING_CSV, r.evidence), f"{r.out_dir}/{TRAINING_CSV}")]


def _csv_text(name: str, evidence: Evidence | None) -> str:
    """A training.csv link's text: 'training.csv (derived by the hf_trainer adapter)' of one an adapter built."""
    said = evidence.written_by.said(TRAINING_CSV) if evidence and evidence.written_by else None
    return f"{name} ({said})" if said else name


def gated_run(r: PhaseRecord) -> str:
    """The gates table's name of the run whose values a record's gates hold: the point, and for a
    repeated point the repeat that decided it and how every repeat fared ('fused_adamw=False,
    repeat 3 of 3 (every repeat PASS)'): its gate values are that one run's, not the repeats' mean
    that the phase table shows."""
    part = repeat_part(r)
    if not part:
        return point_label(r)
    statuses = [str(s.status) for s in r.runs if s.name.startswith("repeat")]
    fared = (f"every repeat {statuses[0]}" if len(set(statuses)) == 1
             else "repeats: " + ", ".join(f"{k} {st}" for k, st in enumerate(statuses, 1)))
    return f"{point_label(r)}, {part} ({fared})"


def _backends(r: PhaseRecord) -> str | None:
    return ", ".join(f"{s}: {b.backend}" for s, b in r.backends.items()) or None


def _loss(r: PhaseRecord) -> str | None:
    ev = r.evidence
    if ev.loss_first is None and ev.loss_last is None:
        return None
    return f"{cell(ev.loss_first)} → {cell(ev.loss_last)}"


#: marks a point whose timings shared the machine with another timed point
SHARED_MARK = "†"
#: marks a point whose timings were taken while other work kept the machine busy
BUSY_MARK = "‡"


def phase_tables(records: list[PhaseRecord], shared: set[str] | frozenset[str] = frozenset(),
                 busy: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Per phase, one row per point; ``shared``: test ids whose timings shared the machine with
    another timed point, ``busy``: with other work (their speeds are marked,
    validation/judge/timing.py)."""
    phases: dict[str, dict[str, Any]] = {}
    for r in records:
        keys = r.params_order or sorted(r.key.params)
        ph = phases.setdefault(r.phase, {"name": r.phase, "kind": r.kind, "rows": [], "sweep_keys": keys,
                                         "shared": False, "busy": False, "repeats": [], "cpu_memory": False})
        ph["cpu_memory"] = ph["cpu_memory"] or r.accelerator == "cpu"
        m = r.metrics
        mark = (SHARED_MARK if r.test_id in shared else "") + (BUSY_MARK if r.test_id in busy else "")
        ph["shared"] = ph["shared"] or r.test_id in shared
        ph["busy"] = ph["busy"] or r.test_id in busy
        ci = interval(r)
        repeats = [s for s in r.runs if s.name.startswith("repeat")] if r.kind == "train" else []
        if repeats:
            ph["repeats"].append(f"[{point_label(r)}]: " + "; ".join(cell(s.metrics.toks_per_s_mean) for s in repeats))
        ph["rows"].append({
            "point": point_label(r), "params": [r.key.params.get(k) for k in ph["sweep_keys"]],
            "status": str(r.status), "reason": verdict_line(r),
            "mean": _marked(_repeats_mean(r, repeats, ci), mark),
            "stdev": m.toks_per_s_stdev, "step_time": _marked(_step_time(m), mark),
            "mem": _peak_mem(r), "steps": m.steps_completed, "wall_s": r.wall_s,
            "window": r.window, "passed": m.tests_passed, "failed": m.tests_failed,
            "gpu_busy": _marked(m.gpu_busy_frac, mark), "host_pause": m.gpu_host_pause_ms,
            "python_overhead": m.python_overhead_frac,
            "profiled": m.profiled_steps, "nsa_ranges": m.nsa_ranges_found,
            "graphed": m.cuda_graphs, "loss": _loss(r), "backends": _backends(r),
            "top_ops": r.evidence.top_ops, "runs": [_sub_run(r, sub) for sub in r.runs],
            "mfu": _marked(_percent(m.mfu), mark), "flops": m.model_flops_per_token,
        })
    for ph in phases.values():
        ph["title"] = ("Scaling breakdown" if len(ph["sweep_keys"]) > 1 else "Sweep") if ph["sweep_keys"] else None
        ph["sweep_heads"] = [k.split(".")[-1] for k in ph["sweep_keys"]]
        ph["backends"] = _backend_line(ph["rows"])
        ph["flops"] = _flops_line(ph["rows"])
        ph["confidence"] = f"{CONFIDENCE:.0%}"
    return list(phases.values())


#: what a gate of each metric on the spread of tokens/s reads of the phase tables' Stdev, said
#: under them where the report's gates hold one
SPREAD_GATES = {"toks_per_s_stdev": "a `toks_per_s_stdev` gate reads it as it is",
                "toks_per_s_cv": "a `toks_per_s_cv` gate reads it over the window's mean tokens/s"}


def glossary(phases: list[dict[str, Any]], gated: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """What the report's closing 'Reading the tables' explains, once, for the kinds of phase table
    it holds; and the attention backends where every train phase used the same (said once, in
    the environment, instead of under each phase). ``gated``: the metrics the report's gates read
    (the Stdev's line names the gates on it that the runbook has)."""
    train = [ph for ph in phases if ph["kind"] == "train"]
    backends = {(ph["backends"] or "").removesuffix(" (every point)") for ph in train if ph["backends"]}
    one = len(backends) == 1 and all(ph["backends"] for ph in train) and all(
        ";" not in ph["backends"] for ph in train)
    return {"train": bool(train), "cpu_memory": any(ph["cpu_memory"] for ph in train),
            "repeats": any(ph["repeats"] for ph in train), "confidence": f"{CONFIDENCE:.0%}",
            "spread": [said for metric, said in SPREAD_GATES.items() if metric in gated],
            "profile": any(ph["kind"] == "profile" for ph in phases),
            "resume": any(ph["kind"] == "resume" for ph in phases),
            "backends": next(iter(backends)) + (" (every train point)" if len(train) > 1 else "") if one else None}


def _repeats_mean(r: PhaseRecord, repeats: list[SubRun], ci: Interval | None) -> float | str | None:
    """The point's mean tokens/s: of a repeated point its interval over the repeats, and how many
    repeats it is of where some have none (a repeat that crashed before the window). A failed point
    of 3 repeats, two crashed at step 2, showed the third's 69,750 tok/s as the point's, beside the
    steps and loss of a crashed one, and no line said whose number it was."""
    value: float | str | None = r.metrics.toks_per_s_mean if ci is None else f"{cell(ci.mean)} ± {cell(ci.half)}"
    counted = len(repeat_values(r, "toks_per_s_mean"))
    if value is None or not repeats or counted == len(repeats):
        return value
    return f"{cell(value)} ({counted} of {len(repeats)} repeats)"


def _step_time(m: Summary) -> float | str | None:
    """The window's median step time (the typical step, beside the mean tokens/s); a record of an
    older harness holds only the mean, shown as the mean: '2.513 (mean)'."""
    if m.step_time_s_median is not None or m.step_time_s_mean is None:
        return m.step_time_s_median
    return f"{cell(m.step_time_s_mean)} (mean)"


def _peak_mem(r: PhaseRecord) -> float | None:
    """Peak reserved memory: of a repeated point the highest of its repeats' peaks (its record
    holds their mean, which is no run's peak)."""
    peaks = [v for s in r.runs if s.name.startswith("repeat") and (v := s.metrics.mem_reserved_gb_max) is not None]
    return max(peaks) if peaks else r.metrics.mem_reserved_gb_max


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.1f}%"


def _flops_line(rows: list[dict[str, Any]]) -> str | None:
    """The model's training FLOPs per token: once when every point has the same, else per point."""
    counted = [(r["point"], f"{r['flops']:.4g}") for r in rows if r["flops"] is not None]
    if not counted:
        return None
    if len({f for _, f in counted}) == 1:
        return counted[0][1] + (" (every point)" if len(rows) > 1 else "")
    return "; ".join(f"{p}: {f}" for p, f in counted)


def _sub_run(r: PhaseRecord, sub: SubRun) -> dict[str, Any]:
    """One process of a point of several (a repeat; a resume point's reference and halves)."""
    steps = None if sub.first_step is None else f"{sub.first_step}-{sub.last_step}"
    loss = None if sub.loss_first is None else f"{cell(sub.loss_first)} → {cell(sub.loss_last)}"
    return {"point": point_label(r), "label": sub.label, "steps": steps, "exit_code": sub.exit_code, "loss": loss,
            "mean": sub.metrics.toks_per_s_mean, "status": str(sub.status), "reason": sub.reason, "out_dir": sub.out_dir}


def _marked(value: float | None, mark: str) -> Any:
    return value if value is None or not mark else f"{cell(value)} {mark}"


def _backend_line(rows: list[dict[str, Any]]) -> str | None:
    """One line naming each branch's backend: once when every point used the same, else per point."""
    used = [(r["point"], r["backends"]) for r in rows if r["backends"]]
    if not used:
        return None
    if len({b for _, b in used}) == 1:
        return used[0][1] + (" (every point)" if len(rows) > 1 else "")
    return "; ".join(f"{p}: {b}" for p, b in used)


def failure_rows(records: list[PhaseRecord]) -> list[dict[str, Any]]:
    """One row per failed point: its verdict, command and errors, and the end of what it printed:
    the traceback of the rank its diagnosis blames for a crash, where the log holds one (the log's
    own tail ends in torchrun's report that a worker failed, which says nothing of why), else the
    tail of its stderr log."""
    return [{"test_id": r.test_id, "phase": r.phase, "point": point_label(r), "status": str(r.status),
             "reason": verdict_line(r), "command": process_line(r), "errors": r.evidence.errors,
             "stderr_tail": r.evidence.stderr_tail.strip(), "stderr_log": r.evidence.stderr_log, "out_dir": r.out_dir,
             "traceback": _crashed_traceback(r), "unsteady": _unsteady(r)} for r in records if r.failed]


def _unsteady(r: PhaseRecord) -> list[str]:
    """Of a point whose failed toks_per_s_cv gate its heartbeats explain (``GateResult.unsteady``): what
    its slow steps were and where their time went, as its finding says it; else nothing."""
    return [line for g in r.gates if g.unsteady is not None
            for line in (g.unsteady.summary(), *g.unsteady.lines(heartbeat_files(r.out_dir, g.unsteady)))]


def _crashed_traceback(r: PhaseRecord) -> dict[str, Any] | None:
    """The rank a crash is blamed on and its own traceback (RankFailure.traceback); None where the
    diagnosis blames no crashed rank or the log holds no traceback of it."""
    d = diagnose(r)
    if d is None or d.kind != Kind.CRASHED or d.rank is None:
        return None
    fail = r.evidence.rank_failures.get(d.rank)
    return None if fail is None or not fail.traceback else {"rank": d.rank, "text": fail.traceback}


def artifact_rows(records: list[PhaseRecord]) -> list[dict[str, Any]]:
    """Each point's directory and files, and when and at which commit it ran; for a point of
    several processes, each one's."""
    rows = []
    for r in records:
        when = minute(started(r))
        ran = None if when is None else when + (f" at {short_commit(r.ran_at)}" if r.ran_at else "")
        if r.runs:
            rows += [{"phase": r.phase, "point": f"{point_label(r)}, {s.label}", "out_dir": s.out_dir, "files": s.files,
                      "built": _built(s.evidence), "ran": ran} for s in r.runs]
        elif r.out_dir:
            rows.append({"phase": r.phase, "point": point_label(r), "out_dir": r.out_dir, "files": r.evidence.files,
                         "built": _built(r.evidence), "ran": ran})
    return rows


def _built(evidence: Evidence | None) -> list[str]:
    """The files of a run an adapter built, each with what it came from ('`training.csv`, derived by
    the hf_trainer adapter from ...'): listed beside the trainer's, they are none of its own."""
    built = evidence.written_by.built() if evidence and evidence.written_by else {}
    return [f"`{name}`, {said}" for name, said in built.items()]


def started(r: PhaseRecord) -> _dt.datetime | None:
    """When the point started (records of older harnesses: when it was stored); None if unreadable."""
    try:
        t = _dt.datetime.fromisoformat(r.started)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def minute(t: _dt.datetime | None) -> str | None:
    """``t`` to the minute, UTC: 'YYYY-MM-DD HH:MM UTC'."""
    return None if t is None else t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def ran_span(records: list[PhaseRecord]) -> str | None:
    """When the points that ran did ('from A to B', or 'at A'), to the minute, UTC."""
    spans = [(t, t + _dt.timedelta(seconds=r.wall_s)) for r in records if r.out_dir and (t := started(r))]
    if not spans:
        return None
    first, last = minute(min(a for a, _ in spans)), minute(max(b for _, b in spans))
    return f"at {first}" if first == last else f"from {first} to {last}"


def reproduce_rows(records: list[PhaseRecord], runbook: str | None = None, profile: str | None = None,
                   results_dir: str | None = None, root: str = "") -> list[dict[str, Any]]:
    """Per point: the harness command that re-runs its phase (its record replaces this one) and
    the process it ran, with the environment the runbook set. ``runbook`` and ``profile`` are how
    a command line names them (a path for a runbook outside runbooks/); the records' names when
    not given. ``results_dir``: the store the records are in, when not the default ./results.
    ``root``: the assignment of the trainer's root variable that the harness commands start with
    (``root_assignment``), '' where the runbook names its trainer's root by no variable."""
    rows = []
    for r in records:
        if r.status == Status.SKIP or not r.command:
            continue
        nodes = r.evidence.nodes
        # srun --jobid names the allocation it ran in, which the harness released if it asked for it
        note = (f"it ran in Slurm job {nodes.slurm_job_id}, whose allocation may be gone: paste it inside a live "
                "allocation of the same shape with --jobid set to it, or re-run the point with the pytest line"
                if nodes is not None and nodes.launcher == "slurm" else None)
        rows.append({"phase": r.phase, "point": point_label(r), "note": note,
                     "rerun": rerun_line(r, runbook, profile, results_dir, root), "process": process_line(r, fresh=True)})
    return rows


def root_assignment(var: str | None, records: list[PhaseRecord]) -> str:
    """'MY_TRAINER_ROOT=/its/checkout ' for a runbook whose trainer's root is the variable ``var``:
    without it a harness command the report prints launches nothing (the root is not set), so each
    starts with it. The root the newest of ``records`` ran in (its cwd), else the variable as this
    process sees it; '' for no variable, or none known."""
    if var is None:
        return ""
    # the trainer's runs only: this project's pytest points ran in this checkout
    ran = [(t, r.cwd) for r in records if r.cwd and r.out_dir and r.trainer != OWN_TRAINER
           and (t := started(r)) is not None]
    root = max(ran)[1] if ran else os.environ.get(var, "")
    return f"{var}={shlex.quote(root)} " if root else ""


def rerun_line(r: PhaseRecord, runbook: str | None = None, profile: str | None = None,
               results_dir: str | None = None, root: str = "") -> str:
    """The harness command that re-runs only ``r``'s point (its new record replaces ``r``);
    ``root``: as reproduce_rows takes it."""
    store = f" --results-dir={shlex.quote(results_dir)}" if results_dir else ""
    # a sweep point by its test id: -k cannot take the '=' of its parameters
    select = (shlex.quote(f"{ACCEPTANCE_TESTS}::test_phase[{r.test_id}]") if r.key.params
              else f"{shlex.quote(str(ACCEPTANCE_TESTS))} -m {r.phase}")
    return (f"{root}pytest {select} --runbook {shlex.quote(runbook or r.key.runbook)} "
            f"--profile {shlex.quote(profile or r.key.profile)}{store}")


def rerun_phases_line(phases: list[str], runbook: str, profile: str, results_dir: str | None = None,
                      root: str = "") -> str:
    """The harness command (Markdown) that re-runs every point of ``phases`` of this report's
    runbook (its new records replace theirs), as advice names it; ``root``: as reproduce_rows takes it."""
    store = f" --results-dir={shlex.quote(results_dir)}" if results_dir else ""
    return (f"`{root}pytest {shlex.quote(str(ACCEPTANCE_TESTS))} -m {shlex.quote(' or '.join(phases))} "
            f"--runbook {shlex.quote(runbook)} --profile {shlex.quote(profile)}{store}`")


def missing_line(points: list[Any], missing: list[str], runbook: str | None, profile: str | None,
                 results_dir: str | None, root: str = "") -> str:
    """What the report says above the points with no record: that none is stored, and the
    ``nsa-validate run`` line that runs them (their phases, or the whole runbook when every phase
    lacks one). ``runbook`` and ``profile`` as a command line names them; ``results_dir``: the
    store, when not the default ./results; ``root``: as reproduce_rows takes it."""
    ids = set(missing)
    phases = list(dict.fromkeys(p.phase.name for p in points if p.test_id in ids))
    if not phases or runbook is None or profile is None:
        return "No record of these points is stored in this results directory:"
    words = ["nsa-validate", "run", "--runbook", runbook, "--profile", profile]
    words += ["--results-dir", results_dir] if results_dir else []
    every = len(phases) == len({p.phase.name for p in points})
    for ph in [] if every else phases:
        words += ["--phase", ph]
    return (f"No record of these points is stored in this results directory. `{root}{shlex.join(words)}` runs them "
            f"(every point of {'the runbook' if every else 'those phases'}; a new record replaces the point's "
            "stored one):")


def process_line(r: PhaseRecord, fresh: bool = False) -> str:
    """The shell line that runs the point's process by hand: its directory, the environment the
    runbook set, its command; a resume point's processes one after another; '' where it ran none.
    As it ran (the failure evidence), or with ``fresh`` (the Reproduce line) into a new directory
    (``fresh_dir``), never into the stored run's, which its files are the evidence of."""
    if not r.command:
        return ""
    root = _run_root(r) if fresh else None
    quote = shlex.quote if root is None else (lambda text: _quoted(text, root))
    env = " ".join(f"{k}={quote(v)}" for k, v in sorted(r.env.items()))
    # a resume point's processes one after another (each of a repeated point's runs is the same)
    commands = [s.command for s in r.runs if s.command] if r.kind == "resume" else [r.command]
    process = " && ".join((env + " " if env else "") + " ".join(quote(w) for w in c) for c in commands or [r.command])
    nodes = r.evidence.nodes
    if nodes is not None and nodes.launcher == "torchrun" and len(nodes.nodes) > 1 and len(commands) == 1:
        # every node's agent ran here, the same command: all of them side by side (a lone
        # agent only waits out the join timeout for the others)
        process = _every_node(r.command, env, quote, nodes, fresh)
    # a pytest point's test paths are relative to this checkout (a record stored before it kept its cwd)
    cwd = r.cwd or (str(REPO_ROOT) if r.kind == "pytest" else "")
    line = (f"cd {shlex.quote(cwd)} && " if cwd else "") + process
    if root is None:
        return line
    named = [w for c in commands for w in c] + list(r.env.values())
    return f"{FRESH_DIR}=$(mktemp -d \"${{TMPDIR:-/tmp}}/nsa-reproduce.XXXXXX\") && " + \
        f"echo \"writing into ${FRESH_DIR}\" >&2 && " + "".join(_inputs(named, root)) + line


#: the shell variable of the new directory a Reproduce line's process writes into
FRESH_DIR = "out"
#: the shell variable of the rendezvous port a Reproduce line's node agents meet at
FRESH_PORT = "port"


def _every_node(command: list[str], env: str, quote, nodes: NodesEvidence, fresh: bool) -> str:
    """Every node's torchrun agent of a launch on this host, side by side in a subshell that exits
    with the first failure among them in node order, each failure named on stderr: a bare ``wait``
    exits 0 whatever the agents did, and a crashed point re-run by hand read as a success. Each
    agent sees the GPUs the harness gave its node (on a GPU host every node's local rank 0 would
    take the same GPU, which NCCL refuses). With ``fresh`` (the Reproduce line) the agents meet at
    a port free when the line runs, on the rendezvous host: the run's port, free when it ran, may
    be held now (by another run's agents, or by this line run twice at once).

    Ctrl-C stops every agent: the subshell starts each agent as a job of its own (``set -m``), which
    the terminal's Ctrl-C does not reach and which does not ignore SIGINT (a background command of a
    shell without job control ignores it, and torchrun's agent does until its workers start: pasted
    without this, Ctrl-C left the agents running, and the subshell waiting for them); its trap sends
    each agent's process group the signal it got (INT, or TERM), once, as the terminal sends a
    foreground torchrun, then waits for every agent to end and exits 128 + the signal."""
    endpoint = f"--rdzv_endpoint={nodes.rdzv_endpoint}"
    host = nodes.rdzv_endpoint.rsplit(":", 1)[0]
    words = " ".join(f'"--rdzv_endpoint={host}:${{{FRESH_PORT}}}"' if fresh and w == endpoint else quote(w)
                     for w in command)
    # the node's GPUs after the runbook's environment, which may name CUDA_VISIBLE_DEVICES for all of them
    agents = [" ".join([*([env] if env else []), *([f"CUDA_VISIBLE_DEVICES={quote(n.devices)}"] if n.devices else []),
                        words]) + f" & n{n.index}=$!; g=\"$g -$!\"" for n in nodes.nodes]
    pids = " ".join(f"$n{n.index}" for n in nodes.nodes)
    pick = (f"{FRESH_PORT}=$({quote(command[0])} -c 'import socket, sys; s = socket.socket(); "
            f"s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' {quote(host)}) || exit; ") if fresh else ""
    # g: the agents' process groups (job control is on only while they start: off, a job a signal ended
    # is not announced); k counts the signals trapped, so that a wait a trap cut short
    # (it returns 128 + the signal, the agent still running) waits again for that agent's own status
    stop = ("g=; k=0; sig=0; trap 'k=$((k + 1)); sig=130; kill -INT -- $g 2>/dev/null' INT; "
            "trap 'k=$((k + 1)); sig=143; kill -TERM -- $g 2>/dev/null' TERM; set -m; ")
    return (f"( {pick}{stop}" + "; ".join(agents) + f"; set +m; rc=0; i=0; for n in {pids}; do while j=$k; wait \"$n\"; "
            "s=$?; [ \"$j\" != \"$k\" ]; do :; done; [ \"$s\" -eq 0 ] || { "
            "echo \"node $i's torchrun agent exited $s\" >&2; [ \"$rc\" -ne 0 ] || rc=$s; }; i=$((i + 1)); done; "
            "[ \"$sig\" -eq 0 ] || rc=$sig; exit \"$rc\" )")


def _run_root(r: PhaseRecord) -> str | None:
    """The stored run's directory as its command names it (absolute), the directory of a point of
    several processes (a resume point's, a repeated one's) rather than the one process's; None
    where its command names none (nothing to write elsewhere)."""
    if not r.out_dir:
        return None
    rel = Path(r.out_dir)
    if any(s.out_dir == r.out_dir for s in r.runs):
        rel = rel.parent
    words = [w for c in [r.command, *(s.command for s in r.runs)] if c for w in c] + list(r.env.values())
    return next((m.group(0) for w in words if (m := _path_of(str(rel)).search(w))), None)


def _path_of(rel: str) -> re.Pattern[str]:
    """An absolute path ending in ``rel`` inside a word ('--out-dir=/r/runs/x', 'a=1 b=/r/runs/x/first')."""
    return re.compile(r"(?<![^\s=:,])/(?:[^\s=:,]*/)?" + re.escape(rel) + r"(?=[/\s=:,]|$)")


def _quoted(word: str, root: str) -> str:
    """``word`` for the shell with the stored run's directory ``root`` as the new one's variable."""
    if root not in word:
        return shlex.quote(word)
    return '"' + f"${{{FRESH_DIR}}}".join(re.sub(r'([\\$`"])', r"\\\1", part) for part in word.split(root)) + '"'


def _inputs(words: list[str], root: str) -> list[str]:
    """Shell steps that give the new directory what the process reads from the stored run's: its
    sub-directories the commands name (a resume point's halves), and the config copy the harness
    wrote there before the launch (validation/launch/foreign.py), with the stored run's directory
    in it made the new one."""
    steps, seen = [], set()
    for w in words:
        for m in re.finditer(re.escape(root) + r"(/[^\s=:,]*)?", w):
            path, rest = Path(m.group(0)), m.group(1) or ""
            if rest in seen or not rest:
                continue
            seen.add(rest)
            target = _quoted(m.group(0), root)
            if path.is_dir():
                steps.append(f"mkdir -p {target} && ")
            elif path.name == CONFIG_COPY and path.is_file():
                steps.append(f"mkdir -p \"$(dirname {target})\" && sed {shlex.quote(f's|{root}|')}\"${FRESH_DIR}\"'|g' "
                             f"{shlex.quote(str(path))} > {target} && ")
    return steps


def toggles(records: list[PhaseRecord]) -> dict[str, list[str]]:
    """NSA_*/NCCL_* variables the trainer recorded (env.json), and the ones it reports as no-ops."""
    seen: dict[str, set[str]] = {}
    noop: dict[str, str] = {}
    for r in records:
        for k, v in r.env_seen.items():
            seen.setdefault(k, set()).add(str(v))
        noop.update({k: str(v) for k, v in r.noop_toggles.items()})
    return {"seen": [f"{k}={'/'.join(sorted(v))}" for k, v in sorted(seen.items())],
            "noop": [f"{k} ({v})" for k, v in sorted(noop.items())]}


def counts(records: list[PhaseRecord], missing: list[str]) -> dict[str, int]:
    out = {str(s): 0 for s in Status}
    for r in records:
        out[str(r.status)] += 1
    out["NOT RUN"] = len(missing)
    return out


def cell(value: Any) -> str:
    """A value made safe for one Markdown table cell; large numbers with thousands separators."""
    if value is None:
        return "—"
    if isinstance(value, float):
        value = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")
