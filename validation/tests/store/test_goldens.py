"""Golden loss curves: the file's schema and errors, the comparison naming the first diverging
step, ``bless`` (only the points asked for, nothing written on a bad selection), and the real
trainer on the CPU smoke runbook: the committed goldens pass unchanged and a one-line change to
the window semantics fails with the step named."""
from __future__ import annotations

import re
import shutil

import pytest
import yaml

from validation import RUNBOOK_DIR
from validation.cli import main
from validation.judge.record import Status
from validation.machine import Machine
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions
from validation.store.goldens import (
    Curve,
    GoldenError,
    GoldenFile,
    compare,
    hardware_class,
    spread,
)
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook

# --- the file --------------------------------------------------------------------------------

def test_round_trip_and_atomic_save(tmp_path):
    f = GoldenFile(tmp_path / "goldens" / "rb__cpu.yaml", "rb", "cpu")
    f.put("long_run/default", "cpu", Curve((5.5, 5.25), "abc", "2026-01-01T00:00:00+00:00", "2.13.0", "runs/x"))
    f.save()
    assert [p.name for p in f.path.parent.iterdir()] == ["rb__cpu.yaml"]  # no temp file left
    back = GoldenFile.for_pair(tmp_path / "rb.yaml", "rb", "cpu")
    assert back.get("long_run/default", "cpu") == f.get("long_run/default", "cpu")
    assert back.get("long_run/default", "nvidia_h100_80gb_hbm3") is None


@pytest.mark.parametrize("content, message", [
    ({"schema": 2, "runbook": "rb", "profile": "cpu", "points": {}}, "schema 2; this harness reads golden schema 1"),
    ({"schema": 1, "runbook": "other", "profile": "cpu", "points": {}}, "holds goldens of runbook 'other'"),
    ({"records": {}}, "not a golden loss file (no 'points' mapping)"),
    ({"schema": 1, "runbook": "rb", "profile": "cpu", "points": {"a/default": {"cpu": {"loss": ["x"]}}}},
     "points.a/default.cpu.loss: expected a non-empty list of finite numbers"),
])
def test_foreign_future_or_malformed_file_is_an_error_naming_it(tmp_path, content, message):
    path = tmp_path / "goldens" / "rb__cpu.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(GoldenError, match=re.escape(message)) as err:
        GoldenFile.for_pair(tmp_path / "rb.yaml", "rb", "cpu")
    assert str(path) in str(err.value)


def test_a_golden_point_written_twice_is_an_error_naming_it_not_the_second_curve(tmp_path):
    path = tmp_path / "goldens" / "rb__cpu.yaml"
    path.parent.mkdir()
    path.write_text("schema: 1\nrunbook: rb\nprofile: cpu\npoints:\n  a/default:\n    cpu: {loss: [5.0]}\n"
                    "  a/default:\n    cpu: {loss: [9.0]}\n")
    with pytest.raises(GoldenError, match=re.escape(f"{path}: not a readable golden file (key 'a/default' appears "
                                                    "twice in points (lines 5 and 7)")):
        GoldenFile.for_pair(tmp_path / "rb.yaml", "rb", "cpu")


def test_compare_names_the_first_step_beyond_the_tolerance():
    golden = Curve((5.0, 5.0, 5.0, 5.0))
    worst, first = compare([5.0, 5.0001, 5.02, 5.5], golden, rtol=1e-3)
    assert first.step == 3 and first.golden == 5.0 and first.loss == 5.02 and abs(worst - 0.1) < 1e-12
    assert "first diverging step 3: loss 5.02 vs golden 5 (abs diff 0.02, rel 0.004)" == first.text()
    assert compare([5.0, 5.0, 5.0, 5.0], golden, 1e-3) == (0.0, None)
    assert compare([5.0, None, 5.0, 5.0], golden, 1e-3)[0] is None  # a step not logged: no data


def test_hardware_class():
    assert hardware_class(Machine()) == "cpu"
    assert hardware_class(Machine(gpu_names=("NVIDIA H100 80GB HBM3",), gpu_mem_gb=(79.2,))) == "nvidia_h100_80gb_hbm3"


# --- bless (fake trainer: fast) ------------------------------------------------------------------

