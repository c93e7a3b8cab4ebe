"""The result store: atomic writes, a re-run replaces only its own records, concurrent writers
on one directory lose nothing, a corrupt, foreign or future store is an error naming the file
(found before any point runs), an old (schema 1) store still reads, and a point's artifacts are
replaced only together with its record."""
from __future__ import annotations

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation.cli import main
from validation.errors import StoreError
from validation.judge.record import PhaseRecord, PointKey, Status, Summary
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook

REPO = Path(__file__).resolve().parents[3]


def _rec(phase, params=None, reason="r", runbook="rb", profile="cpu"):
    return PhaseRecord(PointKey(runbook, profile, phase, params or {}), f"{runbook}/{profile}/{phase}", "train",
                       Status.PASS, reason)


def test_put_replaces_only_same_key(tmp_path):
    store = ResultStore(tmp_path)
    store.put_many([_rec("a"), _rec("b", {"x": 1}), _rec("b", {"x": 2}), _rec("a", profile="a100")])
    store.put(_rec("b", {"x": 1}, reason="again"))
    got = {(r.key.phase, json.dumps(r.key.params), r.key.profile): r.reason for r in store.records()}
    assert got == {("a", "{}", "cpu"): "r", ("b", '{"x": 1}', "cpu"): "again", ("b", '{"x": 2}', "cpu"): "r",
                   ("a", "{}", "a100"): "r"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_records_round_trip_through_json(tmp_path):
    rec = _rec("a", {"train.seq_len": 512})
    rec.metrics = Summary(toks_per_s_mean=12.5, idle_ranks=None)
    ResultStore(tmp_path).put(rec)
    (back,) = ResultStore(tmp_path).records()
    assert back == rec and back.status is Status.PASS


def _writer(path, tag, n):
    store = ResultStore(path)
    for i in range(n):
        store.put(_rec(f"{tag}{i}"))


def test_two_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(tmp_path, tag, 25)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(ResultStore(tmp_path).records()) == 50


@pytest.mark.parametrize("text, message", [
    ("{not json", r"results\.json: not valid JSON"),
    ('{"name": "something else"}', r"results\.json: not an nsa-validate result store"),
    ('{"schema": 7, "records": {}}', r"results\.json: schema 7; this harness reads schemas 1, 2"),
    ('{"schema": 2, "records": {"k": {"no": "key"}}}', r"results\.json: record k: not a phase record"),
])
def test_bad_store_is_an_error_naming_the_file(tmp_path, text, message):
    (tmp_path / "results.json").write_text(text)
    with pytest.raises(StoreError, match=message):
        ResultStore(tmp_path).records()


def test_a_corrupt_store_stops_a_run_before_any_point_runs(tmp_path, capsys):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.json").write_text("{not json")
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (results / "runs").exists()  # nothing ran


@pytest.mark.parametrize("corrupt, removed", [
    ("{not json", True),
    ('{"name": "something else"}', True),
    ('{"schema": 2, "records": {"k": {"no": "key"}}}', True),
    ('{"schema": 7, "records": {}}', False),  # a newer harness's store: its reports are its own
    ('{"records": {}}', True),  # every harness wrote a schema: this is none of theirs
])
def test_a_corrupt_store_takes_its_reports_with_it(tmp_path, capsys, corrupt, removed):
    """user hH's pass: `report` on a corrupt results.json exited 2 and left the previous GO report
    in place, which a reader or CI takes as current. The reports of a store that is no store any
    more are removed, and the error says so."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == 0
    report = results / "reports" / "fake__cpu.md"
    assert "**Status: GO**" in report.read_text()
    capsys.readouterr()
    (results / "results.json").write_text(corrupt)
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert report.exists() != removed
    assert (f"Removed the report(s) rendered from it, which it no longer backs: {report}" in err) == removed, err


@pytest.mark.parametrize("store", ["deleted", "empty", "no schema"])
def test_a_store_without_records_takes_its_reports_with_it_and_says_what_it_is(tmp_path, capsys, store):
    """user hC's pass: a deleted results.json, or one holding no records, or one without its schema
    key left the previous GO report standing, and a deleted one was said to 'hold no records'."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(results), "--no-plots"]) == 0
    report, path = results / "reports" / "fake__cpu.md", results / "results.json"
    capsys.readouterr()
    if store == "deleted":
        path.unlink()
        why = f"no results in {results} (no results.json in {results}; give the --results-dir a run wrote into)"
    elif store == "empty":
        path.write_text('{"schema": 2, "records": {}}')
        why = f"no results in {results} ({path} holds no records; give the --results-dir a run wrote into)"
    else:
        data = json.loads(path.read_text())
        del data["schema"]
        path.write_text(json.dumps(data))
        why = f"{path}: not an nsa-validate result store (it has no 'schema' key)"
    assert main(["report", "--results-dir", str(results), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nsa-validate: error: {why}"), err
    assert f"Removed the report(s) rendered from it, which it no longer backs: {report}" in err, err
    assert not report.exists()


def test_a_schema_1_store_still_reads(tmp_path):
    """What harness versions before the typed record wrote (stores kept from before it must still read)."""
    old = {"key": {"runbook": "rb", "profile": "cpu", "phase": "long_run", "params": {}}, "test_id": "rb/cpu/long_run/default",
           "kind": "train", "status": "FAIL", "reason": "watchdog wrote .HALT", "run_id": "x", "sweep_index": 0,
           "params_order": [], "started": "2026-11-22T00:00:00+00:00", "wall_s": 3.0, "command": ["python"], "env": {},
           "overrides": {}, "steps": 8, "timeout_s": 30, "out_dir": "runs/rb/cpu/long_run/default", "exit_code": 3,
           "timed_out": False, "world_size": 2, "window": "all steps", "metrics": {"toks_per_s_mean": 5.0},
           "gates": [{"metric": "halt", "op": "==", "threshold": 0, "window": "all steps", "value": 1.0, "verdict": "FAIL",
                      "threshold_ref": None, "description": ""}],
           "evidence": {"errors": [], "stderr_tail": "", "halt": True, "halt_record": {"source": "watchdog", "step": 3},
                        "stackdumps": {"1": {"path": "stackdump_rank1.txt", "frames": [{"file": "a.py", "line": 3, "func": "f"}],
                                             "header": None}},
                        "last_heartbeat": {"1": {"step": 3, "stage": "backward", "time": 1.0}},
                        "rank_step_time_s": {"0": 0.5}, "fallbacks": {}, "files": ["training.csv"]},
           "hardware": {}, "git_sha": "abc", "backends": {"sel": {"backend": "torch", "reason": "portable", "calls": 4}}}
    (tmp_path / "results.json").write_text(json.dumps({"schema": 1, "records": {"k": old}}))
    (rec,) = ResultStore(tmp_path).records()
    assert rec.status == Status.FAIL and rec.evidence.halt.source == "watchdog" and rec.evidence.halt.step == 3
    assert rec.evidence.stackdumps[1].frames[0].func == "f" and rec.evidence.last_heartbeat[1].stage == "backward"
    assert rec.backends["sel"].backend == "torch" and rec.gates[0].verdict == "FAIL"
    ResultStore(tmp_path).put(_rec("other"))  # written back in schema 2, the old record kept
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["schema"] == 2 and len(data["records"]) == 2


def test_selective_rerun_changes_only_its_phase(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp"), train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [1, 2]})])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 0
    before = {r.test_id: r for r in ResultStore(results).records()}
    assert len(before) == 3
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--phase", "bucket_sweep", "--no-plots"]) == 0
    after = {r.test_id: r for r in ResultStore(results).records()}
    assert after.keys() == before.keys()
    assert after["fake/cpu/baseline_ddp/default"] == before["fake/cpu/baseline_ddp/default"]
    for tid in ("fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=1", "fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=2"):
        assert after[tid].run_id != before[tid].run_id
        assert not (results / before[tid].out_dir).exists()  # the earlier run's artifacts went with its record
    # the baseline's artifacts survive the bucket sweep's re-run
    assert (results / after["fake/cpu/baseline_ddp/default"].out_dir / "training.csv").exists()


def test_a_point_another_process_is_running_is_left_alone(tmp_path):
    """Two harness runs on one results directory reaching the same point: the second must not
    delete the first's artifacts mid-run nor overwrite its record."""
    import fcntl

    from validation.runbook.load import load_profile, load_runbook
    from validation.runbook.plan import expand
    from validation.session.point import point_dir
    from validation.session.session import AcceptanceSession, SessionOptions

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 0
    before = ResultStore(results).records()
    (point,) = expand(load_runbook(str(rb)), load_profile("cpu"), ["baseline_ddp"])
    base = point_dir(results, point)
    with open(base.with_name(base.name + ".lock"), "a+") as held:  # the "first run"
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record = AcceptanceSession(SessionOptions(results)).run_point(point)
    assert record.status == "SKIP"
    assert "being run by another harness process" in record.reason
    assert ResultStore(results).records() == before
    assert (results / before[0].out_dir / "training.csv").exists()


def test_interrupt_mid_point_keeps_store_artifacts_and_report_in_step(tmp_path):
    """Ctrl-C while a point re-runs: its earlier record still names artifacts that are its own
    (the partial run's files are not mixed in), and the report renders the points finished."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("first"),
                                              train_phase("second", steps=100, env={"NSA_FAKE_STEP_S": "0.05"})],
                       defaults={"timeout_s": 120})
    results = tmp_path / "results"
    base = ["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]
    assert main(base) == 0  # 100 steps of 50 ms: about 5 s
    old = {r.phase: r for r in ResultStore(results).records()}
    proc = subprocess.Popen([sys.executable, "-m", "validation", *base], cwd=REPO, stderr=subprocess.PIPE, text=True)
    second_runs = results / "runs" / "fake" / "cpu" / "second" / "default"
    deadline = time.monotonic() + 60
    while not any((d / "training.csv").exists() for d in second_runs.iterdir() if d.name != Path(old["second"].out_dir).name):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    now = {r.phase: r for r in ResultStore(results).records()}
    assert now["second"] == old["second"]  # the interrupted point's record is the earlier run's
    csv = (results / old["second"].out_dir / "training.csv").read_text().splitlines()
    assert int(csv[-1].split(",")[0]) == old["second"].metrics.steps_completed  # its own CSV, untouched
    assert now["first"].run_id != old["first"].run_id  # the point finished before the interrupt is stored
    report = (results / "reports" / "fake__cpu.md").read_text()
    assert now["first"].out_dir in report and old["second"].out_dir in report


def test_the_store_file_is_readable_by_others_and_reading_writes_nothing(tmp_path):
    """results.json was owner-only (mkstemp's 0600) while the reports and goldens beside it are
    0644, and every read created results.json.lock: a colleague's results directory, shared
    read-only, could not serve as a --baseline."""
    res = tmp_path / "res"
    ResultStore(res).put(PhaseRecord(PointKey("rb", "cpu", "p", {}), "rb/cpu/p/default", "train", Status.PASS, ""))
    assert (res / "results.json").stat().st_mode & 0o777 == 0o644
    (res / "results.json.lock").unlink()
    before = sorted(p.name for p in res.iterdir())
    assert [r.key.phase for r in ResultStore(res).records("rb", "cpu")] == ["p"]
    ResultStore(res).check()
    assert sorted(p.name for p in res.iterdir()) == before
    assert ResultStore(tmp_path / "none").records() == [] and not (tmp_path / "none").exists()
