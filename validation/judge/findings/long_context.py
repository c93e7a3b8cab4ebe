"""Long context: where NSA pays for itself. A phase whose sweep crosses the attention kind
(``model.attn.kind``: nsa, dense) with the sequence length (``train.seq_len``) trains both models
on the same data with the same trainer; per length, NSA's tokens/s over dense's.

Findings: the length from which NSA is faster (at it and at every longer length measured), its
speed-up at the longest length, and the loss of both at equal steps: the mean loss of the steps the
phase's gates read (its window, 'last 6 steps'; every logged step without one) of each model, the
same steps of both. One step's loss of each says little: a model's loss moves from step to step by
more than the difference (NSA at S=4,096 moved between 3.00 and 3.51 over steps 10-12). With the profile threshold
``MIN_SPEEDUP_KEY`` the speed-up at the sweep's longest length is also a check: below it is
critical (a cross-point failure no single point's test can see). Where the runbook's sweep is
known (``planned_longest``), the check waits for its longest length: a partial run (the longest
points cut off, not run, or without tokens/s) is not judged at a shorter length against a
threshold set for the longest."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from validation.judge.findings.finding import Finding, Severity
from validation.judge.record import PhaseRecord

KIND_KEY = "model.attn.kind"
LENGTH_KEY = "train.seq_len"
#: profile threshold: NSA / dense tokens/s at the longest length measured must reach it
MIN_SPEEDUP_KEY = "min_long_context_speedup"


@dataclass(frozen=True)
class LengthPair:
    """NSA and dense at one sequence length (the other sweep parameters equal)."""

    seq_len: int
    nsa: PhaseRecord
    dense: PhaseRecord

    @property
    def speedup(self) -> float | None:
        a, b = self.nsa.metrics.toks_per_s_mean, self.dense.metrics.toks_per_s_mean
        return a / b if a and b else None


def pairs(records: list[PhaseRecord]) -> dict[str, list[LengthPair]]:
    """Per phase that sweeps both keys, its NSA/dense pairs by length (shortest first); points
    whose other parameters differ are paired only with their own twins."""
    out: dict[str, list[LengthPair]] = {}
    by_phase: dict[str, list[PhaseRecord]] = {}
    for r in records:
        if KIND_KEY in r.key.params and LENGTH_KEY in r.key.params:
            by_phase.setdefault(r.phase, []).append(r)
    for phase, recs in by_phase.items():
        twins: dict[tuple, dict[str, PhaseRecord]] = {}
        for r in recs:
            rest = tuple(sorted((k, str(v)) for k, v in r.key.params.items() if k != KIND_KEY))
            twins.setdefault(rest, {})[str(r.key.params[KIND_KEY])] = r
        found = [LengthPair(int(t["nsa"].key.params[LENGTH_KEY]), t["nsa"], t["dense"])
                 for t in twins.values() if "nsa" in t and "dense" in t]
        if found:
            out[phase] = sorted(found, key=lambda p: p.seq_len)
    return out


def crossover(found: list[LengthPair]) -> int | None:
    """The shortest length from which NSA is faster at every measured length at or above it."""
    length = None
    for p in reversed(found):
        if p.speedup is None or p.speedup <= 1.0:
            break
        length = p.seq_len
    return length


def planned_longest(points: Iterable[tuple[str, Mapping[str, object]]]) -> dict[str, int]:
    """Per phase that crosses the attention kind with the length, the longest length its sweep
    plans, from the (phase name, sweep parameters) of the runbook's points."""
    out: dict[str, int] = {}
    for phase, params in points:
        if KIND_KEY in params and LENGTH_KEY in params:
            out[phase] = max(out.get(phase, 0), int(params[LENGTH_KEY]))
    return out


def long_context(records: list[PhaseRecord], thresholds: Mapping[str, float | None] | None = None,
                 longest: Mapping[str, int] | None = None) -> list[Finding]:
    """Per phase that crosses the attention kind with the length: one finding, critical when the
    speed-up at the sweep's longest length (``longest``, from planned_longest; else the longest
    length of the records) is below the profile's MIN_SPEEDUP_KEY."""
    out = []
    minimum = (thresholds or {}).get(MIN_SPEEDUP_KEY)
    for phase, found in pairs(records).items():
        measured = [p for p in found if p.speedup is not None]
        if not measured:
            continue
        longest_measured = measured[-1]
        target = (longest or {}).get(phase, found[-1].seq_len)
        cross = crossover(measured)
        table = [f"S={p.seq_len:,}: NSA {p.nsa.metrics.toks_per_s_mean:,.0f} tok/s, dense "
                 f"{p.dense.metrics.toks_per_s_mean:,.0f} tok/s ({p.speedup:.2f}x); peak memory "
                 f"{_gb(p.nsa)} vs {_gb(p.dense)} GB; {_losses(p)}"
                 for p in measured]
        where = (f"NSA is faster from S={cross:,} on" if cross is not None
                 else f"NSA is not faster at every length up to S={longest_measured.seq_len:,}")
        title = (f"long context in {phase}: {where}; {longest_measured.speedup:.2f}x dense at "
                 f"S={longest_measured.seq_len:,}")
        if minimum is not None and longest_measured.seq_len != target:
            out.append(Finding(Severity.INFO, phase, title + f"; the profile's {MIN_SPEEDUP_KEY} {minimum:g} is "
                               f"checked at S={target:,}, not measured", table, "long_context"))
        elif minimum is not None and longest_measured.speedup < minimum:
            out.append(Finding(Severity.CRITICAL, phase, title + f", below the profile's {MIN_SPEEDUP_KEY} "
                               f"{minimum:g}", table, "long_context"))
        else:
            out.append(Finding(Severity.INFO, phase, title, table, "long_context"))
    return out


def _gb(r: PhaseRecord) -> str:
    v = r.metrics.mem_reserved_gb_max
    return "?" if v is None else f"{v:.1f}"


def _losses(p: LengthPair) -> str:
    """'mean loss over steps 7-12 (the last 6 steps, the gates' window) 3.250 vs 3.900': each
    model's loss_mean over the phase's window (the record's numbers are over it), and where the two
    did not log to the same step, that their windows are not the same steps."""
    ends = [r.metrics.steps_completed for r in (p.nsa, p.dense)]
    match = re.fullmatch(r"last (\d+) steps", p.nsa.window)
    last = int(match.group(1)) if match else None
    values = " vs ".join(_mean_loss(r) for r in (p.nsa, p.dense))
    if ends[0] is None or ends[0] != ends[1]:
        n, d = ("?" if e is None else f"{e:g}" for e in ends)
        told = f"NSA logged to step {n}, dense to step {d}"
        span = f"their last {last} steps" if last else "all logged steps"
        return f"mean loss over {span} {values} (not the same steps: {told})"
    end = int(ends[0])
    if last:
        return f"mean loss over steps {max(end - last + 1, 1)}-{end} (the last {last} steps, the gates' window) {values}"
    return f"mean loss over every logged step to step {end} (the gates' window: all steps) {values}"


def _mean_loss(r: PhaseRecord) -> str:
    v = r.metrics.loss_mean
    return "?" if v is None else f"{v:.3f}"