def _golden_runbook(tmp_path):
    return write_runbook(tmp_path / "rb.yaml", [
        train_phase("long_run", golden_steps=4, gates=[]),
        train_phase("scaling_sweep", golden_steps=3, gates=[], sweep={"train.batch_size": [1, 2]}),
        train_phase("fsdp", gates=[])])


def test_a_missing_golden_names_the_path_looked_for_and_whether_it_exists(tmp_path):
    """A runbook copied elsewhere looks for its goldens in goldens/ beside itself: the gate said 'no
    golden ... in <path>' whether that file was missing or held no curve of the point. It says
    which, naming the path; either way the point is UNMEASURED (INCOMPLETE), never a GO on nothing."""
    rb = load_runbook(_golden_runbook(tmp_path))
    long_run = next(p for p in expand(rb, load_profile("cpu")) if p.phase.name == "long_run")
    path = tmp_path / "goldens" / "fake__cpu.yaml"
    record = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(long_run)
    assert record.status == Status.UNMEASURED
    assert f"no golden for long_run/default on cpu: {path} does not exist (golden files are looked for in " \
           "goldens/ beside the runbook); write one with `nsa-validate bless " in record.reason, record.reason
    other = GoldenFile.for_pair(rb.path, "fake", "cpu")
    other.put("long_run/default", "nvidia_h100_80gb_hbm3", Curve((3.0, 2.9, 2.8, 2.7)))
    other.save()
    record = AcceptanceSession(SessionOptions(tmp_path / "res")).run_point(long_run)
    assert record.status == Status.UNMEASURED
    assert (f"no golden for long_run/default on cpu: {path} exists but holds no such curve (it has long_run/default "
            "on nvidia_h100_80gb_hbm3); write one with") in record.reason, record.reason


def test_bless_rewrites_only_the_points_asked_for(tmp_path, capsys):
    rb, res = _golden_runbook(tmp_path), tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    assert "long_run/default: UNMEASURED (" in capsys.readouterr().err  # no golden yet, the reason says so
    long_run = next(r for r in ResultStore(res).records() if r.phase == "long_run")
    assert "no golden for long_run/default on cpu" in long_run.reason
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 0
    path = tmp_path / "goldens" / "fake__cpu.yaml"
    first = GoldenFile.for_pair(rb, "fake", "cpu")
    assert sorted(first.curves) == ["long_run/default", "scaling_sweep/batch_size=1", "scaling_sweep/batch_size=2"]
    assert first.get("long_run/default", "cpu").loss == (2.99, 2.98, 2.97, 2.96)  # the fake trainer's loss
    # a second run passes its golden gates; bless then replaces only the point named
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res)]) == 0  # GO
    assert main(["bless", "--runbook", str(rb), f"--results-dir={res}", "--point=scaling_sweep/batch_size=2"]) == 0
    assert "blessed scaling_sweep/batch_size=2 on cpu: 3 steps" in capsys.readouterr().out
    second = GoldenFile.for_pair(rb, "fake", "cpu")
    assert second.get("scaling_sweep/batch_size=2", "cpu").run != first.get("scaling_sweep/batch_size=2", "cpu").run
    for unchanged in ("long_run/default", "scaling_sweep/batch_size=1"):
        assert second.get(unchanged, "cpu") == first.get(unchanged, "cpu")
    # a bad selection writes nothing and names what could be chosen
    before = path.read_text()
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--point", "long_run/x"]) == 2
    assert "choose from: long_run/default, scaling_sweep/batch_size=1" in capsys.readouterr().err
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "fsdp"]) == 2
    assert "--phase fsdp: this phase has no golden_steps" in capsys.readouterr().err
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(tmp_path / "empty")]) == 2
    assert "no result store in" in capsys.readouterr().err
    assert path.read_text() == before


def test_bless_refuses_a_point_without_a_finished_run(tmp_path, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[], fault="crash:step=2"),
                                              train_phase("fsdp", golden_steps=2, gates=[])])
    res = tmp_path / "res"
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 2
    assert "long_run/default: its stored run did not finish (FAIL: trainer crashed" in capsys.readouterr().err
    assert not (tmp_path / "goldens").exists()  # all or nothing: fsdp was not blessed either


