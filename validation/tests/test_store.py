"""The result store: atomic writes, a re-run replaces only its own records, concurrent writers
on one directory lose nothing, and a corrupt store is an error naming the file."""
from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from validation.cli import main
from validation.errors import StoreError
from validation.store import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _rec(phase, params=None, value=1.0, runbook="rb", profile="cpu"):
    return {"key": {"runbook": runbook, "profile": profile, "phase": phase, "params": params or {}}, "value": value}


def test_put_replaces_only_same_key(tmp_path):
    store = ResultStore(tmp_path)
    store.put_many([_rec("a"), _rec("b", {"x": 1}), _rec("b", {"x": 2}), _rec("a", profile="a100")])
    store.put(_rec("b", {"x": 1}, value=9.0))
    got = {(r["key"]["phase"], json.dumps(r["key"]["params"]), r["key"]["profile"]): r["value"] for r in store.records()}
    assert got == {("a", "{}", "cpu"): 1.0, ("b", '{"x": 1}', "cpu"): 9.0, ("b", '{"x": 2}', "cpu"): 1.0,
                   ("a", "{}", "a100"): 1.0}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


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


def test_corrupt_store_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"results\.json: not valid JSON"):
        ResultStore(tmp_path).records()


def test_selective_rerun_changes_only_its_phase(tmp_path):
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp"), train_phase("bucket_sweep", sweep={"env.NSA_DDP_BUCKET_MB": [1, 2]})])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 0
    before = {r["test_id"]: r for r in ResultStore(results).records()}
    assert len(before) == 3
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--phase", "bucket_sweep", "--no-plots"]) == 0
    after = {r["test_id"]: r for r in ResultStore(results).records()}
    assert after.keys() == before.keys()
    assert after["fake/cpu/baseline_ddp/default"] == before["fake/cpu/baseline_ddp/default"]
    for tid in ("fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=1", "fake/cpu/bucket_sweep/NSA_DDP_BUCKET_MB=2"):
        assert after[tid]["run_id"] != before[tid]["run_id"]
    # the baseline's artifacts survive the bucket sweep's re-run
    assert (results / after["fake/cpu/baseline_ddp/default"]["out_dir"] / "training.csv").exists()


def test_a_point_another_process_is_running_is_left_alone(tmp_path):
    """Two harness runs on one results directory reaching the same point: the second must not
    delete the first's artifacts mid-run nor overwrite its record."""
    import fcntl

    from validation.orchestrate import run_point
    from validation.phases import run_dir
    from validation.plan import expand
    from validation.runbook import load_profile, load_runbook

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("baseline_ddp")])
    results = tmp_path / "results"
    assert main(["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), "--no-plots"]) == 0
    before = ResultStore(results).records()
    (point,) = expand(load_runbook(str(rb)), load_profile("cpu"), ["baseline_ddp"])
    out_dir = run_dir(results, point)
    with open(out_dir.with_name(out_dir.name + ".lock"), "a+") as held:  # the "first run"
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record = run_point(point, results)
    assert record["status"] == "SKIP"
    assert "being run by another harness process" in record["reason"]
    assert ResultStore(results).records() == before
    assert (out_dir / "training.csv").exists()
