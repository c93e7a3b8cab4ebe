"""A report of a store whose point failed its toks_per_s_cv gate on a stall of the whole host: the
finding and the failure section say which step was slow and where its time went, from the run's
heartbeats, and the advice re-runs the point; the verdict stays the gate's."""
from __future__ import annotations

import json

from validation.judge.gates import GateResult, GateVerdict
from validation.judge.metrics import RunData, compute
from validation.judge.record import Evidence, PhaseRecord, Status
from validation.judge.unsteady import Cause
from validation.report.build import build_context, render_text
from validation.report.tables import rerun_line
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook
from validation.tests.judge.test_unsteady import WINDOW, beats, csv_of, slow_at

GATE = {"metric": "toks_per_s_cv", "op": "<=", "threshold": 0.1, "window": f"last {WINDOW} steps",
        "description": "steady tokens/s after warm-up"}


def test_a_whole_host_stall_is_named_in_the_finding_and_the_failure_section(tmp_path):
    runbook = load_runbook(write_runbook(tmp_path / "runbook.yaml", [train_phase("steady", gates=[GATE], steps=12)]))
    profile = load_profile("cpu")
    (point,) = expand(runbook, profile)
    results, out_dir = tmp_path / "results", "runs/fake/cpu/steady/default/abc"
    # step 9's host stages 8x as long, the wait for the GPU as ever: a stall of the whole host
    stalled = slow_at(9, lambda sp: {k: v * (1 if k == "optimizer" else 8) for k, v in sp.items()})
    run_dir = results / out_dir
    run_dir.mkdir(parents=True)
    csv = csv_of(stalled)
    csv.to_csv(run_dir / "training.csv", index=False)
    (run_dir / "heartbeat_rank0.jsonl").write_text("".join(json.dumps(b) + "\n" for b in beats(stalled)))
    value = compute("toks_per_s_cv", RunData(out_dir=run_dir, csv=csv), WINDOW)
    # stored as a harness that explained nothing stored it: the report explains it from the run's files
    gate = GateResult("toks_per_s_cv", "<=", 0.1, f"last {WINDOW} steps", value, GateVerdict.FAIL,
                      description=GATE["description"])
    reason = gate.text()
    ResultStore(results).put_many([PhaseRecord.for_point(point, Status.FAIL, reason, gates=[gate], out_dir=out_dir,
                                                          exit_code=0, steps=12, window=f"last {WINDOW} steps",
                                                          evidence=Evidence(files=["heartbeat_rank0.jsonl",
                                                                                   "training.csv"]))])
    ctx = build_context(results, runbook.name, profile.name, runbook=runbook, profile=profile,
                        now="2026-01-01 00:00 UTC")
    text = render_text({**ctx, "results_prefix": ".."})

    assert ctx["status"] == "NO-GO" and f"1 of 1 phase point(s) failed: steady [default] ({reason})" in text
    (finding,) = [f for f in ctx["findings"] if f.kind == "unsteady"]
    u = finding.facts.unsteady
    assert [(s.step, s.cause, s.rank) for s in u.slow] == [(9, Cause.WHOLE_HOST, 0)]
    assert finding.rerun is not None and finding.rerun.test_id == point.test_id
    title = f"gate failed in steady [default]: {reason}; 1 slow step: the whole host stalled (step 9)"
    assert finding.title == title
    slow = u.slow[0]
    head = (f"1 of the window's 6 logged steps slow (over 1.2x its typical step, {u.typical_s * 1e3:.2f} ms, the "
            f"median of those that are not): step 9 {slow.seconds * 1e3:.2f} ms ({slow.ratio:.2f}x); without it the "
            f"window's toks_per_s_cv is {u.cv_without:.4g}")
    assert finding.detail[:2] == ["steady tokens/s after warm-up", head]
    assert finding.detail[2].startswith("step 9: the whole host stalled (every host stage's span at 2x its typical or "
                                        "more): step->data ")
    assert finding.detail[3:5] == [f"heartbeats: {out_dir}/heartbeat_rank0.jsonl", f"CSV: {out_dir}/training.csv"]
    # the point's re-run command, as the Reproduce section builds it
    assert finding.detail[5] == (f"re-run only this point: "
                                 f"`{rerun_line(finding.rerun, runbook.cli_name, 'cpu', str(results.resolve()))}`")
    # the finding, the failure section and the advice, as the report prints them
    assert f"1. **CRITICAL**: {title}\n   - steady tokens/s after warm-up\n   - {head}\n" in text
    assert f"- **Reason**: {reason}\n" in text
    assert "- **Tokens/s unsteady**: 1 slow step: the whole host stalled (step 9)\n" f"- {head}\n" in text
    assert ("1. steady: In a slow step every host stage grew at once: the trainer's process, or the machine under "
            "it, stalled") in text
    assert "Re-run the point (the re-run line in the finding)" in text
