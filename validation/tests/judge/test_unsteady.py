"""Why a failed toks_per_s_cv gate's window was unsteady (validation/judge/unsteady.py): its slow
steps and, from hand-built heartbeats, where their time went: the whole host, one stage, the wait
for the GPU; a window whose step time rose or fell step after step is a drift, and a gentle drift with no slow
step claims nothing."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from nsa.contract import CSV_COLUMNS
from validation.judge.findings.advice import recommendations
from validation.judge.findings.finding import Facts, Finding, Severity
from validation.judge.gates import Gate, GateResult, GateVerdict, Window, evaluate, explained
from validation.judge.metrics import RunData, compute
from validation.judge.unsteady import Cause, explain, heartbeat_files

TOKENS = 4096
#: a graphed step's spans on a quiet host, by the stage of the record that opens each (the last, the
#: wait for the GPU, ends at the step record): the shape of the H100 runs of long_context at 4k
QUIET = {"step": 0.30e-3, "data": 0.45e-3, "graph": 0.55e-3, "optimizer": 18.6e-3}
STEPS, WINDOW = 12, 6

Spans = Callable[[int], dict[str, float]]


def quiet(step: int) -> dict[str, float]:
    """The quiet spans, each a little off from step to step (as measured ones are)."""
    return {stage: s * (1 + 0.03 * ((step + i) % 3)) for i, (stage, s) in enumerate(QUIET.items())}


def beats(spans_of: Spans, rank: int = 0, steps: int = STEPS) -> list[dict]:
    """A rank's heartbeat records of steps 1..STEPS: each step's spans (``spans_of``: by the stage of
    the record that opens each, in order; the first opened by the step record before) closed by the
    next stage's record, the last by the step's own step record."""
    t = 1000.0
    out = [{"time": t, "step": 0, "stage": "step", "rank": rank}]
    for step in range(1, steps + 1):
        opened = list(spans_of(step).items())
        for (_, seconds), (following, _) in zip(opened, opened[1:] + [("step", 0.0)]):
            t += seconds
            # a checkpoint record is written after the step before, with its step
            out.append({"time": t, "step": step - 1 if following == "checkpoint" else step, "stage": following,
                        "rank": rank})
    return out


def csv_of(spans_of: Spans, steps: int = STEPS) -> pd.DataFrame:
    """training.csv as read of the same steps: each step's time the sum of its spans."""
    rows = []
    for step in range(1, steps + 1):
        seconds = sum(spans_of(step).values())
        rows.append({"step": step, "loss": 3.0, "lr": 1e-4, "toks_per_s": TOKENS / seconds, "step_time_s": seconds,
                     "grad_norm": 1.0, "mem_alloc_gb": 1.6, "mem_reserved_gb": 3.7})
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS))


def slow_at(step: int, change: Callable[[dict[str, float]], dict[str, float]]) -> Spans:
    """Quiet spans, those of ``step`` changed."""
    return lambda s: change(quiet(s)) if s == step else quiet(s)


def cv(spans_of: Spans) -> float:
    """The gate's value over the window."""
    return compute("toks_per_s_cv", RunData(out_dir=Path("."), csv=csv_of(spans_of)), WINDOW)


def unsteady_of(spans_of: Spans, ranks: dict[int, Spans] | None = None):
    found = explain(csv_of(spans_of), {r: beats(f, r) for r, f in (ranks or {0: spans_of}).items()}, WINDOW)
    assert found is not None
    return found


def test_a_stall_of_every_host_stage_is_the_whole_host():
    stalled = slow_at(9, lambda sp: {k: v * (1 if k == "optimizer" else 8) for k, v in sp.items()})
    assert cv(stalled) > 0.1  # the gate fails on it
    u = unsteady_of(stalled)
    (s,) = u.slow
    assert (s.step, s.cause, s.stage, s.rank) == (9, Cause.WHOLE_HOST, None, 0)
    assert s.ratio == pytest.approx(s.seconds / u.typical_s) and s.ratio > 1.4
    assert [(x.stage, x.until, x.wait, x.grew) for x in s.spans] == [
        ("step", "data", False, True), ("data", "graph", False, True), ("graph", "optimizer", False, True),
        ("optimizer", "step", True, False)]
    assert u.cv_without is not None and u.cv_without < 0.05
    assert u.causes == (Cause.WHOLE_HOST,) and u.stages == ()
    assert u.summary() == "1 slow step: the whole host stalled (step 9)"
    lines = u.lines("d/heartbeat_rank0.jsonl")
    assert lines[0].startswith("1 of the window's 6 logged steps slow (over 1.2x its typical step, ")
    assert f"step 9 {s.seconds * 1e3:.2f} ms ({s.ratio:.2f}x); without it the window's toks_per_s_cv is " in lines[0]
    assert lines[1].startswith("step 9: the whole host stalled (every host stage's span at 2x its typical or more): "
                               "step->data ")
    assert "; the wait for the GPU, optimizer->step " in lines[1]
    assert lines[-1] == "heartbeats: d/heartbeat_rank0.jsonl"


