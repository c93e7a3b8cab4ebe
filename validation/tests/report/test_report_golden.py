"""Report rendering against golden Markdown files. Records are fabricated, so the output is
byte-for-byte stable; regenerate after an intended template change with
``UPDATE_GOLDEN=1 pytest validation/tests/report/test_report_golden.py`` and review the diff."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from validation import REPO_ROOT
from validation.judge.gates import check
from validation.judge.record import PhaseRecord
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store.results import ResultStore

GOLDEN = Path(__file__).parents[1] / "golden"
HW = {"hostname": "ci", "python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "cpu_count": 2, "gpu_names": [],
      "gpu_mem_gb": []}
FRAMES = [{"file": "/x/torch/autograd/graph.py", "line": 825, "func": "_engine_run_backward"},
          {"file": "/x/nsa/train/loop.py", "line": 91, "func": "train_step"},
          {"file": "/x/nsa/train/__main__.py", "line": 12, "func": "<module>"}]


_VALUES = {"loss_finite": 1.0, "toks_per_s_cv": 0.05, "tests_passed": 3.0, "profiled_steps": 3.0,
           "backends_recorded": 1.0, "steps_completed": 6.0, "loss_drop": 2.0}


def record(point, status="PASS", toks=200.0, gate_values=None, **over):
    """A stored record of ``point``; the points ran one after another (a minute apart)."""
    values = {**_VALUES, "toks_per_s_mean": toks, **(gate_values or {})}
    gates = []
    for g in point.gates():
        v = values.get(g.metric, 0.0)
        gates.append({"metric": g.metric, "op": g.op, "threshold": g.threshold, "window": g.window.describe(), "value": v,
                      "verdict": check(v, g.op, g.threshold), "threshold_ref": g.threshold_ref, "description": g.description})
    rec = {
        "key": point.key(), "test_id": point.test_id, "kind": point.phase.kind, "sweep_index": point.index,
        "params_order": list(point.params), "status": status, "reason": "2 gate(s) passed" if status == "PASS" else "gate failed",
        "started": f"2026-01-01T{list(_points().values()).index(point):02d}:00:00+00:00", "wall_s": 4.2, "command": ["python", "-m", "nsa.train", "--config", "tiny"],
        "env": point.env, "overrides": point.overrides, "steps": point.phase.steps, "timeout_s": point.phase.timeout_s,
        "out_dir": f"runs/{point.runbook.name}/cpu/{point.phase.name}/{point.slug}", "exit_code": 0, "timed_out": False,
        "world_size": point.nproc, "gates": gates, "window": "last 5 steps",
        "metrics": {"toks_per_s_mean": toks, "toks_per_s_stdev": 1.5, "step_time_s_mean": 0.25, "mem_reserved_gb_max": 0.0,
                    "steps_completed": float(point.phase.steps), "tests_passed": 3.0, "tests_failed": 0.0, "idle_ranks": 0.0,
                    "tokens_per_step": None, "model_flops_per_token": None},
        "evidence": {"errors": [], "stderr_tail": "", "stderr_log": "trainer.stderr.log", "halt": None, "stackdumps": {},
                     "last_heartbeat": {}, "rank_step_time_s": {}, "fallbacks": {}, "files": ["env.json", "training.csv"]},
        "hardware": HW, "git_sha": "abc123", "git_sha_source": "git describe", "backends": {"cmp": {"backend": "torch", "reason": "portable", "calls": 4}},
    }
    if point.phase.kind == "resume":
        rec.update(_resumed(point, rec["out_dir"]))
    for k, v in over.items():
        (rec["evidence"] if k in rec["evidence"] else rec["metrics"] if k in rec["metrics"] else rec)[k] = v
    return PhaseRecord.from_json(rec, point.test_id)


def _resumed(point, run_dir: str) -> dict:
    """A resume point's three processes, its resume gates, and the second half as its directory."""
    n, total = point.phase.resume_after, point.phase.steps
    legs = [("reference", f"uninterrupted run (steps 1-{total})", 1, total), ("first", f"first half (steps 1-{n}, stopped)", 1, n),
            ("second", f"resumed second half (steps {n + 1}-{total})", n + 1, total)]
    gate = {"op": "<=", "threshold": 0.0, "window": f"steps 1-{total}, stopped after {n}", "value": 0.0, "verdict": "PASS",
            "threshold_ref": "resume_loss_rtol"}
    return {"out_dir": f"{run_dir}/second",
            "runs": [{"name": name, "label": label, "out_dir": f"{run_dir}/{name}", "status": "PASS",
                      "reason": f"exit 0 after step {last}", "exit_code": 0, "first_step": first, "last_step": last,
                      "loss_first": 5.6 - first / 10, "loss_last": 5.6 - last / 10, "files": ["env.json", "training.csv"],
                      "command": ["python", "-m", "nsa.train", "--config", "tiny", "--out-dir", name]}
                     for name, label, first, last in legs],
            "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1.0, "window": "all steps", "value": 1.0,
                       "verdict": "PASS"},
                      {**gate, "metric": "resume_loss_rel_diff", "note": f"loss of steps 1-{total} continued: identical at every logged step",
                       "description": "loss per step of the resumed run against an uninterrupted run of the same seed"},
                      {**gate, "metric": "resume_lr_rel_diff", "note": f"learning rate of steps 1-{total} continued: identical at every logged step",
                       "description": "learning rate per step of the resumed run against an uninterrupted run of the same seed"},
                      {"metric": "resume_data_gap", "op": "==", "threshold": 0.0, "window": "env.json data_position", "value": 0.0,
                       "verdict": "PASS", "note": f"the first half ended at data position {n} and the resumed run started at {n}",
                       "description": "the resumed run's data starts where the first half's ended"},
                      {"metric": "resume_first_step", "op": ">", "threshold": float(n),
                       "window": "the second half's own records", "value": float(n + 1), "verdict": "PASS",
                       "note": f"the second half began at step {n + 1} (rank 0's heartbeats), the first after the stop",
                       "description": "the first step the resumed second half trained: after the stop, not again from "
                                      "its start"}]}


