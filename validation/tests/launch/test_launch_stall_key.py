"""The runbook key ``stall_s``: how long a train phase may go without a new step before the
harness calls it a stall. Its default, and every bad value refused with the file and key named."""
from __future__ import annotations

import pytest
import yaml

from validation.errors import RunbookError
from validation.runbook.load import load_runbook


def _load(tmp_path, phases, **defaults):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "profiles": ["cpu"], "defaults": defaults, "phases": phases}))
    return path, load_runbook(path)


def test_default_is_a_quarter_of_the_timeout_and_a_phase_sets_its_own(tmp_path):
    _, rb = _load(tmp_path, [{"name": "a", "kind": "train", "timeout_s": 120},
                             {"name": "b", "kind": "train", "timeout_s": 120, "stall_s": 15}])
    assert rb.phase("a").stall_s is None and rb.phase("a").stall_after_s == 30
    assert rb.phase("b").stall_after_s == 15


def test_startup_s_defaults_to_the_stall_time(tmp_path):
    _, rb = _load(tmp_path, [{"name": "a", "kind": "train", "timeout_s": 120},
                             {"name": "b", "kind": "train", "timeout_s": 120, "stall_s": 15, "startup_s": 90}])
    assert rb.phase("a").startup_after_s == 30 and rb.phase("b").startup_after_s == 90


def test_the_defaults_value_reaches_train_phases_only(tmp_path):
    _, rb = _load(tmp_path, [{"name": "a", "kind": "train"}, {"name": "t", "kind": "pytest", "tests": ["x.py"]}],
                  stall_s=20, timeout_s=100)
    assert rb.phase("a").stall_after_s == 20 and rb.phase("t").stall_s is None


@pytest.mark.parametrize("phase, defaults, key, words", [
    ({"stall_s": 0}, {}, "phases[0].stall_s", "expected a number >= 1.0"),
    ({"stall_s": "10s"}, {}, "phases[0].stall_s", "expected a number >= 1.0"),
    ({"stall_s": True}, {}, "phases[0].stall_s", "expected a number >= 1.0"),
    ({"stall_s": 60, "timeout_s": 60}, {}, "phases[0].stall_s", "not below the phase's timeout_s (60 s)"),
    ({"timeout_s": 30}, {"stall_s": 45}, "defaults.stall_s (for phases[0])", "not below the phase's timeout_s (30 s)"),
    ({}, {"stall_s": -1}, "defaults.stall_s", "expected a number >= 1.0"),
    ({"kind": "pytest", "tests": ["x.py"], "stall_s": 10}, {}, "phases[0].stall_s", "only phases that run the trainer"),
    ({"startup_s": 0}, {}, "phases[0].startup_s", "expected a number >= 1.0"),
    ({"startup_s": 60, "timeout_s": 60}, {}, "phases[0].startup_s", "not below the phase's timeout_s (60 s)"),
    ({"kind": "pytest", "tests": ["x.py"], "startup_s": 10}, {}, "phases[0].startup_s", "only phases that run the trainer"),
])
def test_bad_stall_s_names_file_and_key(tmp_path, phase, defaults, key, words):
    with pytest.raises(RunbookError) as exc:
        _load(tmp_path, [{"name": "p", "kind": "train", **phase}], **defaults)
    msg = str(exc.value)
    assert str(tmp_path / "rb.yaml") in msg and f": {key}: " in msg and words in msg, msg


def test_shipped_cpu_runbook_sets_small_stall_times():
    rb = load_runbook("cpu_smoke")
    train = [p for p in rb.phases if p.kind == "train"]
    assert train and all(p.stall_after_s <= 30 for p in train)
