"""`report` judges each stored record against the runbook as it is now (gofalse9): a stored 6-step
run re-rendered against a runbook that now asks 60 steps was GO, the mismatch unsaid. A record
whose run was asked for other steps, config, overrides, environment or world size than the point
asks now is no result of that point: NOT RUN (INCOMPLETE, never GO), naming the key, its value at
the run and now, and the command that re-runs only that point."""
from __future__ import annotations

import dataclasses
import hashlib
import json

from nsa.config import PRESET_DIR

from validation.cli import main
from validation.judge.asked import Asked
from validation.judge.record import PhaseRecord, Status
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store import stale
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook

GATES = [{"metric": "loss_finite", "op": "==", "threshold": 1}]
LAUNCHED = {"kind": "python", "nodes": "1"}


def _context(rb, res):
    runbook, profile = load_runbook(rb), load_profile("cpu")
    return build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)


def _ran(tmp_path, **phase):
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("long_run", gates=GATES, **phase)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    return rb, res


def test_a_stored_6_step_run_is_not_GO_against_a_runbook_that_asks_60(tmp_path, capsys):
    rb, res = _ran(tmp_path, steps=6)
    assert _context(rb, res)["verdict"] == "GO"
    write_runbook(rb, [train_phase("long_run", gates=GATES, steps=60)])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    assert ctx["status_reason"] == ("1 point(s) not run (1 of them stored from a run of what the runbook asks no "
                                    "longer: long_run [default]: steps 6 at the run, 60 in the runbook now)")
    assert ctx["counts"]["NOT RUN"] == 1 and ctx["counts"]["PASS"] == 0
    assert not ctx["phases"] and not ctx["gates"]  # its numbers are not shown as the point's
    text = render_text({**ctx, "results_prefix": ".."})
    line = next(ln for ln in text.splitlines() if ln.startswith("- `fake/cpu/long_run/default`"))
    assert "(PASS at the run)" in line and "steps 6 at the run, 60 in the runbook now" in line
    assert f"-m long_run --runbook {rb} --profile cpu --results-dir={res.resolve()}" in line
    capsys.readouterr()
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res)]) == 3  # INCOMPLETE
    assert "INCOMPLETE" in capsys.readouterr().out
    (stored,) = ResultStore(res).records()
    assert stored.status == Status.PASS  # the store keeps what the run found


def test_every_outdated_point_and_every_renamed_phases_record_is_named(tmp_path):
    """Two points outdated by one change read as if only the first was ('... asks no longer: a
    [default], steps 4 at the run, 6 in the runbook now'), and a renamed phase's stored record as
    '1 stored record(s) ... are not shown', naming none."""
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase(n, gates=GATES, steps=4) for n in ("a", "b", "g")])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    write_runbook(rb, [train_phase(n, gates=GATES, steps=6) for n in ("a", "b", "g2")])
    ctx = _context(rb, res)
    assert ctx["status_reason"] == ("3 point(s) not run (2 of them stored from a run of what the runbook asks no "
                                    "longer: a [default], b [default]: steps 4 at the run, 6 in the runbook now)")
    text = render_text({**ctx, "results_prefix": ".."})
    assert ("_1 stored record(s) of phases or points no longer in this runbook (renamed, removed, or a value no longer "
            "swept) are not shown: `fake/cpu/g/default` (PASS at the run)._") in text, text
    write_runbook(rb, [train_phase("a", gates=GATES, steps=6), train_phase("b", gates=GATES, steps=4, repeats=1,
                                                                          overrides={"train.lr": 0.5})])
    assert _context(rb, res)["status_reason"] == (
        "2 point(s) not run (2 of them stored from a run of what the runbook asks no longer: a [default]: steps 4 at "
        "the run, 6 in the runbook now; 1 more with its own change (listed under Not run))")


def test_overrides_and_world_size_changed_since_the_run_are_named(tmp_path):
    rb, res = _ran(tmp_path, steps=4, overrides={"train.lr": 0.001})
    write_runbook(rb, [train_phase("long_run", gates=GATES, steps=4, overrides={"train.lr": 0.002},
                                   launcher={"kind": "torchrun", "nproc": 2, "module": "validation.tests.fake_trainer"})])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    [o] = ctx["outdated"]
    assert o["why"] == ("override train.lr 0.001 at the run, 0.002 in the runbook now; "
                        "world size 1 at the run, 2 in the runbook now; "
                        "launcher kind python at the run, torchrun in the runbook now"), o["why"]


