"""The report's Reproduce line of a point's process, run as printed, writes into a new directory
it names and leaves the stored run's files, the evidence the report shows, as they were."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from validation.report.tables import reproduce_rows
from validation.tests.conftest import train_phase


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _run_as_printed(line: str, cwd: Path) -> Path:
    out = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, line + "\n" + out.stderr[-3000:]
    [where] = re.findall(r"^writing into (\S+)$", out.stderr, re.M)
    return Path(where)


def test_a_train_points_process_line_writes_into_a_new_directory(fake_run, tmp_path):
    run = fake_run([train_phase(steps=6)])
    stored = run.results / run.record.out_dir
    before = _files(stored)
    [row] = reproduce_rows(run.records)
    new = _run_as_printed(row["process"], tmp_path)
    assert _files(stored) == before
    assert new != stored and stored not in new.parents
    assert len((new / "training.csv").read_text().splitlines()) == 7  # header and steps 1-6


def test_a_resume_points_three_processes_write_into_a_new_directory(fake_run, tmp_path):
    run = fake_run([{"name": "resume", "kind": "resume", "steps": 6, "resume_after": 3,
                     "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}])
    assert run.record.status == "PASS", run.record.reason
    stored = (run.results / run.record.out_dir).parent  # the point's run: reference, first, second
    before = _files(stored)
    [row] = reproduce_rows(run.records)
    new = _run_as_printed(row["process"], tmp_path)
    assert _files(stored) == before
    assert sorted(p.name for p in new.iterdir()) == ["first", "reference", "second"]
    # the second half resumed from the new first half's checkpoint: it logged steps 4-6
    assert [ln.split(",")[0] for ln in (new / "second" / "training.csv").read_text().splitlines()[1:]] == ["4", "5", "6"]
