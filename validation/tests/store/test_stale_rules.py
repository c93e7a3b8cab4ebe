"""The staleness check derives from the runbook's declarations (validation/runbook/schema.py): each
key of a stored point is compared by the one comparison of its ``Stale`` rule, and what a record
keeps of what was asked (judge/asked.py) names the keys it keeps. A key declared with a rule the
check does not know, or kept by no record, fails here rather than going uncompared."""
from __future__ import annotations

import dataclasses

from validation.judge.asked import Asked
from validation.runbook.schema import Stale
from validation.runbook.types import PHASE_KINDS, Phase
from validation.store import stale


def test_every_rule_is_compared_by_one_comparison_or_declared_uncompared():
    assert set(stale.COMPARE).isdisjoint(stale.UNCOMPARED)
    assert set(stale.COMPARE) | set(stale.UNCOMPARED) == set(Stale)
    for name, k in stale.DECLARED.items():
        assert k.stale in stale.COMPARE or k.stale in stale.UNCOMPARED, name


def test_every_compared_key_of_a_phase_is_kept_by_a_record_and_asked_keeps_only_declared_keys():
    kept = {key for _, k in Asked.fields() for key in (k.key, *k.also) if key}
    assert kept <= set(stale.DECLARED)
    compared = {name for name, k in stale.DECLARED.items() if k.stale in stale.COMPARE}
    assert compared == kept | set(stale.RECORDED)
    assert set(stale.RECORDED) <= {f.name for f in dataclasses.fields(Phase)}
    for name, k in Asked.fields():
        assert bool(k.key) != (name in stale.UNDECLARED), name  # a declared key's rule, or its own
        assert (stale.DECLARED[k.key].stale if k.key else stale.UNDECLARED[name]) in stale.COMPARE, name
        assert set(k.kinds) <= set(PHASE_KINDS), name
        assert all(stale.DECLARED[key].stale is stale.DECLARED[k.key].stale for key in k.also), name
    assert set(stale.OLDER) <= {name for name, _ in Asked.fields()}
    # a member asked now and not at the run is named by its field's renderer
    members = {k.label for f, (_, k) in zip(dataclasses.fields(Asked), Asked.fields())
               if k.key and stale.DECLARED[k.key].stale is Stale.ADDED and str(f.type).startswith("tuple")}
    assert members == set(stale.ADDED_ITEMS) == {stale.GATE}


def test_a_stored_asked_reads_back_as_it_was_kept_and_a_key_it_lacks_as_not_kept():
    asked = Asked(6, "tiny", {"a.b": 1}, {"NSA_X": "1"}, 2, ("loss_finite (all steps)",), launcher={"kind": "python"},
                  trainer={"module": "nsa.train"}, repeats=3, resume_after=0, golden_steps=4, stall_s=7.5,
                  startup_s=7.5, join_timeout_s=30.0)
    assert Asked.from_json(dataclasses.asdict(asked)) == asked
    assert Asked.from_json({"steps": 6}) == Asked(6)
    assert Asked.from_json(None) is None
