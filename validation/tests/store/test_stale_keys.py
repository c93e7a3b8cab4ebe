"""Keys of the runbook that change what a stored result means beyond steps, config, overrides, env,
world size and gates (stale11): a stored 1-repeat PASS re-rendered against a runbook now asking 3
repeats, or a resume PASS against another resume_after, said GO. Each is now compared (stale.py):
the phase's kind, repeats (more than ran), resume_after, golden_steps newly asked, the launcher,
the trainer entry, a pytest phase's tests, the time allowances in the direction that can change
the stored result, and a machine below the point's minimum now. Records that kept none of these
are read as before. Records are made with PhaseRecord.for_point (no trainer run) except in the
first test, which goes through the CLI as a user does."""
from __future__ import annotations

import dataclasses

from validation.cli import main
from validation.judge.asked import Asked
from validation.judge.gates import GateResult, GateVerdict
from validation.judge.record import KIND_GATES, PhaseRecord, Status, SubRun
from validation.machine import Machine
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.runbook.types import Hardware
from validation.store import stale
from validation.tests.conftest import train_phase, write_runbook

GATES = [{"metric": "loss_finite", "op": "==", "threshold": 1}]
#: a runbook of a trainer entry sets no launcher module of this project's trainer
FOREIGN = {"defaults": {"launcher": {"kind": "python"}}}
NATIVE = {"name": "native_test", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": ["train", "resume"],
          "resume": {"stop_after": {"flag": "--stop-after"}, "from": {"flag": "--resume-from"}}}


def _point(tmp_path, phase, **top):
    [point] = expand(load_runbook(write_runbook(tmp_path / "rb.yaml", [phase], **top)), load_profile("cpu"))
    return point


def _record(point, status=Status.PASS, **fields):
    """A record of ``point`` as this harness stores it: a PASS holds the gates its kind judges."""
    judged = [GateResult(m, ">", 0.0, "", 1.0, GateVerdict.PASS) for m in KIND_GATES.get(point.phase.kind, ())]
    return PhaseRecord.for_point(point, status, "", **{"steps": point.phase.steps,
                                                       "gates": judged if status == Status.PASS else [], **fields})


def _texts(rec, point):
    return [c.text() for c in stale.changes(rec, point)]


