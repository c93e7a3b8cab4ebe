"""A trainer's own step times against the time the harness sees (judge/clock.py). A user's trainer
timed only part of each step: training.csv said 0.02 s a step and 1,600 tokens/s while its
heartbeats were 0.30 s apart a step, and `toks_per_s_mean >= 500` PASSed with "No automatic
findings". Its speeds are not believed now: a critical finding, and its gates on them fail."""
from __future__ import annotations

import dataclasses

import pandas as pd
import yaml

from validation.cli import main
from validation.judge.clock import CLOCK_FACTOR, CLOCKED, MIN_INTERVALS, StepClock, step_clock
from validation.judge.findings import Severity, find
from validation.judge.gates import GateResult, GateVerdict, Overruled, judged
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, Status
from validation.store.results import ResultStore

#: a trainer of the contract that sleeps its steps: ``TIMED_S`` inside its step timer, ``UNTIMED_S``
#: outside it (the part a buggy timer leaves out), ``PAUSE_S`` after step ``PAUSE_AFTER`` (an
#: evaluation between steps); it logs a row and a heartbeat every ``EVERY`` steps and the last
TRAINER = '''
import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--out-dir", required=True)
a = p.parse_args()
os.makedirs(a.out_dir, exist_ok=True)
TOKENS = 1024
with open(os.path.join(a.out_dir, "env.json"), "w") as f:
    json.dump({{"world_size": 1, "contract_version": 2, "git_sha": "0" * 40, "tokens_per_step": TOKENS}}, f)
csv = open(os.path.join(a.out_dir, "training.csv"), "w", buffering=1)
csv.write("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\\n")
hb = open(os.path.join(a.out_dir, "heartbeat_rank0.jsonl"), "w", buffering=1)

def beat(step, stage):
    hb.write(json.dumps({{"time": time.time(), "rank": 0, "pid": os.getpid(), "step": step, "stage": stage}}) + "\\n")

for step in range(1, a.steps + 1):
    if {every} == 1:
        beat(step, "forward")
    t0 = time.perf_counter()
    time.sleep({timed_s})
    timed = time.perf_counter() - t0
    time.sleep({untimed_s})
    if step % {every} == 0 or step == a.steps:
        csv.write(f"{{step}},{{3.0 - step * 0.01}},0.0001,{{TOKENS / timed}},{{timed}},1.0,0.1,0.1\\n")
        beat(step, "step")
    if step == {pause_after}:
        time.sleep({pause_s})
'''


