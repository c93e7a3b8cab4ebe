"""A timing's gate on a busy machine (validation/judge/gates.py ``judged``): another test run kept a
two-core machine busy and a trainer's tokens/s fell under its floor, NO-GO for a trainer that had
not changed. Other work only slows a run, and by no more than the cores the point could have had
alone over those it had: a timing that fails there is UNMEASURED, naming how busy the machine was,
unless it fails even at that bound; one that passes passes; a gate that is no timing is judged as
ever; a threshold changed since the run is judged from the stored value by the same rule."""
from __future__ import annotations

from validation.cli import main
from validation.judge.gates import GateVerdict, Pending
from validation.machine import MachineLoad
from validation.report.build import build_context
from validation.runbook.load import load_profile, load_runbook
from validation.store.results import ResultStore
from validation.tests.conftest import StagedLoad, train_phase, write_runbook

BUSY = MachineLoad(cores=2, busy_cores=2.0, others_cores=1.4)  # 0.6 cores the point's: at most 3.3x slower
#: a floor the fake trainer's ~200 tokens/s misses, but would not miss had the load slowed it 3.3x
WITHIN_LOAD = 300
QUIET = MachineLoad(cores=2, busy_cores=2.0, others_cores=0.05)


def _gates(floor: float) -> list[dict]:
    # the fake trainer logs ~200 tokens/s and a finite loss; steps_completed is no timing
    return [{"metric": "toks_per_s_mean", "op": ">=", "threshold": floor},
            {"metric": "steps_completed", "op": ">=", "threshold": 99}]


def _run(tmp_path, monkeypatch, load: MachineLoad, floor: float, speed_only: bool = False):
    monkeypatch.setattr("validation.launch.process.LoadMeter", StagedLoad)
    StagedLoad.load = load
    tmp_path.mkdir(exist_ok=True)
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("speed", gates=_gates(floor)[:1] if speed_only else _gates(floor), steps=4)])
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    (stored,) = ResultStore(res).records()
    return rb, res, stored


def _verdicts(rec) -> dict[str, GateVerdict]:
    return {g.metric: g.verdict for g in rec.gates}


def test_a_timing_that_fails_on_a_busy_machine_is_unmeasured(tmp_path, monkeypatch):
    rb, res, rec = _run(tmp_path, monkeypatch, BUSY, WITHIN_LOAD)
    assert _verdicts(rec) == {"toks_per_s_mean": GateVerdict.UNMEASURED, "steps_completed": GateVerdict.FAIL}
    [speed] = [g for g in rec.gates if g.metric == "toks_per_s_mean"]
    assert speed.pending == Pending.BUSY_MACHINE and speed.value is not None
    assert speed.note == ("the machine was busy with other work: other processes used 1.40 of the 2 cores on average "
                          "(2.00 in use in all, 0.60 by the point's)")
    assert rec.status == "FAIL"  # steps_completed still fails the point


def test_without_another_failure_the_point_is_unmeasured_and_a_changed_floor_is_judged_alike(tmp_path, monkeypatch):
    rb, res, rec = _run(tmp_path, monkeypatch, BUSY, WITHIN_LOAD, speed_only=True)
    assert rec.status == "UNMEASURED"
    runbook, profile = load_runbook(rb), load_profile("cpu")
    ctx = build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    assert "timing(s) not judged, the machine busy with other work: toks_per_s_mean" in ctx["status_reason"]
    # a floor raised since the run: still not judged on that machine, or beyond what the load can
    # explain a FAIL; lowered under the value: a PASS
    for floor, verdict in ((400, "INCOMPLETE"), (1e6, "NO-GO"), (10, "GO")):
        write_runbook(rb, [train_phase("speed", gates=_gates(floor)[:1], steps=4)])
        runbook = load_runbook(rb)
        ctx = build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)
        assert ctx["verdict"] == verdict, (floor, ctx["status_reason"])


def test_a_timing_that_passes_on_a_busy_machine_passes_and_one_that_fails_on_a_quiet_one_fails(tmp_path, monkeypatch):
    _, _, rec = _run(tmp_path / "a", monkeypatch, BUSY, 10)
    assert _verdicts(rec)["toks_per_s_mean"] == GateVerdict.PASS
    _, _, rec = _run(tmp_path / "b", monkeypatch, QUIET, 1e6)
    assert _verdicts(rec)["toks_per_s_mean"] == GateVerdict.FAIL


def test_a_timing_that_fails_however_much_the_load_slowed_it_fails(tmp_path, monkeypatch):
    _, _, rec = _run(tmp_path, monkeypatch, BUSY, 1e6)
    [speed] = [g for g in rec.gates if g.metric == "toks_per_s_mean"]
    assert speed.verdict == GateVerdict.FAIL and speed.pending is None
    assert "; it fails even at " in speed.note and "(at most 3.3x slower)" in speed.note, speed.note
