"""Automatic findings: what a person would otherwise dig out of logs, CSVs and stack dumps.

Each detector reads stored records only (plain dicts), so findings can be recomputed for any
results directory without re-running anything. A finding is a dict: severity (critical,
warning, info), phase, title and detail lines.
"""
from __future__ import annotations

import re
from typing import Any

from .pace import fit_step_time

#: a sweep point is a cliff when its tokens/s falls below this fraction of the best earlier point
CLIFF_FRACTION = 0.25
#: slowest / fastest rank median step time above which ranks are called imbalanced
IMBALANCE_RATIO = 1.5
_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception|Interrupt)|RuntimeError|AssertionError)\b.*")


def point_params(rec: dict[str, Any]) -> list[tuple[str, Any]]:
    """The record's sweep parameters in the runbook's sweep order (the store sorts keys)."""
    params = rec["key"].get("params") or {}
    order = rec.get("params_order") or sorted(params)
    return [(k, params[k]) for k in order if k in params]


def point_label(rec: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point_params(rec)) or "default"


_point = point_label


def _f(severity: str, rec_or_phase: Any, title: str, detail: list[str] | None = None) -> dict[str, Any]:
    phase = rec_or_phase["key"]["phase"] if isinstance(rec_or_phase, dict) else rec_or_phase
    return {"severity": severity, "phase": phase, "title": title, "detail": detail or []}


def crashes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        ev = r["evidence"]
        halt = ev.get("halt_record") or {}
        if r["kind"] == "train" and ev.get("halt") and halt.get("source") == "nonfinite":
            losses = halt.get("losses") or []
            bad = [i for i, v in enumerate(losses) if not (isinstance(v, (int, float)) and abs(v) < float("inf"))]
            title = (f"non-finite loss in {r['key']['phase']} [{_point(r)}] at step {halt.get('step')}: "
                     f"{'rank' if len(bad) == 1 else 'ranks'} {', '.join(map(str, bad)) or '?'} (loss per rank {losses}, grad_norm "
                     f"{halt.get('grad_norm')}); halted before the optimizer step")
            out.append(_f("critical", r, title, [f".HALT: {r['out_dir']}/.HALT"] + _rank_lines(r)))
            continue
        if r["status"] == "FAIL" and r.get("exit_code") not in (0, None) and not ev.get("halt") \
                and r["kind"] == "train":
            tail = ev.get("stderr_tail", "")
            last_err = exception_line(tail)
            title = f"crash in {r['key']['phase']} [{_point(r)}]: exit code {r['exit_code']}"
            root = _root_rank(ev.get("rank_failures") or {})
            if root is not None:
                fail = ev["rank_failures"][root]
                cause = (f"killed by {fail['signal']}" if fail.get("signal") and not fail.get("exception")
                         else fail.get("exception") or f"exit code {fail.get('exit_code')}")
                title += f": rank {root}: {cause}"
            elif last_err:
                title += f": {last_err}"
            out.append(_f("critical", r, title, [f"stderr: {r['out_dir']}/{ev.get('stderr_log')}"] + _rank_lines(r)))
    return out


_VICTIM = re.compile(r"Connection closed by peer|remote worker|Connection reset|DistBackendError|NCCL|"
                     r"ProcessGroup|Broken pipe", re.IGNORECASE)


def _root_rank(failures: dict[str, dict[str, Any]]) -> str | None:
    """The rank that failed first in its own right: killed by a signal other than torchrun's
    SIGTERM, or an exception that is not a peer's collective breaking under it."""
    def own(f: dict[str, Any]) -> bool:
        if f.get("exception"):
            return not _VICTIM.search(f["exception"])
        return bool(f.get("signal")) and f["signal"] != "SIGTERM"
    roots = [rank for rank, f in sorted(failures.items(), key=lambda kv: int(kv[0])) if own(f)]
    return roots[0] if roots else None


def _rank_lines(r: dict[str, Any]) -> list[str]:
    """Where each rank was (last heartbeat) and how it ended (torchrun's log)."""
    ev = r["evidence"]
    beats, fails = ev.get("last_heartbeat") or {}, ev.get("rank_failures") or {}
    lines = []
    for rank in sorted(set(beats) | set(fails), key=int):
        hb, f = beats.get(rank) or {}, fails.get(rank) or {}
        line = f"rank {rank}: last heartbeat step {hb.get('step', '?')}, stage {hb.get('stage', '?')}"
        if f.get("exception"):
            line += f"; {f['exception']}"
        elif f.get("signal"):
            line += f"; killed by {f['signal']}"
        elif "exit_code" in f:
            line += f"; exit code {f['exit_code']}"
        lines.append(line)
    return lines