def test_a_stored_single_run_is_not_GO_against_a_runbook_now_asking_3_repeats(tmp_path, capsys):
    rb, res = tmp_path / "rb.yaml", tmp_path / "res"
    write_runbook(rb, [train_phase("ab", gates=GATES, steps=3)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    write_runbook(rb, [train_phase("ab", gates=GATES, steps=3, repeats=3)])
    capsys.readouterr()
    assert main(["report", "--runbook", str(rb), "--results-dir", str(res)]) == 3  # INCOMPLETE, was GO
    report = (res / "reports" / "fake__cpu.md").read_text()
    assert "ab [default]: repeats 1 at the run, 3 in the runbook now" in report
    assert f"-m ab --runbook {rb} --profile cpu" in report


def test_repeats_more_than_ran_leave_a_point_not_run_fewer_keep_it(tmp_path):
    three = _point(tmp_path, train_phase("ab", gates=GATES, repeats=3))
    one = _point(tmp_path, train_phase("ab", gates=GATES))
    assert _texts(_record(one), three) == ["repeats 1 at the run, 3 in the runbook now"]
    assert _texts(_record(three), one) == []  # each of its 3 runs was judged a run of the point
    # a record that kept no repeats: its sub-runs say how many ran
    old = dataclasses.replace(_record(one), asked=None)
    assert _texts(old, three) == ["repeats 1 at the run, 3 in the runbook now"]
    runs = [SubRun(f"repeat{k}", f"repeat {k} of 3", "", Status.PASS, "") for k in (1, 2, 3)]
    assert _texts(dataclasses.replace(old, runs=runs), three) == []


def test_resume_after_changed_since_the_run(tmp_path):
    resume = {"name": "resume", "kind": "resume", "steps": 6, "gates": GATES}
    then, now = _point(tmp_path, {**resume, "resume_after": 3}), _point(tmp_path, {**resume, "resume_after": 4})
    assert _texts(_record(then), now) == ["resume_after 3 at the run, 4 in the runbook now"]
    assert _texts(_record(then), then) == []
    # a record that kept none: the step its passed first half stopped after
    first = SubRun("first", "first half (steps 1-3, stopped)", "", Status.PASS, "", first_step=1, last_step=3)
    old = dataclasses.replace(_record(then), asked=None, runs=[first])
    assert _texts(old, now) == ["resume_after 3 at the run, 4 in the runbook now"]
    failed = dataclasses.replace(old, status=Status.FAIL, runs=[dataclasses.replace(first, status=Status.FAIL)])
    assert _texts(failed, now) == []  # where it stopped is not known: nothing made up


def test_timeout_raised_changes_a_timed_out_run_only_and_lowered_a_pass_that_took_longer(tmp_path):
    def at(timeout_s):
        return _point(tmp_path, train_phase("p", gates=GATES, timeout_s=timeout_s, stall_s=1, startup_s=1))

    then = _record(at(30), wall_s=1.2)
    timed_out = dataclasses.replace(then, status=Status.FAIL, timed_out=True, wall_s=30.0)
    crashed = dataclasses.replace(then, status=Status.FAIL, exit_code=1)
    assert _texts(timed_out, at(300)) == ["timeout_s 30 at the run, 300 in the runbook now (the run timed out)"]
    assert _texts(crashed, at(300)) == []  # it crashed within 30 s, so within 300 s too
    assert _texts(then, at(300)) == []  # a pass stays a pass with more time
    assert _texts(then, at(10)) == []  # it took 1.2 s: within the lower timeout
    assert _texts(then, at(1.1)) == ["timeout_s 30 at the run, 1.1 in the runbook now (the run took 1.2 s)"]
    assert _texts(crashed, at(1.1)) == []  # a failure fails the same or sooner
    # every record keeps its timeout: one that kept nothing else is compared by it too
    assert _texts(dataclasses.replace(timed_out, asked=None), at(300))[0].startswith("timeout_s 30 at the run")


def test_a_stall_allowance_raised_changes_a_run_stopped_as_stalled_for_less(tmp_path):
    def at(stall_s):
        return _point(tmp_path, train_phase("p", gates=GATES, timeout_s=60, stall_s=stall_s, startup_s=5))

    stalled = dataclasses.replace(_record(at(7.5)), status=Status.FAIL, stalled_s=8.0, wall_s=9.0)
    assert _texts(stalled, at(20)) == ["stall_s 7.5 at the run, 20 in the runbook now (the run was stopped as "
                                       "stalled after 8 s without progress)"]
    assert _texts(stalled, at(8)) == []  # it was quiet for 8 s: the new allowance would have stopped it too
    passed = dataclasses.replace(_record(at(7.5)), wall_s=3.0)
    assert _texts(passed, at(4)) == []  # no quiet spell of a 3 s run was longer than 4 s
    assert _texts(passed, at(2)) == ["stall_s 7.5 at the run, 2 in the runbook now (the run took 3 s)"]


def test_the_phase_kind_the_launcher_and_a_pytest_phases_tests_changed_since_the_run(tmp_path):
    train = _point(tmp_path, train_phase("p", gates=GATES))
    resume = _point(tmp_path, train_phase("p", gates=GATES, kind="resume", resume_after=3))
    assert "kind train at the run, resume in the runbook now" in _texts(_record(train), resume)
    torchrun = _point(tmp_path, train_phase("p", gates=GATES, launcher={"kind": "torchrun", "nproc": 1}))
    assert _texts(_record(train), torchrun) == ["launcher kind python at the run, torchrun in the runbook now"]
    own = dataclasses.replace(train, phase=dataclasses.replace(
        train.phase, launcher=dataclasses.replace(train.phase.launcher, module="nsa.train")))
    assert _texts(_record(train), own) == ["trainer module validation.tests.fake_trainer at the run, nsa.train in "
                                           "the runbook now"]
    tests = {"name": "unit", "kind": "pytest", "tests": ["validation/tests/test_layout.py"]}
    pytest_then = _point(tmp_path, tests)
    pytest_now = _point(tmp_path, {**tests, "pytest_args": ["-k", "imports"]})
    assert _texts(_record(pytest_then), pytest_now) == ["pytest pytest_args unset at the run, -k imports in the runbook now"]


def test_the_runbooks_trainer_entry_changed_since_the_run(tmp_path):
    then = _point(tmp_path, train_phase("p", gates=GATES), trainer=NATIVE, **FOREIGN)
    now = _point(tmp_path, train_phase("p", gates=GATES), **FOREIGN,
                 trainer={**NATIVE, "args": [*NATIVE["args"], "--seed", "2"], "env": {"SEED_MODE": "fast"}})
    assert _texts(_record(then), now) == [
        "trainer args --steps {steps} --out-dir {out_dir} at the run, --steps {steps} --out-dir {out_dir} --seed 2 "
        "in the runbook now", "trainer env.SEED_MODE unset at the run, fast in the runbook now"]
    renamed = _point(tmp_path, train_phase("p", gates=GATES), trainer={**NATIVE, "name": "other_name"}, **FOREIGN)
    assert _texts(_record(then), renamed) == []  # a name is only what reports call it
    resume = {"name": "r", "kind": "resume", "steps": 6, "resume_after": 3, "gates": GATES}
    supported = _point(tmp_path, resume, trainer=NATIVE, **FOREIGN)
    without = {k: v for k, v in NATIVE.items() if k != "resume"}
    dropped = _point(tmp_path, resume, trainer={**without, "phases": ["train"]}, **FOREIGN)
    assert "trainer phases resume supported at the run, resume not supported in the runbook now" in \
        _texts(_record(supported), dropped)


def test_a_golden_comparison_newly_asked_leaves_a_pass_not_run(tmp_path):
    then = _point(tmp_path, train_phase("p", gates=GATES, steps=6))
    now = _point(tmp_path, train_phase("p", gates=GATES, steps=6, golden_steps=4))
    assert _texts(_record(then), now) == ["golden_steps unset at the run, 4 in the runbook now"]
    assert _texts(_record(then, Status.FAIL), now) == []  # a failure is no GO whatever else it is asked
    assert _texts(_record(now), then) == []  # taken away: its stored gate stands, as any gate taken away


def test_a_machine_below_the_points_minimum_now(tmp_path):
    point = _point(tmp_path, train_phase("p", gates=GATES))
    cuda = dataclasses.replace(point, profile=dataclasses.replace(
        point.profile, hardware=Hardware("cuda", min_gpus=2)))
    one_gpu = Machine(gpu_names=("NVIDIA H100",), gpu_mem_gb=(80.0,))
    assert _texts(_record(point, hardware=one_gpu), cuda) == [
        "hardware met the point's minimum at the run, below it in the runbook now "
        "(profile cpu needs 2 CUDA GPU(s); this machine has 1)"]
    two = Machine(gpu_names=("NVIDIA H100",) * 2, gpu_mem_gb=(80.0, 80.0))
    assert _texts(_record(point, hardware=two), cuda) == []


def test_records_that_kept_none_of_the_new_keys_are_read_and_not_judged_by_them(tmp_path):
    then = _point(tmp_path, train_phase("p", gates=GATES))
    now = _point(tmp_path, train_phase("p", gates=GATES, golden_steps=4, stall_s=1,
                                       launcher={"kind": "torchrun", "nproc": 1}))
    data = _record(then, wall_s=2.0).to_json()
    data["asked"] = {k: data["asked"][k] for k in ("steps", "config", "overrides", "env", "world_size", "gates")}
    older = PhaseRecord.from_json(data, "test")
    assert older.asked == Asked(8, "tiny", {}, {}, 1, ("loss_finite (all steps)",))
    assert _texts(older, now) == []
    assert _texts(_record(then, wall_s=2.0), now) == [
        "launcher kind python at the run, torchrun in the runbook now",
        "stall_s 7.5 at the run, 1 in the runbook now (the run took 2 s)",
        "startup_s 7.5 at the run, 1 in the runbook now (the run took 2 s)",  # startup_s follows stall_s
        "golden_steps unset at the run, 4 in the runbook now"]


def test_a_config_file_edited_since_the_run_leaves_the_point_not_run(tmp_path, monkeypatch):
    """A runbook's `config: mycfg.yaml` (a file at the trainer's working directory, this
    repository's root), the file then edited (n_layers 2 -> 3) under the same name: the stored GO
    stood, while a re-run of the same runbook was NO-GO on its golden curve. What the file held is
    kept (a digest) and compared, as its name is."""
    from nsa.config import PRESET_DIR

    for module in ("load", "plan"):  # the trainer's working directory, where the loader looks for the file too
        monkeypatch.setattr(f"validation.runbook.{module}.REPO_ROOT", tmp_path)
    cfg = tmp_path / "mycfg.yaml"
    cfg.write_text((PRESET_DIR / "tiny.yaml").read_text())
    point = _point(tmp_path, train_phase("ab", gates=GATES, steps=3, config="mycfg.yaml"))
    rec = _record(point)
    assert rec.asked.config_digest == point.config_digest() is not None
    assert _texts(rec, point) == []
    cfg.write_text(cfg.read_text().replace("n_layers: 2", "n_layers: 3"))
    [text] = _texts(rec, point)
    assert text.startswith(f"config file (name, SHA-256) {rec.asked.config_digest} at the run, "), text
    assert rec.asked.config_digest.startswith("mycfg.yaml ")
    # a file that cannot be read now is no change made up, nor one a record never kept
    cfg.unlink()
    assert point.config_digest() is None and _texts(rec, point) == []
    assert _texts(dataclasses.replace(rec, asked=dataclasses.replace(rec.asked, config_digest=None)), point) == []
    # a preset's digest is its file's
    assert _point(tmp_path, train_phase("ab", gates=GATES)).config_digest() is not None


def test_an_override_dropped_is_named_as_the_override_not_as_a_param_undeclared(tmp_path):
    """A phase that overrode fault.kind at the run and does not now, its param still declared: the
    report said 'trainer params.fault.kind {env: FAULT} at the run, unset in the runbook now' beside
    the override's own change, as though the runbook no longer declared the param."""
    trainer = {**NATIVE, "params": {"fault.kind": {"env": "FAULT"}}}
    then = _point(tmp_path, train_phase("p", gates=GATES, overrides={"fault.kind": "crash"}), trainer=trainer, **FOREIGN)
    now = _point(tmp_path, train_phase("p", gates=GATES), trainer=trainer, **FOREIGN)
    assert _texts(_record(then), now) == ["override fault.kind crash at the run, unset in the runbook now"]
    assert _texts(_record(now), then) == ["override fault.kind unset at the run, crash in the runbook now"]
    # the param's declaration changed while the point overrides it at the run and now: that is named
    moved = _point(tmp_path, train_phase("p", gates=GATES, overrides={"fault.kind": "crash"}), **FOREIGN,
                   trainer={**NATIVE, "params": {"fault.kind": {"flag": "--fault"}}})
    assert _texts(_record(then), moved) == [
        "trainer params.fault.kind {env: FAULT} at the run, {flag: --fault} in the runbook now"]