def test_bless_refuses_a_point_that_failed_a_gate(tmp_path, capsys):
    """user hC's pass: a point whose loss spiked inside its golden window failed its loss gate, and
    bless made that curve the golden, exit 0. A FAIL or ERROR record is refused, naming its status
    and reason; an UNMEASURED one (no golden yet, timings not judged) stays blessable."""
    rb = write_runbook(tmp_path / "rb.yaml", [
        train_phase("long_run", golden_steps=4, fault="spike:step=2",
                    gates=[{"metric": "loss_mean", "op": "<=", "threshold": 3.0}]),
        train_phase("fsdp", golden_steps=2, gates=[])])
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    capsys.readouterr()
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 2
    err = capsys.readouterr().err
    assert "nsa-validate: error: long_run/default: its stored run is FAIL (loss_mean = " in err, err
    assert ("nothing blessed: the loss of a failed run is no golden curve (fix what failed and re-run it first: "
            f"nsa-validate run --runbook {rb} --profile cpu --phase long_run --results-dir {res})") in err, err
    assert not (tmp_path / "goldens" / "fake__cpu.yaml").exists()  # all or nothing: fsdp was not blessed either
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "fsdp"]) == 0  # UNMEASURED


def test_two_blesses_at_once_keep_both_curves(tmp_path, monkeypatch):
    """user hC's pass: two `nsa-validate bless` of one runbook at once both exited 0, and the file
    held only the curves of the one that wrote last (each had read the file before the other
    wrote). Each save here waits a while first, so that without a lock both read the file empty."""
    import threading
    import time

    from validation.store import bless, goldens

    rb_path, res = _golden_runbook(tmp_path), tmp_path / "res"
    assert main(["run", "--runbook", str(rb_path), "--results-dir", str(res), "--no-report"]) == 0
    rb, prof = load_runbook(rb_path), load_profile("cpu")
    write = goldens.write_atomic
    monkeypatch.setattr(goldens, "write_atomic", lambda *a, **kw: (time.sleep(0.5), write(*a, **kw))[-1])
    done: list[list[bless.Blessed]] = []
    threads = [threading.Thread(target=lambda pid=pid: done.append(bless.bless(res, rb, prof, bless.select(
        rb, prof, None, [pid])))) for pid in ("long_run/default", "scaling_sweep/batch_size=1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 2
    assert sorted(GoldenFile.for_pair(rb_path, "fake", "cpu").curves) == ["long_run/default",
                                                                          "scaling_sweep/batch_size=1"]


def test_golden_steps_needs_a_train_phase_and_a_profile_tolerance(tmp_path):
    from validation.errors import RunbookError
    bad = write_runbook(tmp_path / "a.yaml", [train_phase("long_run", golden_steps=9, steps=8, gates=[])])
    with pytest.raises(RunbookError, match=r"phases\[0\].golden_steps: 9 is more than the phase's 8 steps"):
        load_runbook(bad)
    prof = tmp_path / "cpu.yaml"
    prof.write_text("name: cpu\nmarker: cpu_profile\nhardware: {accelerator: cpu}\nthresholds: {min_toks_per_s: 1}\n")
    rb = load_runbook(write_runbook(tmp_path / "b.yaml", [train_phase("long_run", golden_steps=2, gates=[])]))
    with pytest.raises(RunbookError, match="sets golden_steps, but profile .* has no golden_loss_rtol threshold"):
        expand(rb, load_profile(prof))


# --- the real trainer on the CPU smoke runbook -----------------------------------------------------

def test_cpu_smoke_golden_passes_unchanged_and_fails_on_a_window_change(tmp_path):
    """The committed goldens, with the runbook's own long_run point (40 real training steps) and
    with one line of the model's semantics changed (window 16 -> 15)."""
    data = yaml.safe_load((RUNBOOK_DIR / "cpu_smoke.yaml").read_text())
    data["phases"] = [p for p in data["phases"] if p["name"] == "long_run"]
    profile = load_profile("cpu")
    records = {}
    for name, window in (("same", None), ("window15", 15)):
        (tmp_path / name).mkdir()
        if window:
            data["phases"][0].setdefault("overrides", {})["model.attn.window"] = window
        path = tmp_path / name / "cpu_smoke.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        shutil.copytree(RUNBOOK_DIR / "goldens", tmp_path / name / "goldens")
        point, = expand(load_runbook(path), profile)
        records[name] = AcceptanceSession(SessionOptions(tmp_path / name / "res")).run_point(point)
    same, changed = records["same"], records["window15"]
    golden = next(g for g in same.gates if g.metric == "golden_loss_rel_diff")
    assert same.status == Status.PASS and golden.value <= 1e-4, same.reason
    assert changed.status == Status.FAIL
    assert "golden_loss_rel_diff = " in changed.reason and "first diverging step " in changed.reason
    step = int(changed.reason.split("first diverging step ")[1].split(":")[0])
    assert 1 <= step <= 20


def test_spread_of_several_runs():
    s = spread([[5.0, 5.0, 4.0], [5.0, 5.001, 4.0], [5.0, 4.999, 4.004]])
    assert (s.runs, s.steps, s.first_step) == (3, 3, 2)
    assert abs(s.max_abs - 0.004) < 1e-12 and abs(s.max_rel - 0.001) < 1e-12
    assert spread([[1.0, 2.0], [1.0, 2.0, 3.0]]).first_step is None


def test_a_drift_from_the_golden_names_both_commits_and_how_to_bless(tmp_path):
    """A golden gate that failed says where the golden came from (commit, date) beside the run's
    commit, and its advice tells a change of the trainer's numerics (check it repeats, bless)
    from a run that does not repeat itself (bisect): an H100 golden blessed before a kernel change
    failed with only the diverging step named."""
    from validation.judge.findings import find, recommendations

    rb, res = _golden_runbook(tmp_path), tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report", "--phase", "long_run"]) == 0
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "long_run"]) == 0
    path = tmp_path / "goldens" / "fake__cpu.yaml"
    data = yaml.safe_load(path.read_text())
    curve = data["points"]["long_run/default"]["cpu"]
    curve.update(loss=[2.99, 2.98, 2.5, 2.96], commit="4e57f6d87d31a45b403e1e0b932c86e7270b2e92",
                 blessed="2026-11-23T14:26:17+00:00")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--phase", "long_run"]) == 1  # NO-GO
    rec = next(r for r in ResultStore(res).records() if r.phase == "long_run")
    assert "first diverging step 3: loss 2.97 vs golden 2.5" in rec.reason
    assert "the golden: commit 4e57f6d87d31, blessed 2026-11-23" in rec.reason
    finding, = (f for f in find([rec]) if f.kind == "golden")
    assert f"this run: the trainer at commit {rec.ran_at[:12]}" in finding.detail
    advice, = recommendations([finding])
    assert advice.startswith("long_run: The loss left its golden curve") and "`nsa-validate bless --phase long_run`" in advice
    assert ("bench/gpu/golden_losses.sh" in advice) == rec.own_trainer  # a script for this project's trainer only
    # as the advice says: a run that failed only its golden gate is what a bless replaces
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "long_run"]) == 0
    assert GoldenFile.for_pair(rb, "fake", "cpu").get("long_run/default", "cpu").loss == (2.99, 2.98, 2.97, 2.96)


