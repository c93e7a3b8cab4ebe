"""A loss spike in a real run (``NSA_FAULT=spike``: one step's loss, and so its gradients, scaled
by 10): the harness's loss and grad-norm spike gates fail, and the finding names the step and the
value; the same run without the fault passes the same gates."""
from __future__ import annotations

import pytest

from tests.faults import _util as U

pytestmark = pytest.mark.faults

STEPS, SPIKE = 20, 16
GATES = [{"metric": "loss_spikes", "op": "==", "threshold": 0},
         {"metric": "grad_norm_spikes", "op": "==", "threshold": 0},
         {"metric": "loss_diverging", "op": "==", "threshold": 0}]


def test_an_injected_spike_is_a_finding_with_its_step_and_value(tmp_path, matrix):
    matrix.start("loss spike", f"`NSA_FAULT=spike:step={SPIKE}` (the loss of step {SPIKE} x10) in a {STEPS}-step "
                 "run gated on loss_spikes and grad_norm_spikes == 0 (cpu profile: 10-step window)",
                 "FAIL; critical findings naming the step, the value and the rolling median; the unfaulted run passes")
    rb = U.write_runbook(tmp_path / "rb.yaml", [
        U.fault_phase("spiked", f"spike:step={SPIKE}", steps=STEPS, gates=GATES),
        U.fault_phase("clean", steps=STEPS, gates=GATES)])
    results = tmp_path / "results"
    p = U.harness("run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots")
    assert p.rc == 1, f"exit {p.rc}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    spiked, clean = U.record(results, "spiked"), U.record(results, "clean")
    assert clean.status == "PASS", clean.reason
    assert spiked.status == "FAIL" and "loss_spikes = 1" in spiked.reason and "grad_norm_spikes = 1" in spiked.reason
    loss = U.read_csv_column(results / spiked.out_dir, "loss")[SPIKE]
    titles = [f.title for f in U.findings_of(results, "spiked")]
    assert any(t.startswith(f"loss spike in spiked [default] at step {SPIKE}: {loss:.4g} against a rolling median")
               for t in titles), titles
    assert any(t.startswith(f"gradient-norm spike in spiked [default] at step {SPIKE}:") for t in titles), titles
    assert all(f.severity == "critical" for f in U.findings_of(results, "spiked") if f.kind == "spike")
    # the unfaulted run: no spike and nothing critical (a throughput warning is the machine's load,
    # seen once under CI's two workers: "tokens/s fell in clean [default] from step 14")
    assert not [f.title for f in U.findings_of(results, "clean") if f.kind == "spike" or f.severity == "critical"]
    U.assert_no_orphans(str(tmp_path))
    matrix.done("FAIL", titles[0].replace(str(tmp_path), "<tmp>"), p.elapsed, 240.0)
