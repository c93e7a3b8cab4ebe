"""GO / NO-GO reports: stored records -> a flat context -> Jinja template (reports/report.md.j2)
-> Markdown, plus PNG plots of tokens/s and memory over steps.

Status: NO-GO when any point failed or errored; INCOMPLETE when a point of the runbook has no
record, was skipped, or has a threshold still 'to be measured'; GO otherwise.
"""
from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from . import TEMPLATE_DIR
from .errors import ArtifactError
from .findings import find, point_label, point_params
from .plan import expand
from .runbook import Profile, Runbook
from .store import ResultStore

GO, NO_GO, INCOMPLETE = "GO", "NO-GO", "INCOMPLETE"
_BADGE = {GO: "✅", NO_GO: "❌", INCOMPLETE: "⏳"}


def _cell(value: Any) -> str:
    """A value made safe for one Markdown table cell."""
    if value is None:
        return "—"
    if isinstance(value, float):
        value = f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _env() -> jinja2.Environment:
    # Markdown, not HTML: escaping is the `cell` filter's job, so autoescape is off on purpose.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["cell"] = _cell
    return env


_point = point_label


def status_of(records: list[dict[str, Any]], missing: list[str],
              findings: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    failed = [r for r in records if r["status"] in ("FAIL", "ERROR")]
    critical = [f for f in findings or [] if f["severity"] == "critical"]
    if critical and not failed:
        return NO_GO, f"{len(critical)} critical finding(s) across phase points: {critical[0]['title']}"
    if failed:
        return NO_GO, f"{len(failed)} of {len(records) + len(missing)} phase point(s) failed: " + ", ".join(
            f"{r['key']['phase']} [{_point(r)}]" for r in failed[:6]) + (" ..." if len(failed) > 6 else "")
    pending = [r for r in records if r["status"] in ("SKIP", "UNMEASURED")]
    if missing or pending:
        parts = []
        if missing:
            parts.append(f"{len(missing)} point(s) not run")
        if pending:
            parts.append(f"{len(pending)} skipped or without a measured threshold")
        return INCOMPLETE, "; ".join(parts)
    if not records:
        return INCOMPLETE, "no results stored"
    return GO, f"all {len(records)} phase point(s) passed their gates"


def build_context(results_dir: Path, runbook_name: str, profile_name: str, *, runbook: Runbook | None,
                  profile: Profile | None, plots: list[dict[str, str]] | None = None,
                  now: str | None = None) -> dict[str, Any]:
    store = ResultStore(results_dir)
    records = store.records(runbook_name, profile_name)
    missing: list[str] = []
    stale = 0
    if runbook is not None and profile is not None:
        points = expand(runbook, profile)
        order = {p.test_id: i for i, p in enumerate(points)}
        stale = sum(r["test_id"] not in order for r in records)
        records = sorted((r for r in records if r["test_id"] in order), key=lambda r: order[r["test_id"]])
        have = {r["test_id"] for r in records}
        missing = [p.test_id for p in points if p.test_id not in have]
    else:
        records = sorted(records, key=lambda r: (r["key"]["phase"], r.get("sweep_index", 0)))
    findings = find(records)
    status, why = status_of(records, missing, findings)
    hw = next((r["hardware"] for r in records if r.get("hardware")), {})
    sha_record = next((r for r in records if r.get("git_sha")), {})
    return {
        "title": f"NSA Acceptance Report: {runbook_name} on {profile_name}",
        "status": status,
        "badge": _BADGE[status],
        "status_reason": why,
        "generated": now or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runbook": runbook_name,
        "runbook_path": _rel(runbook.path) if runbook else None,
        "runbook_source": runbook.source if runbook else None,
        "profile": profile_name,
        "profile_description": profile.description if profile else None,
        "profile_hardware": _hw_need(profile) if profile else None,
        "profile_notes": profile.notes if profile else None,
        "hardware": _hw_text(hw),
        "torch": hw.get("torch"),
        "cuda": hw.get("cuda"),
        "python": hw.get("python"),
        "hostname": hw.get("hostname"),
        "git_sha": sha_record.get("git_sha"),
        "git_sha_source": sha_record.get("git_sha_source"),
        "counts": _counts(records, missing),
        "toggles": _toggles(records),
        "findings": findings,
        "gates": _gate_rows(records),
        "phases": _phase_tables(records),
        "failures": _failures(records),
        "missing": missing,
        "stale": stale,
        "artifacts": _artifacts(records),
        "plots": plots or [],
    }


def _rel(path: Path) -> str:
    from . import REPO_ROOT
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _hw_need(p: Profile) -> str:
    h = p.hardware
    if h.accelerator == "cpu":
        return "CPU (no GPU needed)"
    need = f"{max(h.min_gpus, 1)}x CUDA GPU"
    if h.gpu_name:
        need += f" ({h.gpu_name})"
    if h.min_gpu_mem_gb:
        need += f", >= {h.min_gpu_mem_gb:g} GiB each"
    return need


def _hw_text(hw: dict[str, Any]) -> str:
    if not hw:
        return "unknown (no records)"
    if hw.get("gpu_count"):
        return f"{hw['gpu_count']}x {', '.join(sorted(set(hw['gpu_names'])))} ({min(hw['gpu_mem_gb'])} GiB) on {hw.get('hostname')}"
    return f"CPU only, {hw.get('cpu_count')} cores, on {hw.get('hostname')}"


def _toggles(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """NSA_*/NCCL_* variables the trainer recorded (env.json), and the ones it reports as no-ops."""
    seen: dict[str, set[str]] = {}
    noop: dict[str, str] = {}
    for r in records:
        for k, v in (r.get("env_seen") or {}).items():
            seen.setdefault(k, set()).add(str(v))
        for k, v in (r.get("noop_toggles") or {}).items():
            noop[k] = str(v)
    return {"seen": [f"{k}={'/'.join(sorted(v))}" for k, v in sorted(seen.items())],
            "noop": [f"{k} ({v})" for k, v in sorted(noop.items())]}


def _counts(records: list[dict[str, Any]], missing: list[str]) -> dict[str, int]:
    out = {k: 0 for k in ("PASS", "FAIL", "ERROR", "SKIP", "UNMEASURED")}
    for r in records:
        out[r["status"]] = out.get(r["status"], 0) + 1
    out["NOT RUN"] = len(missing)
    return out


def _gate_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        csv = f"{r['out_dir']}/training.csv" if r["kind"] == "train" else None
        for g in r["gates"]:
            thr = g["threshold"] if g["threshold"] is not None else "to be measured"
            if g.get("threshold_ref"):
                thr = f"{_cell(thr)} ({g['threshold_ref']})"
            rows.append({"phase": r["key"]["phase"], "point": _point(r), "metric": g["metric"], "value": g["value"],
                         "op": g["op"], "threshold": thr, "window": g["window"], "verdict": g["verdict"], "csv": csv})
    return rows


def _phase_tables(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    phases: dict[str, dict[str, Any]] = {}
    for r in records:
        ph = phases.setdefault(r["key"]["phase"], {"name": r["key"]["phase"], "kind": r["kind"], "rows": [],
                                                  "sweep_keys": [k for k, _ in point_params(r)]})
        m = r["metrics"]
        ph["rows"].append({
            "point": _point(r), "params": [(r["key"].get("params") or {}).get(k) for k in ph["sweep_keys"]],
            "status": r["status"], "reason": r["reason"], "mean": m.get("toks_per_s_mean"),
            "stdev": m.get("toks_per_s_stdev"), "step_time": m.get("step_time_s_mean"),
            "mem": m.get("mem_reserved_gb_max"), "steps": m.get("steps_completed"), "wall_s": r["wall_s"],
            "window": r.get("window", "all steps"), "passed": m.get("tests_passed"), "failed": m.get("tests_failed"),
            "gpu_busy": m.get("gpu_busy_frac"), "python_overhead": m.get("python_overhead_frac"),
            "profiled": m.get("profiled_steps"), "nsa_ranges": m.get("nsa_ranges_found"),
            "graphed": m.get("cuda_graphs"),
        })
    for ph in phases.values():
        ph["title"] = ("Scaling breakdown" if len(ph["sweep_keys"]) > 1 else "Sweep") if ph["sweep_keys"] else None
        ph["sweep_heads"] = [k.split(".")[-1] for k in ph["sweep_keys"]]
    return list(phases.values())


def _failures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if r["status"] not in ("FAIL", "ERROR"):
            continue
        ev = r["evidence"]
        out.append({"test_id": r["test_id"], "phase": r["key"]["phase"], "point": _point(r), "status": r["status"],
                    "reason": r["reason"], "command": " ".join(r["command"]), "errors": ev.get("errors", []),
                    "stderr_tail": ev.get("stderr_tail", "").strip(), "out_dir": r["out_dir"]})
    return out


def _artifacts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"phase": r["key"]["phase"], "point": _point(r), "out_dir": r["out_dir"],
             "files": r["evidence"].get("files", [])} for r in records]


# ------------------------------------------------------------------------------------ plots
def make_plots(results_dir: Path, records: list[dict[str, Any]], plot_dir: Path, stem: str) -> list[dict[str, str]]:
    """Per train phase, one PNG of tokens/s and one of reserved memory over steps, one line per
    sweep point. Points whose CSV is gone or unreadable are left out of the plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .artifacts import read_training_csv

    by_phase: dict[str, list[tuple[str, Any]]] = {}
    for r in records:
        if r["kind"] != "train":
            continue
        try:
            df = read_training_csv(results_dir / r["out_dir"])
        except ArtifactError:
            continue
        by_phase.setdefault(r["key"]["phase"], []).append((_point(r), df))
    out = []
    plot_dir.mkdir(parents=True, exist_ok=True)
    for phase, series in by_phase.items():
        for col, label, suffix in (("toks_per_s", "tokens/s (global)", "toks"), ("mem_reserved_gb", "reserved memory (GB)", "mem")):
            fig, ax = plt.subplots(figsize=(7, 3.5))
            for name, df in series:
                ax.plot(df["step"], df[col], label=name, linewidth=1.2)
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.set_title(f"{phase}: {label}")
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(fontsize=7)
            fig.tight_layout()
            path = plot_dir / f"{stem}__{phase}_{suffix}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            out.append({"phase": phase, "title": f"{phase}: {label}", "path": os.path.relpath(path, plot_dir.parent)})
    return out


def render(results_dir: str | Path, runbook_name: str, profile_name: str, *, runbook: Runbook | None = None,
           profile: Profile | None = None, plots: bool = True, now: str | None = None,
           template: str = "report.md.j2") -> Path:
    """Write <results>/reports/<runbook>__<profile>.md (and its plots); return its path."""
    results_dir = Path(results_dir)
    report_dir = results_dir / "reports"
    stem = f"{runbook_name}__{profile_name}"
    plot_list: list[dict[str, str]] = []
    if plots:
        recs = ResultStore(results_dir).records(runbook_name, profile_name)
        plot_list = make_plots(results_dir, recs, report_dir / "plots", stem)
    ctx = build_context(results_dir, runbook_name, profile_name, runbook=runbook, profile=profile,
                        plots=plot_list, now=now)
    ctx["results_prefix"] = os.path.relpath(results_dir, report_dir)
    text = render_text(ctx, template)
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"{stem}.md"
    # a unique temp file: two harness runs rendering the same report must not share one
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=report_dir)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a report is for everyone
        os.replace(tmp, path)
    except BaseException:  # an interrupt leaves the previous report, and no temp file
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def render_text(ctx: dict[str, Any], template: str = "report.md.j2") -> str:
    return _env().get_template(template).render(**ctx)