def _render(tmp_path, records):
    rb, prof = load_runbook("cpu_smoke"), load_profile("cpu")
    ResultStore(tmp_path).put_many(records)
    ctx = build_context(tmp_path, rb.name, prof.name, runbook=rb, profile=prof, now="2026-01-01 00:00 UTC",
                        plots=[{"phase": "baseline_ddp", "title": "baseline_ddp: loss, tokens/s, memory, step time per rank",
                                "path": "plots/cpu_smoke__cpu__baseline_ddp.png"}])
    # the store's own directory (in a rerun command) is the test's tmp_path: named as a fixed path
    return render_text({**ctx, "results_prefix": ".."}).replace(str(tmp_path.resolve()), "/data/results").replace(
        str(REPO_ROOT), "/repo")  # and this checkout's own directory (the acceptance tests' path) as another


def _check(name, text):
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"report differs from {path}; UPDATE_GOLDEN=1 regenerates it"


def _points():
    return {p.test_id.split("/", 2)[2]: p for p in expand(load_runbook("cpu_smoke"), load_profile("cpu"))}


def test_go_report(tmp_path):
    text = _render(tmp_path, [record(p) for p in _points().values()])
    assert "**Status: GO**" in text
    _check("report_go.md", text)


def test_nogo_report_with_findings(tmp_path):
    pts = _points()
    recs = [
        record(pts["preflight/default"]),
        record(pts["baseline_ddp/default"], status="FAIL", exit_code=1, reason="trainer crashed (exit code 1)",
               stderr_tail="Traceback (most recent call last):\n  File \"loop.py\", line 3\nRuntimeError: Expected to mark a variable ready only once"),
        record(pts["long_run/default"], status="FAIL", exit_code=3, reason="watchdog wrote .HALT: no rank made progress",
               halt={"source": "watchdog", "step": 17}, world_size=2, gate_values={"halt": 1.0}, stackdumps={"0": {"path": "stackdump_rank0.txt", "frames": FRAMES}},
               last_heartbeat={"0": {"step": 17, "stage": "backward"}, "1": {"step": 18, "stage": "optimizer"}}),
        record(pts["fsdp/default"], status="FAIL", idle_ranks=1.0, gate_values={"idle_ranks": 1.0}, world_size=2, reason="idle_ranks = 1, needs == 0",
               last_heartbeat={"0": {"step": 6, "stage": "step", "gpu_util": 99}, "1": {"step": 0, "stage": "data", "gpu_util": 0}},
               rank_step_time_s={"0": 0.5}),
    ]
    for slug, tokens, toks in (("seq_len=32,batch_size=1", 32, 260.0), ("seq_len=32,batch_size=2", 64, 165.0),
                               ("seq_len=64,batch_size=1", 64, 102.0), ("seq_len=64,batch_size=2", 128, 6.0)):
        recs.append(record(pts[f"scaling_sweep/{slug}"], toks=toks, step_time_s_mean=tokens / toks,
                           tokens_per_step=float(tokens), model_flops_per_token=3.0e5 * (1 + tokens % 64 / 32)))
    recs.append(record(pts["sdpa_audit/default"], fallbacks={"fb_sel_triton": 3.0}))
    text = _render(tmp_path, recs)
    assert "**Status: NO-GO**" in text
    for needle in ("throughput cliff in scaling_sweep at [seq_len=64, batch_size=2]: 6.0 toks/s after 260.0 toks/s",
                   "stall in long_run [default] (watchdog .HALT): rank 0 in _engine_run_backward",
                   "idle rank in fsdp [default]: 1 of 2 rank(s) did no work",
                   "crash in baseline_ddp [default]: exit code 1: RuntimeError: Expected to mark a variable ready only once",
                   "fallbacks in 1 of 9 run(s): fb_sel_triton", "sdpa_audit [default]: fb_sel_triton: 3", "### Not run", "**Scaling breakdown**"):
        assert needle in text
    _check("report_nogo.md", text)