def exception_line(text: str) -> str | None:
    """The exception of the last Python traceback in ``text`` ('pkg.Error: message'), else the
    last line that looks like an error."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            for ln in lines[i + 1:]:
                if ln and not ln[0].isspace():
                    return ln.strip()
            break
    return next((ln.strip() for ln in reversed(lines) if _ERROR_LINE.match(ln)), None)


def stalls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Watchdog .HALT or harness timeout: where each rank was (heartbeat) and what it was doing
    (the innermost frames of its stack dump)."""
    out = []
    for r in records:
        ev = r["evidence"]
        if not (ev.get("halt") or r.get("timed_out")):
            continue
        if not r.get("timed_out") and (ev.get("halt_record") or {}).get("source") not in (None, "watchdog"):
            continue  # a NaN guard's or an operator's .HALT is no stall
        how = "watchdog .HALT" if ev.get("halt") else f"killed at the {r.get('timeout_s'):g}s timeout"
        detail = []
        ranks = sorted(set(ev.get("last_heartbeat", {})) | set(ev.get("stackdumps", {})), key=int)
        stuck = []
        for rank in ranks:
            hb = ev.get("last_heartbeat", {}).get(rank, {})
            line = f"rank {rank}: last heartbeat step {hb.get('step', '?')}, stage {hb.get('stage', '?')}"
            dump = ev.get("stackdumps", {}).get(rank)
            if dump and dump["frames"]:
                top = dump["frames"][0]
                line += f"; stack ({dump['path']}): " + " <- ".join(
                    f"{fr['func']} ({_short(fr['file'])}:{fr['line']})" for fr in dump["frames"][:4])
                stuck.append(f"rank {rank} in {top['func']}")
            else:
                line += "; no stack dump"
            if dump and dump.get("header"):
                line += f" [{dump['header']}]"
            detail.append(line)
        if not ranks:
            detail.append("no heartbeats and no stack dumps were written")
        where = f": {'; '.join(stuck)}" if stuck else ""
        out.append(_f("critical", r, f"stall in {r['key']['phase']} [{_point(r)}] ({how}){where}", detail))
    return out


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def cliffs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In each swept phase, in sweep order: the first point whose tokens/s drops below
    CLIFF_FRACTION of the best earlier point (the seeds' 165 -> 6 tokens/s at batch 2)."""
    out = []
    for phase, recs in _by_phase(records).items():
        recs = [r for r in recs if r["key"].get("params") and r["metrics"].get("toks_per_s_mean") is not None]
        best: dict[str, Any] | None = None
        for r in sorted(recs, key=lambda r: r.get("sweep_index", 0)):
            v = r["metrics"]["toks_per_s_mean"]
            if best is not None and v < CLIFF_FRACTION * best["metrics"]["toks_per_s_mean"]:
                b = best["metrics"]["toks_per_s_mean"]
                out.append(_f("critical", r, (
                    f"throughput cliff in {phase} at [{_point(r)}]: {v:.1f} toks/s after {b:.1f} toks/s at "
                    f"[{_point(best)}] ({b / max(v, 1e-9):.1f}x drop)"),
                    [f"CSV: {r['out_dir']}/training.csv ({r.get('window', 'all steps')})"]))
                break
            if best is None or v > best["metrics"]["toks_per_s_mean"]:
                best = r
    return out


def imbalance(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        ev, m = r["evidence"], r["metrics"]
        if r.get("timed_out") or r.get("exit_code") not in (0, None):
            continue  # a crash or stall has its own finding; its ranks are not 'idle'
        times = {int(k): v for k, v in ev.get("rank_step_time_s", {}).items()}
        beats = ev.get("last_heartbeat", {})
        world = r.get("world_size") or 1
        if m.get("idle_ranks"):
            detail = []
            for rank in range(world):
                hb = beats.get(str(rank))
                if hb is None:
                    detail.append(f"rank {rank}: no heartbeat file")
                else:
                    util = hb.get("gpu_util")
                    detail.append(f"rank {rank}: last step {hb.get('step', '?')}, stage {hb.get('stage', '?')}"
                                  + (f", GPU util {util:g}%" if isinstance(util, (int, float)) else "")
                                  + (f", median step time {times[rank]:.3g}s" if rank in times else ""))
            out.append(_f("critical", r, f"idle rank in {r['key']['phase']} [{_point(r)}]: "
                                         f"{int(m['idle_ranks'])} of {world} rank(s) did no work", detail))
        elif len(times) >= 2 and min(times.values()) > 0 and max(times.values()) / min(times.values()) > IMBALANCE_RATIO:
            slow = max(times, key=times.get)
            fast = min(times, key=times.get)
            out.append(_f("warning", r, (
                f"rank imbalance in {r['key']['phase']} [{_point(r)}]: rank {slow} takes "
                f"{times[slow] / times[fast]:.1f}x as long per step as rank {fast}"),
                [f"rank {k}: median step time {v:.3g}s" for k, v in sorted(times.items())]))
    return out


def _tokens_per_step(rec: dict[str, Any]) -> float | None:
    """The point's global tokens per optimizer step: recorded from env.json, else tokens/s x
    step time (records written before the metric existed)."""
    m = rec["metrics"]
    if m.get("tokens_per_step"):
        return float(m["tokens_per_step"])
    if m.get("toks_per_s_mean") and m.get("step_time_s_mean"):
        return float(m["toks_per_s_mean"]) * float(m["step_time_s_mean"])
    return None


def host_bound(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In each swept phase whose points differ in tokens per step: when the step time barely
    grows with the tokens (a fitted fixed cost per step of at least half the step at the largest
    point, validation/pace.py), a finding with the fit, so a reader knows why tokens/s is low."""
    out = []
    for phase, recs in _by_phase(records).items():
        done = [r for r in recs if r["kind"] == "train" and r.get("exit_code") == 0 and not r.get("timed_out")
                and r["metrics"].get("step_time_s_mean")]
        points = [(_tokens_per_step(r), r["metrics"]["step_time_s_mean"]) for r in done]
        fit = fit_step_time([(t, s) for t, s in points if t])
        if fit is None or not fit.host_bound:
            continue
        lo, hi = min(fit.tokens), max(fit.tokens)
        out.append(_f("warning", phase, (
            f"host-bound steps in {phase}: step time {min(fit.step_s):.3g}-{max(fit.step_s):.3g} s while tokens "
            f"per step grow {fit.token_range:.1f}x ({lo:,.0f} -> {hi:,.0f})"), [
            f"fitted step time = {fit.fixed_s * 1e3:.1f} ms fixed + {fit.per_token_s * 1e9:.1f} ms per million "
            f"tokens (least squares over {len(fit.tokens)} points)",
            f"the fixed cost is {fit.fixed_share:.0%} of the step at the largest point: work that does not grow "
            "with the batch (the host launching kernels, the optimizer, the gradient all-reduce) sets the pace, "
            "so tokens/s grows only with tokens per step; CUDA graphs (train.cuda_graphs) remove the launch cost"]))
    return out


def fallbacks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding for all runs that reported fallbacks (heartbeat counters, or a route whose
    reason says fallback), one detail line per run: on CPU every run falls back somewhere, and
    one line per run reads better than one finding per run."""
    lines, names = [], set()
    for r in records:
        counters = {k: v for k, v in (r["evidence"].get("fallbacks") or {}).items() if v}
        routed = {stage: b for stage, b in (r.get("backends") or {}).items()
                  if isinstance(b, dict) and ("fallback" in str(b.get("reason", "")).lower() or b.get("backend") == "mixed")}
        if counters or routed:
            names |= set(counters) | {f"{s} route" for s in routed}
            parts = [f"{k}: {v:g}" for k, v in sorted(counters.items())]
            parts += [f"{stage}: backend {b.get('backend')} ({b.get('reason')})" for stage, b in sorted(routed.items())]
            lines.append(f"{r['key']['phase']} [{_point(r)}]: " + "; ".join(parts))
    if not lines:
        return []
    return [_f("warning", "several" if len({ln.split(' [')[0] for ln in lines}) > 1 else lines[0].split(" [")[0],
               f"fallbacks in {len(lines)} of {len(records)} run(s): {', '.join(sorted(names))}", lines)]


def artifact_errors(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_f("critical", r, f"{r['key']['phase']} [{_point(r)}]: {r['reason']}", r["evidence"]["errors"][1:])
            for r in records if r["status"] == "ERROR"]


def bucket_choice(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runbook's rule for a sweep of one parameter: highest mean wins, a tie (within 1%)
    goes to the lower stdev."""
    out = []
    for phase, recs in _by_phase(records).items():
        recs = [r for r in recs if len(r["key"].get("params") or {}) == 1 and r["status"] in ("PASS", "UNMEASURED")
                and r["metrics"].get("toks_per_s_mean") is not None]
        if len(recs) < 2:
            continue
        top = max(r["metrics"]["toks_per_s_mean"] for r in recs)
        tied = [r for r in recs if r["metrics"]["toks_per_s_mean"] >= 0.99 * top]
        best = min(tied, key=lambda r: r["metrics"].get("toks_per_s_stdev") or 0.0)
        m = best["metrics"]
        out.append(_f("info", best, f"best setting in {phase}: {_point(best)} "
                                    f"(mean {m['toks_per_s_mean']:.1f} toks/s, stdev {m.get('toks_per_s_stdev') or 0:.1f}, "
                                    f"{best.get('window', 'all steps')})"))
    return out


def _by_phase(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["key"]["phase"], []).append(r)
    return out


DETECTORS = (crashes, stalls, cliffs, host_bound, imbalance, fallbacks, artifact_errors, bucket_choice)
_ORDER = {"critical": 0, "warning": 1, "info": 2}


def find(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [f for detect in DETECTORS for f in detect(records)]
    return sorted(out, key=lambda f: _ORDER[f["severity"]])
