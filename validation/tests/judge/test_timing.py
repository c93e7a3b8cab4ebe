"""Timing you can believe (issue 24, case 7): ``max_parallel: 2`` ran timed points side by side on
a 2-core machine, and the report then printed a fitted "-168 ms per 1k tokens", "fixed cost is
100%", CUDA graphs advice on CPU, and a best bucket size that flipped between runs. Timed points
now run alone; where they shared the machine anyway the report says so and the speed findings
leave them out; a host-bound fit is a finding only when its coefficients are meaningful; a best
setting only when its lead beats the run-to-run spread."""
from __future__ import annotations

import dataclasses

from validation.cli import main
from validation.judge.findings import find
from validation.judge.findings.throughput import best_setting, cliffs, host_bound
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.judge.timing import busy_machine, shared_machine
from validation.machine import Machine, MachineLoad
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import batches, expand
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _runbook(tmp_path, **top):
    sanity = {"name": "sanity", "kind": "pytest", "tests": ["tests/unit/test_train_schedule.py"]}
    return write_runbook(tmp_path / "rb.yaml", [
        {"name": "preflight", "kind": "preflight"}, sanity, {**sanity, "name": "sanity2"},
        train_phase("first", env={"NSA_FAKE_STEP_S": "0.3"}), train_phase("second", env={"NSA_FAKE_STEP_S": "0.3"})],
        **top)


def test_timed_points_run_alone_and_untimed_ones_together(tmp_path):
    points = expand(load_runbook(_runbook(tmp_path)), load_profile("cpu"))
    assert [[p.phase.name for p in b] for b in batches(points, 2)] == [
        ["preflight", "sanity"], ["sanity2"], ["first"], ["second"]]
    assert [[p.phase.name for p in b] for b in batches(points, 1)] == [[p.phase.name] for p in points]
    assert [p.timed for p in points] == [False, False, False, True, True]


def test_a_run_with_max_parallel_2_never_overlaps_timed_points(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("first", env={"NSA_FAKE_STEP_S": "0.3"}),
                                              train_phase("second", env={"NSA_FAKE_STEP_S": "0.3"})], max_parallel=2)
    assert main(["run", "--runbook", str(rb), "--results-dir", str(tmp_path / "res"), "--no-report"]) == 0
    records = ResultStore(tmp_path / "res").records()
    assert len(records) == 2 and shared_machine(records) == {}


def _sweep(tokens_and_steps, start_s=None, accelerator="cpu"):
    out = []
    for i, (tokens, step_s) in enumerate(tokens_and_steps):
        started = f"2026-01-01T00:00:{(start_s if start_s is not None else 10 * i):02d}.000+00:00"
        out.append(PhaseRecord(PointKey("rb", "cpu", "scaling_sweep", {"train.batch_size": i}),
                               f"rb/cpu/scaling_sweep/{i}", "train", Status.PASS, "", sweep_index=i,
                               params_order=["train.batch_size"], exit_code=0, command=["python"], wall_s=5.0,
                               started=started, hardware=Machine(hostname="ci"), accelerator=accelerator,
                               metrics=Summary(tokens_per_step=tokens, step_time_s_mean=step_s,
                                               step_time_s_median=step_s, toks_per_s_mean=tokens / step_s,
                                               toks_per_s_stdev=1.0),
                               out_dir=f"runs/{i}"))
    return out


#: step time falling as tokens grow: what two timed points sharing 2 cores measured
NOISE = [(64, 0.045), (128, 0.031), (128, 0.030), (256, 0.012)]


def test_a_fit_that_says_nothing_is_no_finding():
    assert host_bound(_sweep(NOISE)) == []
    flat_cpu = _sweep([(2048, 0.210), (4096, 0.214), (4096, 0.218), (8192, 0.226), (8192, 0.229), (16384, 0.240)])
    [finding] = host_bound(flat_cpu)
    assert "cuda_graphs" not in " ".join(finding.detail) and "100%" not in " ".join(finding.detail)


def test_points_that_shared_the_machine_are_marked_and_left_out_of_speed_findings():
    cliff = [(64, 0.25), (128, 0.5), (128, 0.5), (256, 40.0)]  # 256 -> 6 tokens/s: a cliff when timed alone
    assert cliffs(_sweep(cliff))
    together = _sweep(cliff, start_s=0)
    assert cliffs(together) == [] and host_bound(together) == [] and best_setting(together) == []
    [warning] = [f for f in find(together) if f.kind == "timing"]
    assert warning.title.startswith("timings unreliable: 4 timed point(s) shared the machine")
    # the same points on two hosts did not share a machine
    apart = [dataclasses.replace(r, hardware=Machine(hostname=f"h{i}")) for i, r in enumerate(together)]
    assert shared_machine(apart) == {}


def test_a_best_setting_only_when_its_lead_beats_the_spread():
    recs = _sweep([(100, 1.0), (100, 0.995)])  # 100 vs 100.5 tokens/s, stdev 1.0 each
    [tie] = best_setting(recs)
    assert tie.title.startswith("no best setting in scaling_sweep") and "ran once" in tie.title


def test_points_run_once_name_no_best_setting_however_far_apart():
    """user13: points run once were told apart by their stdev over the window, which is step to
    step within one run, not run to run: three runs of one fused_adamw A/B named False, True and
    neither the best. One run per point cannot tell; the finding says so and names no winner."""
    [once] = best_setting(_sweep([(100, 1.0), (100, 0.5)]))  # 100 vs 200 tokens/s, stdev 1.0 each
    assert once.title.startswith("no best setting in scaling_sweep: batch_size=1 (200.0 toks/s) leads batch_size=0 "
                                 "(100.0) by 100.0, but batch_size=1 and batch_size=0 ran once"), once.title
    assert "repeats: 3" in once.title


def test_points_that_other_work_competed_with_are_marked_and_left_out_of_speed_findings():
    cliff = [(64, 0.25), (128, 0.5), (128, 0.5), (256, 40.0)]
    busy = MachineLoad(cores=2, busy_cores=2.0, others_cores=1.4)
    loaded = [dataclasses.replace(r, load=busy) if r.sweep_index == 3 else r for r in _sweep(cliff)]
    assert cliffs(loaded) == [] and busy_machine(loaded) == [loaded[3]]
    [warning] = [f for f in find(loaded) if f.kind == "busy_machine"]
    assert warning.title.startswith("timings unreliable: 1 timed point(s) ran while other processes kept the machine busy")
    assert warning.detail == ["scaling_sweep [batch_size=3]: other processes used 1.40 of the 2 cores on average "
                              "(2.00 in use in all, 0.60 by the point's)"]
    # a quiet machine's load leaves the cliff what it is
    quiet = [dataclasses.replace(r, load=MachineLoad(2, 2.0, 0.05)) for r in _sweep(cliff)]
    assert cliffs(quiet) and busy_machine(quiet) == []
