"""The profile phase through the artifact contract: the harness asks (CONTRACT_PROFILE_STEPS in
the trainer's environment) and reads profile.json; it never imports the trainer. A trainer that
does not honour the request leaves the point UNMEASURED, never FAIL or a made-up PASS, whatever its
gates read."""
from __future__ import annotations

from typing import Any

import yaml

from nsa.contract import PROFILE_STEPS_ENV
from validation.judge.findings import Severity, find
from validation.judge.findings.advice import recommendations
from validation.judge.gates import GateVerdict
from validation.judge.record import PhaseRecord, Status
from validation.judge.verdict import rejudge
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions

GATES = [{"metric": "profiled_steps", "op": ">=", "threshold": 2},
         {"metric": "nsa_ranges_found", "op": ">=", "threshold": 1}]


def _point(tmp_path, phase: dict[str, Any], trainer: dict[str, Any] | None = None):
    data = {"name": "prof", "profiles": ["cpu"], "phases": [phase],
            "defaults": {"timeout_s": 120, "env": {"OMP_NUM_THREADS": 1}}}
    if trainer:
        data["trainer"] = trainer
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (point,) = expand(load_runbook(path), load_profile("cpu"))
    return point


def test_this_projects_trainer_profiles_on_request(tmp_path):
    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 4, "profile_steps": 2, "config": "tiny",
                              "overrides": {"train.seq_len": 64, "model.n_layers": 1}, "gates": GATES})
    assert point.env[PROFILE_STEPS_ENV] == "2"
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.PASS, (rec.reason, rec.evidence.stderr_tail)
    assert rec.metrics.profiled_steps == 2 and rec.metrics.nsa_ranges_found >= 1
    assert rec.metrics.steps_completed == 4 and rec.evidence.top_ops
    assert f"{PROFILE_STEPS_ENV}=2" in " ".join(f"{k}={v}" for k, v in rec.env.items())


def test_a_trainer_that_ignores_the_request_is_unmeasured(tmp_path):
    native = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
              "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "profile"]}
    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 6, "profile_steps": 2, "gates": GATES},
                   native)
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.UNMEASURED, (rec.status, rec.reason)
    assert "wrote no profile.json" in rec.reason and PROFILE_STEPS_ENV in rec.reason
    assert {g.verdict for g in rec.gates} == {GateVerdict.UNMEASURED}


def test_a_trainer_that_ignores_the_request_is_unmeasured_whatever_its_gates(tmp_path):
    """A profile phase whose gates read no profile (loss_finite alone) was PASS, the report GO,
    without a word of the profile the trainer never wrote: the phase exists to profile, so the point
    is UNMEASURED, and a warning names the point, the file and the request it ignored."""
    native = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
              "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "profile"]}
    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 6, "profile_steps": 3,
                              "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}, native)
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    said = f"the trainer wrote no profile.json although {PROFILE_STEPS_ENV}=3 asked for one: it does not honour the request"
    assert (rec.status, rec.reason) == (Status.UNMEASURED, f"{said}; its gates: 1 gate(s) passed")
    assert [g.verdict for g in rec.gates] == [GateVerdict.PASS]
    [finding] = [f for f in find([rec]) if f.kind == "no_profile"]
    assert finding.severity == Severity.WARNING
    assert finding.title == f"profile point nvtx [default] profiled nothing: {said}"
    assert finding.detail[0] == f"run directory: {rec.out_dir} (no profile.json; no note in env.json's profile)"
    [advice] = recommendations([finding])
    assert f"{PROFILE_STEPS_ENV}=N" in advice and "writes profile.json" in advice
    # the stored record reads the same: the report judges it again from the store
    stored = PhaseRecord.from_json(rec.to_json(), "test")
    assert (rejudge(stored, stored.gates).status, stored.evidence.no_profile) == (Status.UNMEASURED, rec.evidence.no_profile)


