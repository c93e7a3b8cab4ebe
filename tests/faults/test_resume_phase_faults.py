"""The resume phase on the real trainer, broken on resume as a buggy trainer would be: data that
skips ahead (``NSA_FAULT=resume_skip``) and an RNG reseeded instead of restored
(``NSA_FAULT=resume_reseed``, with dropout drawing from it). Each point fails, its finding naming
the first step after the resume; the data position gate says which of the two broke. The unbroken
phase passes in the CPU smoke acceptance (runbooks/cpu_smoke.yaml, phase resume)."""
from __future__ import annotations

import pytest

from tests.faults import _util as U

pytestmark = pytest.mark.faults

STEPS, AFTER = 6, 3


def _phase(name: str, fault: str) -> dict:
    return {"name": name, "kind": "resume", "steps": STEPS, "resume_after": AFTER, "env": {"NSA_FAULT": fault},
            "overrides": {"model.dropout": 0.1}, "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}


def test_a_resume_that_skips_data_or_reseeds_fails_naming_the_step(tmp_path, matrix):
    matrix.start("resume: data position or RNG broken", f"resume phases ({STEPS} steps, stopped after {AFTER}) with "
                 "`NSA_FAULT=resume_skip:batches=1` and `NSA_FAULT=resume_reseed` (dropout 0.1)",
                 f"FAIL; critical finding naming step {AFTER + 1}, the first after the resume; data position gate: "
                 "1 skipped / continued")
    rb = U.write_runbook(tmp_path / "rb.yaml", [_phase("skip", "resume_skip:batches=1"),
                                                _phase("reseed", "resume_reseed")])
    results = tmp_path / "results"
    p = U.harness("run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots")
    assert p.rc == 1, f"exit {p.rc}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    lines = []
    for phase, gap in (("skip", 1.0), ("reseed", 0.0)):
        rec = U.record(results, phase)
        assert rec.status == "FAIL" and [s.status for s in rec.runs] == ["PASS"] * 3, rec.reason
        gates = {g.metric: g for g in rec.gates}
        assert gates["resume_data_gap"].value == gap and gates["resume_lr_rel_diff"].verdict == "PASS"
        titles = [f.title for f in U.findings_of(results, phase) if f.kind == "resume"]
        assert len(titles) == 1 and titles[0].startswith(
            f"resume not equivalent in {phase} [default]: first diverging step {AFTER + 1} (the first step after the "
            f"resume at step {AFTER}): loss "), titles
        lines.append(titles[0])
    U.assert_no_orphans(str(tmp_path))
    matrix.done("FAIL (both)", lines[0], p.elapsed, 240.0)
