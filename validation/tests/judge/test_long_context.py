"""Long context, NSA against dense (validation/judge/findings/long_context.py): the crossover
length and the speed-up at the longest length, from a sweep that crosses model.attn.kind with
train.seq_len; the profile's min_long_context_speedup makes a shortfall critical."""
from __future__ import annotations

from dataclasses import replace

from validation.judge.findings import CROSS_POINT, Severity, find
from validation.judge.findings.long_context import MIN_SPEEDUP_KEY, crossover, pairs, planned_longest
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status, Summary
from validation.report.build import build_context
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.store.results import ResultStore

#: an H100's long-context tokens/s of an earlier kernel tree (bench/train_throughput.py --kinds nsa dense): (NSA, dense)
H100 = {4096: (126_589, 196_172), 16384: (147_112, 166_967), 32768: (149_038, 119_696), 65536: (139_955, 76_215)}


def _records(measured: dict[int, tuple[float, float]], runbook: str = "lc") -> list[PhaseRecord]:
    out = []
    for i, (seq, toks) in enumerate(measured.items()):
        for j, (kind, value) in enumerate(zip(("nsa", "dense"), toks)):
            params = {"train.seq_len": seq, "model.attn.kind": kind}
            out.append(PhaseRecord(PointKey(runbook, "h100", "long_context", params),
                                   f"{runbook}/h100/long_context/seq_len={seq},kind={kind}",
                                   "train", Status.PASS, "", sweep_index=2 * i + j, params_order=list(params),
                                   exit_code=0, steps=12, metrics=Summary(toks_per_s_mean=value, mem_reserved_gb_max=40.0),
                                   evidence=Evidence(loss_last=3.0)))
    return out


def test_crossover_is_the_length_from_which_nsa_stays_faster():
    (found,) = pairs(_records(H100)).values()
    assert [p.seq_len for p in found] == [4096, 16384, 32768, 65536]
    assert crossover(found) == 32768
    assert round(found[-1].speedup, 2) == 1.84
    # faster at 16k, slower at 32k, faster again at 64k: the crossover is 64k, not 16k
    (wobbly,) = pairs(_records({16384: (2.0, 1.0), 32768: (1.0, 2.0), 65536: (2.0, 1.0)})).values()
    assert crossover(wobbly) == 65536


def test_the_finding_names_the_crossover_and_the_speedup_and_is_critical_below_the_profile():
    records = _records(H100)
    (info,) = [f for f in find(records, thresholds={MIN_SPEEDUP_KEY: 1.5}) if f.kind == "long_context"]
    assert info.severity == Severity.INFO
    assert info.title == "long context in long_context: NSA is faster from S=32,768 on; 1.84x dense at S=65,536"
    assert "S=16,384: NSA 147,112 tok/s, dense 166,967 tok/s (0.88x)" in info.detail[1]
    (short,) = [f for f in find(records, thresholds={MIN_SPEEDUP_KEY: 2.5}) if f.kind == "long_context"]
    assert short.severity == Severity.CRITICAL and "below the profile's min_long_context_speedup 2.5" in short.title
    assert short.kind in CROSS_POINT


def test_no_pair_no_finding():
    only_nsa = [r for r in _records(H100) if r.key.params["model.attn.kind"] == "nsa"]
    assert not [f for f in find(only_nsa, thresholds={MIN_SPEEDUP_KEY: 1.5}) if f.kind == "long_context"]


def test_a_sweep_across_attention_kinds_is_no_throughput_cliff():
    """Dense at 64k runs at a fraction of NSA at 4k by design; that is no cliff of one model."""
    steep = _records({4096: (400_000.0, 400_000.0), 65536: (50_000.0, 20_000.0)})
    assert not [f for f in find(steep) if f.kind == "cliff"]


