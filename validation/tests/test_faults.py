"""Injected faults through the fake trainer give the right verdict, finding and evidence, and
never hang pytest. The fake trainer (fake_trainer.py) writes the trainer's output contract."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

from validation.tests.conftest import train_phase


def test_healthy_run_is_go(fake_run):
    run = fake_run([train_phase()])
    assert run.record.status == "PASS", run.record.reason
    assert run.context["status"] == "GO"
    assert "**Status: GO**" in run.report
    gate = run.record.gates[0]
    assert gate.window == "last 5 steps" and gate.value > 199


def test_crash_is_nogo_with_stderr_tail(fake_run):
    run = fake_run([train_phase(fault="crash:step=3")])
    rec = run.record
    assert rec.status == "FAIL" and rec.exit_code == 1
    assert "trainer crashed" in rec.reason
    [crash] = run.findings("critical")
    assert "mark a variable ready only once" in crash
    assert run.context["status"] == "NO-GO"
    assert "## Failure Evidence" in run.report and "RuntimeError: Expected to mark" in run.report


def test_stalled_rank_reports_where_each_rank_was(fake_run):
    run = fake_run([train_phase(fault="stall:rank=1:step=3", env={"NSA_FAKE_WORLD": "2"})])
    rec = run.record
    assert rec.status == "FAIL" and ".HALT" in rec.reason
    [stall] = [f for f in run.findings("critical") if f.startswith("stall")]
    assert "rank 1 in backward_stuck" in stall and "rank 0 in all_reduce" in stall
    assert "rank 1: last heartbeat step 3, stage backward" in stall
    assert "fake_trainer.py" in stall


def test_hang_is_stopped_as_a_stall_with_its_child_killed(fake_run):
    """No step at all for the phase's stall_s (a quarter of its timeout by default): the harness
    takes the stack and kills the tree, the trainer's child too, long before the timeout."""
    start = time.monotonic()
    run = fake_run([train_phase(fault="hang", timeout_s=60, stall_s=4)])  # 4 s: a loaded CI box starts in time
    assert time.monotonic() - start < 30
    rec = run.record
    assert rec.status == "FAIL" and not rec.timed_out and rec.stalled_s >= 4 and "stalled" in rec.reason
    child = int((run.results / rec.out_dir / "child.pid").read_text())
    _assert_dead(child)
    [stall] = [f for f in run.findings("critical") if f.startswith("stall")]
    assert "no progress for" in stall and "rank 0 in allreduce_wait" in stall  # the harness's py-spy stack


def _assert_dead(pid: int) -> None:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as fh:  # a zombie awaiting its reaper is dead enough
            if fh.read().split()[2] == "Z":
                return
        time.sleep(0.1)
    raise AssertionError(f"child process {pid} of the timed-out trainer is still running")


def test_a_logged_nan_names_its_first_step(fake_run):
    """A trainer without a loss guard logs NaN and exits 0: the failed gate's finding names the
    first step whose loss is not finite (it named none before)."""
    run = fake_run([train_phase(fault="nan_logged:step=3")])
    assert run.record.status == "FAIL" and run.record.evidence.nonfinite_loss_step == 3
    [nan] = [f for f in run.findings("critical") if "loss_finite" in f]
    assert "first non-finite loss logged at step 3" in nan


def test_a_logged_nan_is_no_go_where_no_gate_checks_the_loss(fake_run):
    """A runbook of one's own that gates only tokens/s: a trainer without a loss guard logged NaN
    at step 3 and went on to exit 0. The point passed its gate and the report was GO, saying 'No
    automatic findings: no ... loss or gradient-norm spike or divergence detected' of a run whose
    training.csv holds a NaN loss (a NaN-free rise of 0.2 nats is a critical finding). Then the
    report was NO-GO while the point stayed a PASS in its record and the report's counts: it is a
    FAIL, whatever its gates."""
    run = fake_run([train_phase(fault="nan_logged:step=3", gates=[
        {"metric": "toks_per_s_mean", "op": ">=", "threshold": {"profile": "min_toks_per_s"}, "window": "last 5 steps"}])])
    assert run.record.evidence.nonfinite_loss_step == 3
    assert (run.record.status, run.record.reason) == (
        "FAIL", "non-finite loss logged at step 3, and the trainer did not stop on it (no .HALT); its gates: 1 gate(s) "
        "passed")
    assert "| 0 | 1 | 0 | 0 | 0 | 0 |" in run.report
    assert run.context["status"] == "NO-GO", run.context["status"]
    [nan] = run.findings("critical")
    assert "non-finite loss in baseline_ddp [default]: first logged at step 3" in nan, nan
    assert "**Status: NO-GO**" in run.report