def test_a_stored_fail_of_another_point_is_not_run_either_and_a_point_as_asked_stays_GO(tmp_path):
    rb, res = _ran(tmp_path, steps=4)
    write_runbook(rb, [train_phase("long_run", gates=GATES, steps=4, env={"NSA_DDP_BUCKET_MB": "50"})])
    ctx = _context(rb, res)
    assert ctx["outdated"][0]["why"] == "env NSA_DDP_BUCKET_MB unset at the run, 50 in the runbook now"
    write_runbook(rb, [train_phase("long_run", gates=GATES, steps=4)])
    assert _context(rb, res)["verdict"] == "GO"  # the runbook as the run had it


#: the tiny preset's file, by its name and the first 16 hex digits of its SHA-256
TINY_DIGEST = "tiny.yaml " + hashlib.sha256((PRESET_DIR / "tiny.yaml").read_bytes()).hexdigest()[:16]


def test_records_of_older_harnesses_without_what_was_asked_compare_what_they_kept(tmp_path):
    rb, res = _ran(tmp_path, steps=6)
    (rec,) = ResultStore(res).records()
    old = PhaseRecord.from_json({k: v for k, v in rec.to_json().items() if k != "asked"}, "test")
    assert old.asked is None and rec.asked == Asked(
        6, "tiny", {}, {}, 1, ("loss_finite (all steps)",), repeats=1, resume_after=0, golden_steps=0, stall_s=7.5,
        startup_s=7.5, launcher=LAUNCHED, trainer={"module": "validation.tests.fake_trainer"},
        config_digest=TINY_DIGEST)
    runbook, profile = load_runbook(rb), load_profile("cpu")
    [point] = expand(runbook, profile)
    assert stale.changes(old, point) == ()
    write_runbook(rb, [train_phase("long_run", gates=GATES, steps=60)])
    [point] = expand(load_runbook(rb), profile)
    assert [c.text() for c in stale.changes(old, point)] == ["steps 6 at the run, 60 in the runbook now"]
    # env.json's world may exceed the processes launched: an older record's larger world is no change
    wide = dataclasses.replace(old, world_size=2, steps=60)
    assert stale.changes(wide, point) == ()


def test_what_was_asked_survives_the_store(tmp_path):
    rb, res = _ran(tmp_path, steps=3, overrides={"train.lr": 0.001})
    data = json.loads((res / "results.json").read_text())
    [stored] = data["records"].values()
    assert stored["asked"] == {"steps": 3, "config": "tiny", "overrides": {"train.lr": 0.001}, "env": {},
                               "world_size": 1, "gates": ["loss_finite (all steps)"], "repeats": 1, "resume_after": 0,
                               "golden_steps": 0, "stall_s": 7.5, "startup_s": 7.5, "join_timeout_s": None,
                               "launcher": LAUNCHED, "trainer": {"module": "validation.tests.fake_trainer"},
                               "pytest": None, "config_digest": TINY_DIGEST}


def test_a_stored_resume_pass_judged_without_resume_first_step_is_not_GO(tmp_path, capsys):
    """A results.json of a harness older than the resume_first_step gate holds resume PASSes judged
    without it, even of a second half that trained from step 1 again; re-rendered (or reported
    beside other phases run since), the report read GO on it. The record is not of the point as
    the harness judges it now: NOT RUN (INCOMPLETE), naming the gate and the command that re-runs it."""
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [{"name": "resume", "kind": "resume", "steps": 6, "resume_after": 3, "gates": GATES}])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    assert _context(rb, res)["verdict"] == "GO"
    store = res / "results.json"
    data = json.loads(store.read_text())
    [stored] = data["records"].values()
    stored["gates"] = [g for g in stored["gates"] if g["metric"] != "resume_first_step"]  # as an older harness kept it
    store.write_text(json.dumps(data))
    ctx = _context(rb, res)
    said = ("gate resume_first_step not judged at the run, judged by this harness now (of every resume point; the "
            "harness that judged the run did not make this check: run the point again)")
    assert (ctx["verdict"], ctx["status_reason"]) == ("INCOMPLETE", (
        f"1 point(s) not run (1 of them stored from a run of what the runbook asks no longer: resume [default]: {said})"))
    assert ctx["counts"]["NOT RUN"] == 1 and ctx["counts"]["PASS"] == 0
    line = next(ln for ln in render_text({**ctx, "results_prefix": ".."}).splitlines()
                if ln.startswith("- `fake/cpu/resume/default`"))
    assert "(PASS at the run)" in line and said in line and f"-m resume --runbook {rb} --profile cpu" in line, line
    capsys.readouterr()
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res)]) == 3  # INCOMPLETE, not GO
    assert "INCOMPLETE" in capsys.readouterr().out
    # a golden is of the loss, which a gate of the harness's does not change
    [point] = expand(load_runbook(rb), load_profile("cpu"))
    [rec] = ResultStore(res).records()
    assert [c.key for c in stale.changes(rec, point)] == [stale.GATE]