def test_the_speedup_check_waits_for_the_sweeps_longest_length():
    """A partial run (the 64k points cut off by a time limit, 2026-11-25 on one H100) must not be
    judged at 32k against a threshold meant for the sweep's longest length: no critical finding,
    the report stays INCOMPLETE until 64k is measured."""
    partial = _records({k: v for k, v in H100.items() if k < 65536})
    (waiting,) = [f for f in find(partial, thresholds={MIN_SPEEDUP_KEY: 1.5}, longest={"long_context": 65536})
                  if f.kind == "long_context"]
    assert waiting.severity == Severity.INFO
    assert waiting.title == ("long context in long_context: NSA is faster from S=32,768 on; 1.25x dense at "
                             "S=32,768; the profile's min_long_context_speedup 1.5 is checked at S=65,536, not measured")
    # the sweep's longest length measured: judged as before
    (short,) = [f for f in find(_records(H100), thresholds={MIN_SPEEDUP_KEY: 2.5}, longest={"long_context": 65536})
                if f.kind == "long_context"]
    assert short.severity == Severity.CRITICAL
    # a dense point at 64k that measured no tokens/s leaves the check unjudged too
    unmeasured = _records(H100)
    unmeasured[-1] = replace(unmeasured[-1], metrics=Summary(toks_per_s_mean=None))
    (waiting,) = [f for f in find(unmeasured, thresholds={MIN_SPEEDUP_KEY: 2.5}, longest={"long_context": 65536})
                  if f.kind == "long_context"]
    assert waiting.severity == Severity.INFO and waiting.title.endswith("checked at S=65,536, not measured")


def test_the_planned_longest_length_of_each_phase():
    assert planned_longest([("lc", {"train.seq_len": 4096, "model.attn.kind": "nsa"}),
                            ("lc", {"train.seq_len": 65536, "model.attn.kind": "dense"}),
                            ("single", {"train.seq_len": 131072}),
                            ("other", {})]) == {"lc": 65536}


def test_a_report_of_a_partial_sweep_is_incomplete_not_no_go(tmp_path):
    """The report of long_context_h100 with its 64k points not run: INCOMPLETE, the finding INFO."""
    runbook, profile = load_runbook("long_context_h100"), load_profile("h100")
    points = {p.test_id: p for p in expand(runbook, profile)}
    # records as that runbook's points stored them: with their overrides (a record of other
    # overrides is no result of the point, validation/store/stale.py)
    store = ResultStore(tmp_path)
    store.put_many([replace(r, overrides=dict(points[r.test_id].overrides), steps=points[r.test_id].phase.steps)
                    for r in _records({k: v for k, v in H100.items() if k < 65536}, runbook="long_context_h100")])
    ctx = build_context(tmp_path, "long_context_h100", "h100", runbook=runbook, profile=profile,
                        now="2026-11-25 19:31 UTC")
    assert ctx["verdict"] == "INCOMPLETE", ctx["status_reason"]
    assert ctx["status_reason"] == "2 point(s) not run"
    (finding,) = [f for f in ctx["findings"] if f.kind == "long_context"]
    assert finding.severity == Severity.INFO and finding.title.endswith("checked at S=65,536, not measured")


def test_the_losses_compared_are_means_over_the_same_last_steps_of_both_models():
    """'loss after 12 steps 3.512 vs 4.186' was one step's loss of each model, while NSA's steps
    10-12 alone moved between 3.00 and 3.51 (an H100's long_context run, seq_len=4096): the
    finding compares the mean loss of the window the phase's gates read, the same steps of both."""
    records = [replace(r, window="last 6 steps", evidence=Evidence(loss_last=3.51 if "nsa" in r.test_id else 4.19),
                       metrics=replace(r.metrics, steps_completed=12.0,
                                       loss_mean=3.25 if "nsa" in r.test_id else 3.9))
               for r in _records({4096: H100[4096]})]
    (f,) = [f for f in find(records) if f.kind == "long_context"]
    assert "loss after" not in f.detail[0] and "3.510" not in f.detail[0]
    assert f.detail[0].endswith("; mean loss over steps 7-12 (the last 6 steps, the gates' window) 3.250 vs 3.900")
    # over every step when the gates read all steps; and said when the two did not log the same steps
    whole = [replace(r, window="all steps", metrics=replace(r.metrics, steps_completed=12.0 if "nsa" in r.test_id
                                                            else 9.0, loss_mean=3.5)) for r in records]
    (g,) = [f for f in find(whole) if f.kind == "long_context"]
    assert g.detail[0].endswith("; mean loss over all logged steps 3.500 vs 3.500 (not the same steps: NSA logged "
                                "to step 12, dense to step 9)")