def test_missing_csv_is_error_naming_the_file(fake_run):
    run = fake_run([train_phase(fault="missing_csv")])
    assert run.record.status == "ERROR"
    assert "training.csv: missing" in run.record.reason
    assert run.context["status"] == "NO-GO"


def test_a_step_counter_that_moves_by_two_is_no_go(fake_run):
    """A trainer counting two steps a step (steps 2, 4, ..., 10 in its CSV and in its heartbeats'
    stage records) ran half the steps it claims: it was GO, steps_completed 10 of 10."""
    run = fake_run([train_phase(fault="count_twice", steps=10, env={"NSA_FAKE_WORLD": "2"})])
    assert run.record.status == "ERROR", run.record.reason
    assert ("heartbeat_rank0.jsonl step: malformed (stages of 5 steps from 2 to 10, but of none of steps 3, 5, 7, 9: "
            "those steps were counted and never started") in run.record.reason
    assert run.context["status"] == "NO-GO"


def test_corrupt_csv_names_row_and_column(fake_run):
    run = fake_run([train_phase(fault="corrupt_csv")])
    assert run.record.status == "ERROR"
    assert "line 3 (step 2), column toks_per_s: 'fast' is not a number" in run.record.reason


def test_wrong_csv_header_is_error(fake_run):
    run = fake_run([train_phase(fault="corrupt_csv:header=1")])
    assert run.record.status == "ERROR" and "header is step,loss,toks" in run.record.reason


def test_throughput_cliff_names_the_sweep_step(fake_run):
    run = fake_run([train_phase("scaling_sweep", fault="cliff", sweep={"train.seq_len": [32, 64], "train.batch_size": [1, 2]})])
    assert [r.status for r in run.records] == ["PASS"] * 4  # each point clears the 1 toks/s floor
    [cliff] = run.findings("critical")
    assert "throughput cliff in scaling_sweep at [seq_len=32, batch_size=2]" in cliff
    assert "toks/s after 201.2 toks/s at [seq_len=32, batch_size=1] (31.4x drop)" in cliff
    assert run.context["status"] == "NO-GO"
    assert "**Scaling breakdown**" in run.report


def test_idle_rank_is_found(fake_run):
    run = fake_run([train_phase("fsdp", fault="idle:rank=1", env={"NSA_FAKE_WORLD": "2"},
                                gates=[{"metric": "idle_ranks", "op": "==", "threshold": 0}])])
    assert run.record.status == "FAIL" and "idle_ranks = 1" in run.record.reason
    [idle] = run.findings("critical")
    assert "1 of 2 rank(s) did no work" in idle and "rank 1: last step 0, stage data, GPU util 0%" in idle


def test_a_rank_without_heartbeats_is_a_broken_contract_not_a_rank_that_did_no_work(fake_run):
    """user7's pass: a trainer whose rank 1 trained every step but wrote no heartbeat was told
    only that rank 1 'did no work' and to check that every rank gets data: the files cannot tell
    an idle rank from one whose trainer does not beat. What they show is a rank that wrote no
    heartbeat, which the contract asks of every rank (a user pass)."""
    run = fake_run([train_phase("ddp", fault="idle:rank=1:silent=1", env={"NSA_FAKE_WORLD": "2"},
                                gates=[{"metric": "idle_ranks", "op": "==", "threshold": 0}])])
    [idle] = run.findings("critical")
    assert ("rank 1 of 2 wrote no heartbeat (heartbeat_rank1.jsonl has no record), which the contract asks of every "
            "rank: whether it did work, its files cannot tell") in idle, idle
    assert "did no work" not in idle, idle


