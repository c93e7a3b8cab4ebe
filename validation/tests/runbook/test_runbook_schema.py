"""A runbook key is declared once, as a field of its dataclass (validation/runbook/schema.py): the
loader's keys and defaults, the reference page and the staleness check all read that declaration."""
from __future__ import annotations

import dataclasses

import yaml

from validation import REPO_ROOT
from validation.runbook import keys
from validation.runbook.load import load_runbook
from validation.runbook.schema import Stale
from validation.runbook.types import Phase, Rendezvous
from validation.store.stale import ALLOWANCES


def test_every_key_of_a_phase_says_what_a_change_means_for_a_stored_record_and_the_page_shows_it():
    page = (REPO_ROOT / "docs" / "runbook_format.md").read_text().splitlines()
    for k in (*keys.PHASE.keys, *(k for k in keys.RDZV.keys if k.name != "backend")):
        assert isinstance(k.stale, Stale), k.name
        rows = [ln for ln in page if ln.startswith(f"| `{k.name}` |") and k.meaning in ln]
        assert any(row.endswith(f"| {k.staleness} |") for row in rows), rows


def test_the_time_allowances_the_stale_check_judges_are_the_keys_declared_so():
    assert set(ALLOWANCES) == {"timeout_s", "stall_s", "startup_s", "launcher.rdzv.join_timeout_s"}
    declared = {f.name for f in dataclasses.fields(Phase)} | {f"launcher.rdzv.{f.name}"
                                                              for f in dataclasses.fields(Rendezvous)}
    assert set(ALLOWANCES) <= declared


def test_a_phase_without_a_key_takes_its_declared_default_and_defaults_sets_it_for_every_phase(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "profiles": ["cpu"], "defaults": {"steps": 7},
                                    "phases": [{"name": "a", "kind": "train"}]}))
    phase = load_runbook(path).phase("a")
    for f in dataclasses.fields(Phase):
        if f.name in ("name", "kind"):
            continue
        declared = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(phase, f.name) == (7 if f.name == "steps" else declared), f.name
    assert keys.DEFAULTS.names == ("launcher", "config", "overrides", "env", "steps", "timeout_s", "stall_s",
                                   "startup_s", "min_gpus")
    assert [k.shown_default for k in keys.DEFAULTS.keys if k.shown_default] == ["tiny", "20", "600", "0"]