@pytest.mark.parametrize("change, stage", [
    # the loader 10 ms slower, the other host spans off by up to 1.6x as a busy step's are
    (lambda sp: {**sp, "data": 10e-3, "graph": sp["graph"] * 1.6}, "data"),
    # a checkpoint after step 8, which no steady step writes: its span has no typical and counts whole
    (lambda sp: {"step": sp["step"], "checkpoint": 12e-3, **{k: v for k, v in sp.items() if k != "step"}},
     "checkpoint"),
])
def test_one_stage_that_grew_is_named(change, stage):
    grown = slow_at(9, change)
    assert cv(grown) > 0.1
    u = unsteady_of(grown)
    (s,) = u.slow
    assert (s.step, s.cause, s.stage) == (9, Cause.STAGE, stage)
    assert u.stages == (stage,)
    assert u.summary() == f"1 slow step: the {stage} stage grew (step 9)"
    assert f"step 9: the {stage} stage grew (its span holds " in u.lines("h")[1]


def test_only_the_wait_for_the_gpu_grew():
    waited = slow_at(9, lambda sp: {**sp, "optimizer": sp["optimizer"] + 10e-3})
    assert cv(waited) > 0.1
    u = unsteady_of(waited)
    (s,) = u.slow
    assert (s.step, s.cause, s.stage) == (9, Cause.GPU_WAIT, None)
    assert [x.grew for x in s.spans] == [False, False, False, False]
    assert u.summary() == "1 slow step: only the wait for the GPU grew (step 9)"
    assert "heartbeats cannot tell a slower device from a host stalled inside that span alone" in u.lines("h")[1]


def test_a_drift_without_a_slow_step_claims_nothing():
    # the wait grows by 1.6 ms a step over the window: its last step 1.18x the median, none 1.2x
    def drift(step: int) -> dict[str, float]:
        return {**quiet(step), "optimizer": 16.7e-3 + 1.6e-3 * max(step - 7, 0)}
    assert cv(drift) > 0.1  # the gate fails all the same
    assert explain(csv_of(drift), {0: beats(drift)}, WINDOW) is None


#: long_context_h100's window: 20 of 30 steps
LONG_STEPS, LONG_WINDOW = 30, 20


def long_unsteady(spans_of: Spans):
    return explain(csv_of(spans_of, LONG_STEPS), {0: beats(spans_of, 0, LONG_STEPS)}, LONG_WINDOW)


@pytest.mark.parametrize("per_step, way", [(0.04, "rose"), (-0.025, "fell")])
def test_a_window_whose_step_time_moves_step_after_step_is_a_drift_not_slow_steps(per_step, way):
    """Step time 4% of the steady step longer every step (a leak, a queue): the slow-step rule, taking
    the slowest steps out until none is 1.2x the rest's median, called the later half of the window slow
    steps of some cause; falling (a warm-up still in the window), it called the first ones slow."""
    def moving(step: int) -> dict[str, float]:
        sp = quiet(step)
        return {**sp, "optimizer": sp["optimizer"] * (1 + per_step * (step - 10))}
    assert compute("toks_per_s_cv", RunData(out_dir=Path("."), csv=csv_of(moving, LONG_STEPS)), LONG_WINDOW) > 0.1
    u = long_unsteady(moving)
    assert u is not None and u.slow == () and u.causes == () and u.drift is not None
    assert u.steps == LONG_WINDOW and u.drift.third == 6 and u.drift.way == way and abs(u.drift.rho) >= 0.9
    times = csv_of(moving, LONG_STEPS)["step_time_s"].tolist()[-LONG_WINDOW:]
    assert u.drift.first_s == pytest.approx(sorted(times[:6])[2:4][0] / 2 + sorted(times[:6])[2:4][1] / 2)
    first, last = f"{u.drift.first_s * 1e3:.2f}", f"{u.drift.last_s * 1e3:.2f}"
    assert u.summary() == f"step time {way} through the window, {first} to {last} ms"
    assert u.lines("h") == [f"the window's 20 logged steps' time {way} step after step (rank correlation with the step "
                            f"{u.drift.rho:.2f}): median {first} ms over its first 6 steps, {last} ms over its last 6: a "
                            "drift, not a few slow steps"]
    # read from training.csv alone
    assert explain(csv_of(moving, LONG_STEPS), {}, LONG_WINDOW) == u
    found = Finding(Severity.CRITICAL, "long_context", "gate failed", [], "unsteady", Facts(unsteady=u, cuda=True))
    (advice,) = recommendations([found])
    assert ("something grew through the run" in advice and "nvidia-smi" in advice) if way == "rose" else (
        "the window still holds the warm-up" in advice)
    assert "Re-run the point" not in advice
    stored = GateResult("toks_per_s_cv", "<=", 0.1, f"last {LONG_WINDOW} steps", 0.2, GateVerdict.FAIL, unsteady=u)
    assert GateResult.from_json(json.loads(json.dumps(dataclasses.asdict(stored)))) == stored