@pytest.mark.parametrize("loss_by_repeat, repeats_agree", [("", True), ("1,1.001", False)])
def test_a_golden_points_repeats_tell_changed_numbers_from_runs_that_do_not_repeat(tmp_path, loss_by_repeat,
                                                                                   repeats_agree):
    """With repeats, a golden point is also judged on its runs against each other: runs that agree
    while the golden differs are this commit's numbers (bless after checking), runs that differ are
    a trainer that does not repeat itself. On the H100 this was told apart by hand, from another
    phase's run of the same steps."""
    from validation.judge.findings import find, recommendations

    env = {"NSA_FAKE_LOSS_BY_REPEAT": loss_by_repeat} if loss_by_repeat else {}
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("determinism", golden_steps=4, repeats=2, gates=[], env=env)])
    res = tmp_path / "res"
    golden = GoldenFile(tmp_path / "goldens" / "fake__cpu.yaml", "fake", "cpu")
    golden.put("determinism/default", "cpu", Curve((2.99, 2.98, 2.5, 2.96), "4e57f6d87d31", "2026-11-23T14:26:17"))
    golden.save()
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res)]) == 1  # NO-GO: the golden differs
    rec, = ResultStore(res).records()
    agree = next(g for g in rec.gates if g.metric == "repeat_loss_rel_diff")
    # each repeat left the golden curve: a finding of each, naming its repeat
    goldens_found = [f for f in find([rec]) if f.kind == "golden"]
    assert [f.title.split(": ")[0] for f in goldens_found] == ["gate failed in determinism [default], repeat 1 of 2",
                                                               "gate failed in determinism [default], repeat 2 of 2"]
    golden_finding = goldens_found[1]  # the repeat the record does not keep says as much as the one it keeps
    repeat_findings = [f for f in find([rec]) if f.kind == "repeats"]
    if repeats_agree:
        assert (agree.value, agree.note) == (0.0, "2 runs identical at every step")
        assert ("the point's repeats agree with each other (2 runs identical at every step): this commit repeats "
                "itself, so its numbers differ from those of the golden's commit") in golden_finding.detail
        assert not repeat_findings
    else:
        assert agree.value > 1e-4 and agree.note.startswith("2 runs first differ at step 1, by up to ")
        assert not any("repeats agree" in line for line in golden_finding.detail)
        finding, = repeat_findings
        assert finding.title.startswith("gate failed in determinism [default]: repeat_loss_rel_diff = ")
        advice = recommendations([finding])[0]
        assert "Runs of one commit with one seed gave different losses" in advice


