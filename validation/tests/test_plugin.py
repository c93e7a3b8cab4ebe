"""The pytest plugin: runbook points become marked, parametrized tests; marker and -k selection
work; records land in the store and the report is rendered at session end; a bad runbook is a
usage error naming the key; hardware checks skip or run as the profile and option say."""
from __future__ import annotations

import subprocess
import sys

from validation import REPO_ROOT
from validation.orchestrate import why_not
from validation.plan import expand
from validation.runbook import load_profile, load_runbook
from validation.store import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _pytest(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _runbook(tmp_path):
    return write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp"),
                                               train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [25, 50]})])


def test_marker_selects_one_phase_and_ids_name_the_point(tmp_path):
    out = _pytest("validation/tests/test_acceptance.py", "--collect-only", "--runbook", str(_runbook(tmp_path)),
                  "-m", "bucket_sweep")
    assert "test_phase[fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=25]" in out.stdout
    assert "test_phase[fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=50]" in out.stdout
    assert "baseline_ddp" not in out.stdout


def test_run_stores_records_and_renders_report(tmp_path):
    res = tmp_path / "res"
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(_runbook(tmp_path)), "--results-dir", str(res),
                  "-k", "bucket_sweep or test_report")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout  # two sweep points + the cross-point report check
    assert {r.key.phase for r in ResultStore(res).records()} == {"bucket_sweep"}
    assert f"nsa-validate report: INCOMPLETE -> {res}/reports/fake__cpu.md" in out.stdout
    text = (res / "reports" / "fake__cpu.md").read_text()
    assert "**Status: INCOMPLETE**" in text and "`fake/cpu/baseline_ddp/default`" in text  # not run this time


def test_failing_point_fails_its_test_with_the_reason(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", fault="crash:step=2")])
    out = _pytest("validation/tests/test_acceptance.py", "--runbook", str(rb), "--results-dir", str(tmp_path / "r"))
    assert out.returncode == 1
    assert "FAIL: trainer crashed (exit code 1)" in out.stdout and "RuntimeError" in out.stdout


def test_bad_runbook_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprofiles: [cpu]\nphases:\n  - {name: p, kind: train, gates: [{metric: x, op: '>=', threshold: 1}]}\n")
    out = _pytest("validation/tests/test_acceptance.py", "--collect-only", "--runbook", str(bad))
    assert out.returncode != 0
    assert "bad.yaml: phases[0].gates[0].metric: unknown metric 'x'" in out.stdout + out.stderr


def test_gpu_profiles_skip_on_cpu_with_a_reason():
    out = _pytest("validation/tests/test_acceptance.py", "-m", "a100 and preflight", "-rs")
    assert out.returncode == 0 and "1 skipped" in out.stdout
    assert "needs a CUDA GPU" in out.stdout


H100_BOX = {"gpu_count": 2, "gpu_names": ["NVIDIA H100 80GB HBM3"] * 2, "gpu_mem_gb": [79.1, 79.1]}


def test_h100_box_runs_a100_profile_unless_mismatch_is_skip():
    base = expand(load_runbook("nsa_ddp_a100"), load_profile("a100"), ["baseline_ddp"])[0]
    assert why_not(base, H100_BOX, "run") is None
    assert "is for A100 GPUs; this machine has NVIDIA H100" in why_not(base, H100_BOX, "skip")
    one_gpu = {**H100_BOX, "gpu_count": 1, "gpu_names": H100_BOX["gpu_names"][:1], "gpu_mem_gb": [79.1]}
    assert "needs 2 CUDA GPU(s); this machine has 1" in why_not(base, one_gpu, "run")
    h200 = expand(load_runbook("nsa_ddp_a100"), load_profile("h200"), ["baseline_ddp"])[0]
    assert "needs 139.0 GiB per GPU; smallest here is 79.1 GiB" in why_not(h200, H100_BOX, "run")