def test_table_cells_are_escaped(tmp_path):
    pts = _points()
    text = _render(tmp_path, [record(pts["preflight/default"], status="FAIL", reason="a | b\nc")])
    assert "| a \\| b c |" in text


@pytest.mark.parametrize("missing", ["preflight/default"])
def test_incomplete_when_points_missing(tmp_path, missing):
    text = _render(tmp_path, [record(p) for k, p in _points().items() if k != missing])
    assert "**Status: INCOMPLETE**" in text and f"`cpu_smoke/cpu/{missing}`" in text


def test_a_crash_shows_the_failing_ranks_own_traceback_not_torchruns(tmp_path):
    """A user's resumed run crashed on a truncated checkpoint: the Failure Evidence showed the tail of
    torchrun's log, its agent's ChildFailedError traceback, and no line of the rank's own."""
    from validation.tests.judge.test_crash_traceback import crashed

    (tmp_path / "run").mkdir()
    failed = crashed(tmp_path / "run")
    rec = record(_points()["baseline_ddp/default"], status="FAIL", exit_code=1, world_size=2,
                 reason="trainer crashed (exit code 1)")
    rec = dataclasses.replace(rec, evidence=dataclasses.replace(failed.evidence, files=rec.evidence.files))
    text = _render(tmp_path / "results", [rec])
    evidence = text[text.index("## Failure Evidence"):text.index("## Artifacts Generated")]
    assert ("rank 0's traceback (its `[rank0]:` lines of trainer.stderr.log, the prefix dropped):\n\n```\n"
            + failed.evidence.rank_failures[0].traceback + "\n```") in evidence, evidence
    assert "ChildFailedError" not in evidence and "stderr (tail" not in evidence
