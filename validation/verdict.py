"""A finished point's gates and verdict: process failures first (they explain everything after),
then contract violations, then gates."""
from __future__ import annotations

from .gates import GateResult, GateVerdict, check
from .metrics import RunData, compute
from .plan import PhasePoint
from .record import HaltInfo, Status


def evaluate(point: PhasePoint, run: RunData) -> list[GateResult]:
    out = []
    for g in point.gates():
        value = compute(g.metric, run, g.window.last)
        out.append(GateResult(g.metric, g.op, g.threshold, g.window.describe(), value,
                              check(value, g.op, g.threshold), g.threshold_ref, g.description))
    return out


def verdict(kind: str, run: RunData, halt: HaltInfo | None, errors: list[str],
            gates: list[GateResult]) -> tuple[Status, str]:
    if run.timed_out:
        return Status.FAIL, "timed out: killed by the harness at the phase timeout"
    if halt is not None:
        if halt.source == "nonfinite":  # the trainer's NaN/inf guard, not a stall
            return Status.FAIL, (f"non-finite loss at step {halt.step}: loss per rank {halt.losses}, "
                                 f"grad_norm {halt.grad_norm} (trainer .HALT)")
        if halt.source == "watchdog":
            return Status.FAIL, "watchdog wrote .HALT: no rank made progress"
        # an operator's .HALT: empty, free text, or JSON from another source
        said = (halt.text[:200] or "an empty file") if halt.source is None else f"from {halt.source}: {halt.text[:200]}"
        return Status.FAIL, f"stopped by a .HALT ({said})"
    if run.exit_code not in (0, None):
        what = {"pytest": "tests failed", "preflight": "preflight incomplete"}.get(kind, "trainer crashed")
        return Status.FAIL, f"{what} (exit code {run.exit_code})"
    if errors:
        return Status.ERROR, errors[0]
    bad = [g for g in gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)]
    if bad:
        return Status.FAIL, "; ".join(g.text() for g in bad)
    pending = [g for g in gates if g.verdict == GateVerdict.UNMEASURED]
    if pending:
        # a gate's note says what is missing (no golden curve yet); otherwise it is the threshold
        parts = [g.note for g in pending if g.note]
        thresholds = [g.threshold_ref or g.metric for g in pending if not g.note]
        if thresholds:
            parts.append("threshold(s) to be measured for this profile: " + ", ".join(thresholds))
        return Status.UNMEASURED, "; ".join(parts)
    return Status.PASS, f"{len(gates)} gate(s) passed" if gates else "completed (no gates)"
