"""A GPU profile's records say they ran on CUDA: the record a point makes takes its profile's
accelerator, and a stored record that says "cpu" of a GPU profile's point (as every record of
older harnesses did, an H100's too) takes it from the point when a report reads it. The report's
CUDA advice (``Facts.cuda``) and its memory glossary read it: an H100 report said its peak reserved
memory was "on CPU the trainer process's resident set"."""
from __future__ import annotations

import dataclasses

from validation.judge.findings.finding import Facts
from validation.judge.record import PhaseRecord, Status
from validation.machine import Machine
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store.results import ResultStore
from validation.store.stale import realign
from validation.tests.conftest import train_phase, write_runbook

RSS = "on CPU the trainer process's resident set"


def _point(tmp_path, profile_name):
    runbook = load_runbook(write_runbook(tmp_path / "runbook.yaml", [train_phase("train", steps=8)],
                                         profiles=[profile_name]))
    profile = load_profile(profile_name)
    (point,) = expand(runbook, profile)
    return runbook, profile, point


def test_a_point_of_a_gpu_profile_makes_a_cuda_record(tmp_path):
    _, _, point = _point(tmp_path, "h100")
    rec = PhaseRecord.for_point(point, Status.PASS, "", exit_code=0)
    assert rec.accelerator == "cuda" and Facts.of(rec).cuda


def test_a_point_of_the_cpu_profile_makes_a_cpu_record(tmp_path):
    _, _, point = _point(tmp_path, "cpu")
    assert PhaseRecord.for_point(point, Status.PASS, "", exit_code=0).accelerator == "cpu"


def test_a_stored_cpu_record_of_a_gpu_profile_reads_as_cuda(tmp_path):
    runbook, profile, point = _point(tmp_path, "h100")
    stored = dataclasses.replace(PhaseRecord.for_point(point, Status.PASS, "", exit_code=0), accelerator="cpu")
    assert [r.accelerator for r in realign([stored], [point])] == ["cuda"]


def test_an_h100_report_does_not_call_its_memory_the_processes_resident_set(tmp_path):
    runbook, profile, point = _point(tmp_path, "h100")
    stored = dataclasses.replace(
        PhaseRecord.for_point(point, Status.PASS, "", exit_code=0, steps=8, out_dir="runs/x",
                              hardware=Machine(gpu_names=("NVIDIA H100 80GB HBM3",), gpu_mem_gb=(79.2,))),
        accelerator="cpu")
    results = tmp_path / "results"
    ResultStore(results).put_many([stored])
    ctx = build_context(results, runbook.name, profile.name, runbook=runbook, profile=profile,
                        now="2026-01-01 00:00 UTC")
    text = render_text({**ctx, "results_prefix": ".."})
    assert "Peak reserved" in text and RSS not in text