def _run(tmp_path, monkeypatch, steps: int, gates: list[dict], timed_s: float, untimed_s: float = 0.0, every: int = 1,
         pause_after: int = 0, pause_s: float = 0.0) -> tuple[int, PhaseRecord, str]:
    (tmp_path / "mytrain.py").write_text(TRAINER.format(timed_s=timed_s, untimed_s=untimed_s, every=every,
                                                        pause_after=pause_after, pause_s=pause_s))
    rb = tmp_path / "mine.yaml"
    rb.write_text(yaml.safe_dump({
        "name": "mine", "profiles": ["cpu"],
        "trainer": {"name": "mytiny", "root": {"env": "MY_TRAINER_ROOT"}, "script": "mytrain.py",
                    "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]},
        "defaults": {"steps": steps, "timeout_s": 60, "stall_s": 10},
        "phases": [{"name": "speed", "kind": "train", "gates": gates}]}))
    monkeypatch.setenv("MY_TRAINER_ROOT", str(tmp_path))
    res = tmp_path / "res"
    code = main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"])
    (rec,) = ResultStore(res).records()
    return code, rec, (res / "reports" / "mine__cpu.md").read_text()


SPEED = {"metric": "toks_per_s_mean", "op": ">=", "threshold": 20000, "window": "last 10 steps"}
FINITE = {"metric": "loss_finite", "op": "==", "threshold": 1}


def test_a_trainer_whose_timer_leaves_out_most_of_each_step_is_no_go(tmp_path, monkeypatch):
    """Its timer sees 10 ms of each 130 ms step: it logs ~100,000 tokens/s of a run that made ~7,900,
    the floor of 20,000 between them."""
    code, rec, report = _run(tmp_path, monkeypatch, 12, [SPEED, FINITE], timed_s=0.01, untimed_s=0.12)
    assert code == 1
    clock = rec.evidence.clock
    assert clock is not None and clock.disputed, clock
    assert clock.logged_from == "step_time_s" and clock.logged_s < 0.03 and 0.12 < clock.beat_s < 0.5, clock
    assert clock.intervals == 12 and clock.wall_step_s is not None and clock.wall_step_s >= clock.beat_s * 0.9
    speed, finite = rec.gates
    assert speed.value > 20000  # the trainer's number would have passed
    assert (speed.verdict, speed.overruled) == (GateVerdict.FAIL, Overruled.CLOCK)
    assert "not judged on the trainer's own numbers" in speed.note
    assert (finite.verdict, finite.overruled) == (GateVerdict.PASS, None)  # the loss is no timing
    assert rec.status == Status.FAIL and "not judged on the trainer's own numbers" in rec.reason
    [f] = [f for f in find([rec]) if f.kind == "clock"]
    assert f.severity == Severity.CRITICAL
    assert f"the trainer logs {clock.logged_s:.3g} s a step" in f.title and f"show {clock.seen_s:.3g} s" in f.title
    text = "\n".join(f.detail)
    assert f"{rec.out_dir}/training.csv (step_time_s)" in text and f"{rec.out_dir}/heartbeat_rank0.jsonl (time)" in text
    assert "time the whole step" in text and "synchronise the device" in text
    assert "failed whatever their value" in text and "toks_per_s_mean" in text
    # its failed gate is said once, by the clock finding
    assert not [f for f in find([rec]) if f.kind == "gate"]
    assert "No automatic findings" not in report and "**Status: NO-GO**" in report
    assert "step times not believed in speed [default]" in report and "time the whole step" in report
    # stored and read back, and re-checked against a floor lowered since the run: still not believed
    assert PhaseRecord.from_json(rec.to_json(), "test").evidence.clock == clock
    rb = tmp_path / "mine.yaml"
    rb.write_text(rb.read_text().replace("threshold: 20000", "threshold: 100"))
    assert main(["report", "--runbook", str(rb), "--results-dir", str(tmp_path / "res"), "--no-plots"]) == 1
    again = (tmp_path / "res" / "reports" / "mine__cpu.md").read_text()
    assert "**Status: NO-GO**" in again and ">= 100 now" in again and "step times not believed" in again


def test_a_truthful_trainer_that_logs_every_4_steps_and_pauses_for_an_eval_is_not_flagged(tmp_path, monkeypatch):
    """Rows and heartbeats every 4 steps (intervals of 4 steps each, divided by 4), and a 1 s
    evaluation after step 8 that the interval holding it shows as 0.3 s a step against 0.04 logged:
    the median of the intervals is the steps'."""
    code, rec, report = _run(tmp_path, monkeypatch, 24, [SPEED | {"threshold": 1000}, FINITE], timed_s=0.04, every=4,
                             pause_after=8, pause_s=1.0)
    assert code == 0, rec.reason
    clock = rec.evidence.clock
    assert clock is not None and not clock.disputed, clock  # judged, and believed
    assert clock.intervals == 5 and clock.ratio < CLOCK_FACTOR
    assert rec.status == Status.PASS and all(g.overruled is None for g in rec.gates)
    assert not [f for f in find([rec]) if f.kind == "clock"] and "step times not believed" not in report


def _csv(step_s: float, steps: int) -> pd.DataFrame:
    return pd.DataFrame({"step": list(range(1, steps + 1)), "loss": [1.0] * steps, "toks_per_s": [100 / step_s] * steps,
                         "step_time_s": [step_s] * steps})


def _beats(step_s: float, steps: int) -> list[dict]:
    return [{"time": 1000.0 + s * step_s, "step": s, "stage": "step"} for s in range(1, steps + 1)]


def test_work_announced_between_steps_is_no_steps_time():
    """User hJ's trainer evaluated 0.5 s after every step, outside its 0.05 s step timer, writing a
    `checkpoint` heartbeat first: 'each step took 11.0x the time logged', critical, NO-GO. Where the
    heartbeats mark a step's start and end, the step is its span; where they mark only its end, an
    interval after a step that announced work after it is left out."""
    steps, t, marked = 10, 1000.0, []
    for s in range(1, steps + 1):
        marked += [{"time": t, "step": s, "stage": "forward"}, {"time": t + 0.05, "step": s, "stage": "step"},
                   {"time": t + 0.05, "step": s, "stage": "checkpoint"}]
        t += 0.55
    run = RunData(out_dir=".", csv=_csv(0.05, steps), heartbeats={0: marked}, env={})
    clock = step_clock(run, None)
    assert clock is not None and not clock.disputed and clock.intervals == steps, clock
    # a step that hides 0.25 s inside its span is still found
    hiding = [dict(r, time=r["time"] + (0.25 if r["stage"] != "forward" else 0) + 0.3 * (r["step"] - 1)) for r in marked]
    assert step_clock(dataclasses.replace(run, heartbeats={0: hiding}), None).disputed
    # ends only, with the evaluation after every step: nothing to judge by, nothing said
    ends = [r for r in marked if r["stage"] != "forward"]
    assert step_clock(dataclasses.replace(run, heartbeats={0: ends}), None) is None
    # ends only, an evaluation after every 5th step: the other intervals judge, and agree
    sparse = [r for r in ends if r["stage"] == "step" or r["step"] % 5 == 0]
    sparse = [dict(r, time=1000.0 + 0.05 * r["step"] + 0.5 * ((r["step"] - 1) // 5)) for r in sparse]
    clock = step_clock(dataclasses.replace(run, heartbeats={0: sparse}), None)
    assert clock is not None and not clock.disputed and clock.intervals == 8, clock


def test_steps_logged_after_a_profiled_window_end_where_the_next_step_starts():
    """This project's trainer under the cpu_smoke `nvtx` phase: 4 steps, 2 and 3 profiled back to back
    and logged (their `step` records) only after a second of the profile's summary. Step 2's span
    ran to that record, 1.2 s: with step 1's warm-up, the median of 4 spans was 2.05x the logged
    median, 'step times not believed', NO-GO, on a trainer that times its whole loop. A step is over
    once the next starts."""
    starts = {1: 0.0, 2: 0.086, 3: 0.126, 4: 1.302}
    ends = {1: [(0.082, "step")], 2: [(1.301, "step")], 3: [(0.170, "profile"), (1.302, "step")],
            4: [(1.338, "step")]}
    recs = []
    for s in (1, 2, 3, 4):
        recs.append({"time": starts[s], "step": s, "stage": "forward"})
        recs += [{"time": t, "step": s, "stage": stage} for t, stage in ends[s]]
    recs.sort(key=lambda r: r["time"])
    logged = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [1.0] * 4, "toks_per_s": [1.0] * 4,
                           "step_time_s": [0.082, 0.044, 0.043, 0.036]})
    run = RunData(out_dir=".", csv=logged, heartbeats={0: recs}, env={})
    clock = step_clock(run, None)
    assert clock is not None and clock.intervals == 4 and not clock.disputed, clock
    assert abs(clock.beat_s - (0.040 + 0.044) / 2) < 1e-6, clock  # spans 0.082, 0.040, 0.044, 0.036
    # the same steps with 0.1 s each outside the trainer's timer are still found
    slow = [dict(r, time=r["time"] + 0.1 * (r["step"] - (r["stage"] == "forward"))) for r in recs]
    assert step_clock(dataclasses.replace(run, heartbeats={0: slow}), None).disputed


def test_who_is_not_judged():
    """Without heartbeat times, with too few intervals, or converted by an adapter (heartbeats made
    afterwards from its log): None, and nothing said."""
    lying = RunData(out_dir=".", csv=_csv(0.02, 10), heartbeats={0: _beats(0.3, 10)}, env={"tokens_per_step": 2})
    assert step_clock(lying, None).disputed
    untimed = [{k: v for k, v in b.items() if k != "time"} for b in _beats(0.3, 10)]
    assert step_clock(dataclasses.replace(lying, heartbeats={0: untimed}), None) is None
    few = _beats(0.3, MIN_INTERVALS)  # MIN_INTERVALS records: one interval short
    assert step_clock(dataclasses.replace(lying, heartbeats={0: few}), None) is None
    adapted = dataclasses.replace(lying, env={"adapter": {"name": "torchtitan", "read": {}}})
    assert step_clock(adapted, None) is None
    # a trainer without step_time_s is held to its tokens/s over its tokens per step
    no_times = lying.csv.assign(step_time_s=float("nan"), toks_per_s=2 / 0.02)
    implied = step_clock(dataclasses.replace(lying, csv=no_times), None)
    assert implied.logged_from == "toks_per_s" and abs(implied.logged_s - 0.02) < 1e-9 and implied.disputed
    # the wall time bounds the heartbeats: 10 steps of a process that ran 1.5 s took no 0.3 s each
    assert not step_clock(lying, 0.15).disputed


def test_the_fake_trainers_made_up_step_times_are_its_heartbeats(fake_run):
    """validation/tests/fake_trainer.py logs 0.5 s a step and its heartbeats 0.5 s apart (a made-up
    clock): believed, with nothing to bound it but a wall time shorter than its steps."""
    from validation.tests.conftest import train_phase

    run = fake_run([train_phase(steps=8, env={"NSA_FAKE_WORLD": "2", "NSA_FAULT": "slow:rank=1"})])
    clock = run.record.evidence.clock
    assert clock is not None and not clock.disputed and clock.beat_s == 0.5 and clock.rank == 0, clock
    assert run.record.status == Status.PASS, run.record.reason


def test_only_the_trainers_clock_is_failed_and_a_stored_record_says_the_same():
    clock = StepClock(0.02, "step_time_s", 30, 0.3, 0, 29, 0.4)
    speed = GateResult("toks_per_s_mean", ">=", 500, "last 10 steps", 1600.0, GateVerdict.PASS)
    ratio = GateResult("rank_step_time_ratio", "<=", 1.5, "all steps", 1.0, GateVerdict.PASS)  # a timing of heartbeats
    assert "toks_per_s_mean" in CLOCKED and "step_time_s_median" in CLOCKED and "mfu" in CLOCKED
    assert "rank_step_time_ratio" not in CLOCKED and "loss_finite" not in CLOCKED
    failed = judged(speed, None, clock)
    assert (failed.verdict, failed.overruled) == (GateVerdict.FAIL, Overruled.CLOCK)
    assert judged(ratio, None, clock) == ratio
    assert judged(speed, None, dataclasses.replace(clock, beat_s=0.03)) == speed  # 1.5x: believed
    assert GateResult.from_json(dataclasses.asdict(failed)) == failed