def test_this_projects_trainer_says_why_a_run_too_short_profiled_nothing(tmp_path):
    """A run that ends before its first steady step profiles nothing, and this project's trainer says
    so in env.json's profile note: the point is UNMEASURED quoting it, not a trainer that ignored the
    request."""
    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 1, "profile_steps": 1, "config": "tiny",
                              "overrides": {"train.seq_len": 64, "model.n_layers": 1},
                              "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]})
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.UNMEASURED, (rec.status, rec.reason, rec.evidence.stderr_tail)
    assert rec.reason == (f"no profile.json: the trainer profiled none of the 1 step(s) {PROFILE_STEPS_ENV} asked for, "
                          "and says why in env.json's profile: not profiled: the run ends at step 1, before its first "
                          "steady step 2; its gates: 1 gate(s) passed")
    assert "does not honour" not in rec.reason
    [finding] = [f for f in find([rec]) if f.kind == "not_profiled"]
    assert finding.title.startswith("profile point nvtx [default] profiled nothing: no profile.json")
    assert "more `steps` than the trainer's warm-up" in recommendations([finding])[0]


def test_the_harness_recomputes_the_gpu_busy_share_and_refuses_a_contradicted_claim(tmp_path, monkeypatch):
    """A trainer's gpu_busy_frac is a claim: the harness gates on the busy share of the timeline
    the trainer left beside it, reports the host's pauses, and a claim the timeline contradicts
    makes the point an ERROR naming both figures, never a PASS on the claim."""
    native = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
              "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "profile"]}
    gates = [{"metric": "gpu_busy_frac", "op": ">=", "threshold": 0.4}]
    phase = {"name": "nvtx", "kind": "profile", "steps": 4, "profile_steps": 3, "gates": gates}
    for claim, status in (("0.5", Status.PASS), ("0.93", Status.ERROR)):
        monkeypatch.setenv("TEST_TRAINER_BUSY_CLAIM", claim)
        (tmp_path / claim).mkdir()
        point = _point(tmp_path / claim, phase, native)
        rec = AcceptanceSession(SessionOptions(tmp_path / claim / "res")).run_point(point)
        assert rec.status == status, (rec.status, rec.reason)
        assert rec.metrics.gpu_busy_frac == 0.5 and rec.metrics.gpu_host_pause_ms == 5.0
        if status == Status.ERROR:
            assert "says gpu_busy_frac 0.9300" in rec.reason and "gives 0.5000" in rec.reason


def test_a_failed_busy_gate_names_the_hosts_pauses(tmp_path, monkeypatch):
    """Below its busy-share gate, the finding says how long the GPU waited on the host a step and
    where the host's side of the profile is."""
    from validation.judge.findings.failures import failed_gates

    native = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
              "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "profile"]}
    monkeypatch.setenv("TEST_TRAINER_BUSY_CLAIM", "0.5")
    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 4, "profile_steps": 3,
                              "gates": [{"metric": "gpu_busy_frac", "op": ">=", "threshold": 0.8}]}, native)
    rec = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point)
    assert rec.status == Status.FAIL, (rec.status, rec.reason)
    (finding,) = failed_gates([rec])
    assert "gpu_busy_frac = 0.5" in finding.title
    assert any(d.endswith("idle 5.00 ms a profiled step in gaps of 1 ms or more: the host pausing it (a sync, an "
                          "optimizer's launches, loading data)") for d in finding.detail), finding.detail
    assert "profile_top_ops.txt" not in rec.evidence.files  # this trainer writes no table: none is named


def test_check_artifacts_reads_a_profile_as_its_point_does(tmp_path, capsys):
    """check-artifacts said OK of a folder whose profile.json its profile point was an ERROR for
    ('not a profile record'): it now reads the profile files where present, with the same readers."""
    from validation.cli import main

    point = _point(tmp_path, {"name": "nvtx", "kind": "profile", "steps": 4, "profile_steps": 2, "config": "tiny",
                              "overrides": {"train.seq_len": 64, "model.n_layers": 1}, "gates": GATES})
    assert AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(point).status == Status.PASS
    (profile,) = (tmp_path / "res").rglob("profile.json")
    assert main(["check-artifacts", str(profile.parent)]) == 0
    assert "present              profile.json: 2 profiled steps" in capsys.readouterr().out
    profile.write_text('{"profiled_steps": "x"}')
    assert main(["check-artifacts", str(profile.parent)]) == 1
    out = capsys.readouterr().out
    assert "malformed            profile.json: not a profile record (profiled_steps is 'x'" in out, out