def test_slow_rank_is_imbalance_with_per_rank_step_times(fake_run):
    run = fake_run([train_phase(fault="slow:rank=1", env={"NSA_FAKE_WORLD": "2"},
                                gates=[{"metric": "rank_step_time_ratio", "op": "<=", "threshold": 1.5}])])
    assert run.record.status == "FAIL"
    # one finding of it, critical, naming the gate: it was a WARNING beside a 'gate failed' one (a user pass)
    [crit] = run.findings("critical")
    assert "rank 1 takes 3.0x as long per step as rank 0; gate rank_step_time_ratio = 3" in crit, crit
    assert "needs <= 1.5" in crit and not run.findings("warning")
    # without a gate on it, past IMBALANCE_RATIO, it is a warning
    run = fake_run([train_phase(fault="slow:rank=1", env={"NSA_FAKE_WORLD": "2"}, gates=[])])
    [warn] = run.findings("warning")
    assert "rank 1 takes 3.0x as long per step as rank 0" in warn and "gate" not in warn


def test_fallbacks_are_reported(fake_run):
    run = fake_run([train_phase("sdpa_audit", fault="fallback",
                                gates=[{"metric": "fallbacks_total", "op": "<=", "threshold": 0},
                                       {"metric": "backends_recorded", "op": "==", "threshold": 1}])])
    assert run.record.status == "FAIL"
    [fb] = run.findings("warning")
    assert fb.startswith("fallbacks in 1 of 1 run(s): sel route, sel_triton_fail")
    assert "sdpa_audit [default]: sel_triton_fail: 8; sel: backend torch (fallback: triton unavailable)" in fb


def test_bucket_sweep_table_and_no_best_setting_of_points_run_once(fake_run):
    """Two bucket sizes the fake trainer runs at the same speed, once each: no 'best setting' is
    named (a seed report once recommended the 'best warmup' of three buckets 228-232 toks/s apart)."""
    run = fake_run([train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [25, 50]})])
    assert run.context["status"] == "GO"
    [choice] = run.findings("info")
    assert choice.startswith("no best setting in bucket_sweep: NSA_DDP_BUCKET_MB=") and "ran once" in choice
    assert "| NSA_DDP_BUCKET_MB | Mean toks/s | MFU | Stdev |" in run.report
    assert run.records[0].env["NSA_DDP_BUCKET_MB"] == "25"


def test_every_failed_gate_is_a_finding_and_the_best_setting_still_shows(fake_run):
    """A NO-GO of failed throughput gates once said 'No automatic findings', and the best-setting
    finding vanished as soon as a sweep point failed."""
    slow = [{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1000, "window": "last 5 steps",
             "description": "Throughput >= 1000 toks/s"}]
    run = fake_run([train_phase("bucket_sweep", gates=slow, sweep={"env.NSA_FAKE_TOKS_SCALE": [1, 1.5, 2]})])
    assert run.context["status"] == "NO-GO"
    failed = [f for f in run.findings("critical") if f.startswith("gate failed")]
    assert len(failed) == 3
    assert "gate failed in bucket_sweep [NSA_FAKE_TOKS_SCALE=1]: toks_per_s_mean = 20" in failed[0]
    assert "needs >= 1000 (last 5 steps)" in failed[0] and "Throughput >= 1000 toks/s" in failed[0]
    [best] = run.findings("info")  # 2x as fast, but each point ran once: the finding shows, naming no winner
    assert best.startswith("no best setting in bucket_sweep: NSA_FAKE_TOKS_SCALE=2 ") and "ran once" in best
    assert "No automatic findings" not in run.report and "## Recommendations" in run.report