def test_stalls_at_the_end_of_a_long_window_are_slow_steps_not_a_drift():
    """Three stalled steps last in the window rank as its slowest, as a drift's last steps do; the rest
    of the window does not follow the steps, so they are slow steps."""
    def stalled(step: int) -> dict[str, float]:
        sp = quiet(step)
        return {k: v * (1 if k == "optimizer" or step < 28 else 8) for k, v in sp.items()}
    u = long_unsteady(stalled)
    assert u is not None and u.drift is None
    assert [(s.step, s.cause) for s in u.slow] == [(28, Cause.WHOLE_HOST), (29, Cause.WHOLE_HOST),
                                                   (30, Cause.WHOLE_HOST)]


def test_slow_steps_that_pull_the_window_median_are_found_against_the_others():
    # two of the six steps 1.3-1.4x slower: 1.2x the whole window's median would find one of them
    def two(step: int) -> dict[str, float]:
        sp = quiet(step)
        return {**sp, "optimizer": sp["optimizer"] + {7: 6.5e-3, 8: 8e-3}.get(step, 0.0)}
    u = unsteady_of(two)
    assert [s.step for s in u.slow] == [7, 8]
    assert u.summary() == "2 slow steps: only the wait for the GPU grew (steps 7, 8)"


def test_the_rank_whose_stage_grew_is_blamed_not_the_one_that_waited_for_it():
    loaded = slow_at(9, lambda sp: {**sp, "data": 10e-3})
    waited = slow_at(9, lambda sp: {**sp, "optimizer": sp["optimizer"] + 9.55e-3})
    u = unsteady_of(waited, {0: waited, 1: loaded})
    (s,) = u.slow
    assert (s.cause, s.stage, s.rank) == (Cause.STAGE, "data", 1)
    assert u.lines("h")[1].startswith("step 9 (rank 1's heartbeats): the data stage grew")
    assert heartbeat_files("d", u) == "d/heartbeat_rank0.jsonl and d/heartbeat_rank1.jsonl"


def test_nothing_without_rank_0s_heartbeats():
    stalled = slow_at(9, lambda sp: {k: v * 8 for k, v in sp.items()})
    assert explain(csv_of(stalled), {}, WINDOW) is None
    assert explain(csv_of(stalled), {1: beats(stalled, 1)}, WINDOW) is None


def test_the_gate_keeps_it_where_it_failed_and_the_store_reads_it_back():
    stalled = slow_at(9, lambda sp: {k: v * (1 if k == "optimizer" else 8) for k, v in sp.items()})
    run = RunData(out_dir=Path("."), csv=csv_of(stalled), heartbeats={0: beats(stalled)})
    failed, passed = evaluate([Gate("toks_per_s_cv", "<=", 0.1, Window(WINDOW)),
                               Gate("toks_per_s_cv", "<=", 0.5, Window(WINDOW))], run, {})
    assert failed.verdict == GateVerdict.FAIL and failed.unsteady is not None
    assert failed.unsteady.slow[0].cause == Cause.WHOLE_HOST
    assert passed.verdict == GateVerdict.PASS and passed.unsteady is None
    stored = json.loads(json.dumps(dataclasses.asdict(failed)))
    assert GateResult.from_json(stored) == failed


def test_a_stored_gate_is_explained_where_it_fails_without_one_and_loses_it_where_it_no_longer_fails():
    """What the report does to stored gates (a record of an older harness; a threshold re-checked at
    report time): explain a failed one that holds none, keep one that holds one, drop it from one that
    passes now."""
    stalled = slow_at(9, lambda sp: {k: v * (1 if k == "optimizer" else 8) for k, v in sp.items()})
    u = unsteady_of(stalled)
    asked = []

    def from_run(last):
        asked.append(last)
        return u
    stored = GateResult("toks_per_s_cv", "<=", 0.1, f"last {WINDOW} steps", 0.12, GateVerdict.FAIL)
    assert explained(stored, from_run).unsteady == u and asked == [WINDOW]
    assert explained(dataclasses.replace(stored, unsteady=u), from_run).unsteady == u and asked == [WINDOW]
    passes = dataclasses.replace(stored, threshold=0.2, verdict=GateVerdict.PASS, unsteady=u)
    assert explained(passes, from_run).unsteady is None and asked == [WINDOW]
    other = GateResult("toks_per_s_mean", ">=", 1e9, f"last {WINDOW} steps", 1.0, GateVerdict.FAIL)
    assert explained(other, from_run).unsteady is None and asked == [WINDOW]


def test_advice_names_the_stage_and_a_rerun_for_a_stall():
    def advice(change) -> str:
        u = unsteady_of(slow_at(9, change))
        found = Finding(Severity.CRITICAL, "long_run", "gate failed", [], "unsteady", Facts(unsteady=u))
        (line,) = recommendations([found])
        return line
    stage = advice(lambda sp: {**sp, "data": 10e-3})
    assert "the data stage took longer than in the others: look at what the data loader" in stage
    assert "Re-run the point" not in stage
    host = advice(lambda sp: {k: v * (1 if k == "optimizer" else 8) for k, v in sp.items()})
    assert "every host stage grew at once" in host and "look for other work on the machine" in host
    assert "Re-run the point (the re-run line in the finding)" in host
