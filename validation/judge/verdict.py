"""A finished point's gates and verdict: process failures first (they explain everything after),
then contract violations, then gates."""
from __future__ import annotations

from typing import Mapping

from validation.contract.files import HaltInfo
from validation.judge.gates import Gate, GateResult, GateVerdict, check
from validation.judge.metrics import RunData, compute
from validation.judge.record import Status

#: how an UNMEASURED reason starts when the trainer lacks a gate's metric (the report quotes it)
UNPROVIDED = "metric(s) the trainer cannot provide"


def evaluate(gates: list[Gate], run: RunData, unmeasurable: Mapping[str, str] | None = None) -> list[GateResult]:
    """Each gate's value and verdict; a gate on a metric in ``unmeasurable`` is UNMEASURED."""
    unmeasurable = unmeasurable or {}
    out = []
    for g in gates:
        if g.metric in unmeasurable:
            out.append(GateResult(g.metric, g.op, g.threshold, g.window.describe(), None, GateVerdict.UNMEASURED,
                                  g.threshold_ref, g.description))
            continue
        value = compute(g.metric, run, g.window.last)
        out.append(GateResult(g.metric, g.op, g.threshold, g.window.describe(), value,
                              check(value, g.op, g.threshold), g.threshold_ref, g.description))
    return out


def verdict(kind: str, run: RunData, halt: HaltInfo | None, errors: list[str],
            gates: list[GateResult], unmeasurable: Mapping[str, str] | None = None) -> tuple[Status, str]:
    if run.stalled_s is not None:
        return Status.FAIL, (f"stalled: no progress for {run.stalled_s:.0f}s; stacks taken and the run killed by "
                             "the harness")
    if run.timed_out:
        return Status.FAIL, "timed out: killed by the harness at the phase timeout"
    if halt is not None:
        torn = " (its record cut short)" if halt.torn else ""
        if halt.source == "nonfinite":  # the trainer's NaN/inf guard, not a stall
            said = (f": loss per rank {halt.losses}, grad_norm {halt.grad_norm}" if halt.losses is not None
                    else f" ({halt.text[:120]})")  # a trainer whose .HALT says less (the seed's)
            return Status.FAIL, f"non-finite loss at step {halt.step}{said} (trainer .HALT){torn}"
        if halt.source == "watchdog":
            return Status.FAIL, f"watchdog wrote .HALT: no rank made progress{torn}"
        if halt.torn and halt.source is None:
            return Status.FAIL, f"stopped by a .HALT whose JSON record is cut short, no source in it: {halt.text[:200]}"
        # an operator's .HALT: empty, free text, or JSON from another source
        said = (halt.text[:200] or "an empty file") if halt.source is None else f"from {halt.source}: {halt.text[:200]}"
        return Status.FAIL, f"stopped by a .HALT ({said}){torn}"
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
        # the trainer lacks the metric; a gate's note says what else is missing (no golden curve
        # yet); otherwise it is the profile's threshold
        lacking = unmeasurable or {}
        missing = [f"{g.metric} ({lacking[g.metric]})" for g in pending if g.metric in lacking]
        notes = [g.note for g in pending if g.note and g.metric not in lacking]
        unset = [g.threshold_ref or g.metric for g in pending if g.metric not in lacking and not g.note]
        parts = ([f"{UNPROVIDED}: {', '.join(missing)}"] if missing else []) + notes + (
            [f"threshold(s) to be measured for this profile: {', '.join(unset)}"] if unset else [])
        return Status.UNMEASURED, "; ".join(parts)
    return Status.PASS, f"{len(gates)} gate(s) passed" if gates else "completed (no gates)"