def test_one_low_gpu_reading_of_a_working_rank_is_no_idle_rank():
    """A rank is idle by its GPU only when every reading is ~0 while another's are busy (median
    >= 50%); one low NVML sample beside a busy one, or a small model's low readings, are noise."""
    from validation.judge.metrics import _idle_ranks

    def run(utils: dict[int, list[float]], held_gb: dict[int, float] | None = None):
        beats = {r: [{"step": i + 1, "stage": "step", "gpu_util": u,
                      **({"mem_alloc_gb": held_gb[r]} if held_gb else {})} for i, u in enumerate(us)]
                 for r, us in utils.items()}
        return SimpleNamespace(heartbeats=beats, world_size=len(utils))

    assert _idle_ranks(run({0: [60, 55, 70], 1: [55, 60, 3]}), None) == 0  # the last reading alone said idle
    assert _idle_ranks(run({0: [99, 98, 99], 1: [0, 1, 0]}), None) == 1  # the seeds' FSDP run
    # a healthy tiny run over NCCL on two H200s: rank 1 read 1% at most steps while rank 0 read 29%
    assert _idle_ranks(run({0: [29] * 5, 1: [1] * 5}), None) == 0
    assert _idle_ranks(run({0: [4, 3, 2], 1: [1, 0, 2]}), None) == 0  # nobody busy: a small model, not an idle rank
    # the same run again (2026-11-27): rank 0 read 56% and rank 1 1% at 29 of 31 readings; each rank
    # holds the same model (equal memory here): a rank waiting in NCCL keeps a kernel resident, and
    # the one that came late reads idle. Without mem_alloc_gb in the heartbeats it is called idle.
    assert _idle_ranks(run({0: [56] * 29, 1: [1] * 29}, {0: 0.3, 1: 0.3}), None) == 0
    assert _idle_ranks(run({0: [56] * 29, 1: [1] * 29}), None) == 1
    assert _idle_ranks(run({0: [99, 98, 99], 1: [0, 1, 0]}, {0: 27.0, 1: 0.004}), None) == 1  # the seeds', 27 GB / 4 MB


def test_the_phase_table_says_what_its_stdev_and_peak_reserved_are(fake_run):
    """user13: 'Stdev' is the population stdev over the window (step to step, not run to run) and
    'Peak reserved' on CPU is the process's resident set; the report said neither."""
    run = fake_run([train_phase()])
    assert ("**Stdev**: the population standard deviation (`statistics.pstdev`: over the window's n logged steps, not "
            "n - 1) of their tokens/s: step to step within one run, not the spread between runs.\n") in run.report
    assert ("**Peak reserved**: the largest `mem_reserved_gb` of the window's logged steps in training.csv; on CPU the "
            "trainer process's resident set (RSS), not accelerator memory") in run.report


def test_the_stdev_is_said_from_what_the_runbook_gates_not_a_snippet_it_does_not_have(fake_run):
    """'as the runbook's snippet computes it' was said under every train table, of runbooks that have
    no snippet: the Stdev's line names the gates on it that the runbook has, and no other."""
    run = fake_run([train_phase(gates=[
        {"metric": "toks_per_s_cv", "op": "<=", "threshold": 2.0, "window": "last 5 steps"},
        {"metric": "toks_per_s_stdev", "op": "<=", "threshold": 1e9, "window": "last 5 steps"}])])
    assert ("not the spread between runs; a `toks_per_s_stdev` gate reads it as it is; a `toks_per_s_cv` gate reads "
            "it over the window's mean tokens/s.\n") in run.report
    assert "snippet" not in run.report


def test_a_trainer_that_logs_infinite_tokens_per_s_is_no_go(fake_run):
    """user13: an infinite tokens/s (a step timed as 0 s) passed every throughput floor: GO."""
    run = fake_run([train_phase(env={"NSA_FAKE_TOKS_SCALE": "inf"})])
    assert run.record.status == "ERROR" and run.context["status"] == "NO-GO"
    assert "training.csv toks_per_s: malformed (step 1 holds inf (8 of 8 rows)" in run.record.reason, run.record.reason