def test_the_golden_gate_compares_the_steps_golden_steps_asks_whatever_the_curve_holds(tmp_path):
    """The gate compared as many steps as the blessed curve held: a 4-step golden passed a point now
    asking golden_steps 6 whose steps 5-6 were never compared, and a 6-step golden failed a point now
    asking 4 ('lacks a finite loss for one of steps 1-6'). It compares steps 1..golden_steps; a curve
    of fewer is no golden of them (UNMEASURED, naming its steps and the bless line with the store)."""
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("long_run", golden_steps=4, gates=[], steps=6)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0  # no golden yet
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "long_run"]) == 0
    curve = GoldenFile.for_pair(rb, "fake", "cpu").get("long_run/default", "cpu")
    assert len(curve.loss) == 4
    write_runbook(rb, [train_phase("long_run", golden_steps=6, gates=[], steps=6)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    rec = next(r for r in ResultStore(res).records() if r.phase == "long_run")
    [gate] = rec.gates
    assert rec.status == Status.UNMEASURED and gate.window == "steps 1-6", (rec.reason, gate)
    assert (f"no golden for long_run/default on cpu: the curve in {tmp_path / 'goldens' / 'fake__cpu.yaml'} holds "
            f"steps 1-4, fewer than golden_steps 6; write one with `nsa-validate bless --runbook {rb} --profile cpu "
            f"--point long_run/default --results-dir {res.resolve()}`") in gate.note, gate.note
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--phase", "long_run"]) == 0
    write_runbook(rb, [train_phase("long_run", golden_steps=3, gates=[], steps=3)])  # a shorter point, same numbers
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    rec = next(r for r in ResultStore(res).records() if r.phase == "long_run")
    assert rec.status == Status.PASS and rec.gates[0].window == "steps 1-3", rec.reason


def test_a_report_after_a_bless_says_what_the_golden_file_holds_now(tmp_path):
    """After blessing one point of two, the report still said of the other 'goldens/... does not
    exist' (its note as stored at the run), beside an environment line saying the file exists."""
    from validation.report.build import build_context

    rb, res = _golden_runbook(tmp_path), tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report",
                 "--phase", "scaling_sweep"]) == 0
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res), "--point",
                 "scaling_sweep/batch_size=1"]) == 0
    runbook, profile = load_runbook(rb), load_profile("cpu")
    ctx = build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)
    [row] = [g for g in ctx["gates"] if g["point"] == "batch_size=2" and g["metric"] == "golden_loss_rel_diff"]
    text = str(row)
    assert "does not exist" not in text and "exists but holds no such curve" in text, text
