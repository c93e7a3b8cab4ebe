"""`report` re-checks golden curves changed since the run (issue 24, case 13, the judge's part):
each stored golden gate is evaluated again at render time, from the run's own training.csv,
against the golden file as it is now; the report shows that verdict and says so. The store
keeps what the run found."""
from __future__ import annotations

import dataclasses

from validation.cli import main
from validation.judge.gates import GateVerdict
from validation.judge.record import Status
from validation.report.build import build_context, render_text
from validation.runbook.load import load_profile, load_runbook
from validation.store.goldens import Curve, GoldenFile
from validation.store.results import ResultStore
from validation.tests.conftest import train_phase, write_runbook


def _context(rb, res):
    runbook, profile = load_runbook(rb), load_profile("cpu")
    return build_context(res, runbook.name, profile.name, runbook=runbook, profile=profile)


def test_report_judges_a_stored_run_against_the_golden_file_as_it_is_now(tmp_path):
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])]), tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    (stored,) = ResultStore(res).records()
    assert stored.status == Status.UNMEASURED  # no golden when it ran

    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 0
    ctx = _context(rb, res)
    assert ctx["verdict"] == "GO", ctx["status_reason"]
    assert ctx["goldens"].changed == ["long_run [default]: UNMEASURED at the run, PASS now"]

    goldens = GoldenFile.for_pair(rb, "fake", "cpu")  # a re-bless elsewhere changed the curve
    curve = goldens.get("long_run/default", "cpu")
    goldens.put("long_run/default", "cpu", dataclasses.replace(curve, loss=(3.5, *curve.loss[1:])))
    goldens.save()
    ctx = _context(rb, res)
    assert ctx["verdict"] == "NO-GO"
    [gate] = [g for g in ctx["gates"] if g["metric"] == "golden_loss_rel_diff"]
    assert gate["verdict"] == GateVerdict.FAIL and "first diverging step 1" in gate["note"]
    assert f"re-checked at report time against {goldens.path}, which changed since the run (then: UNMEASURED)" \
        in gate["note"]
    text = render_text({**ctx, "results_prefix": ".."})
    assert (f"- **Golden curves**: 1 golden gate(s) re-checked at report time against `{goldens.path}` as it is now, "
            "from each run's training.csv: 1 changed since the run: long_run [default]: UNMEASURED at the run, FAIL now") \
        in text
    assert ResultStore(res).records() == [stored]  # the store keeps what the run found


def test_a_golden_unchanged_since_the_run_is_said_to_be_so(tmp_path):
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])]), tmp_path / "res"
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    main(["bless", "--runbook", str(rb), "--results-dir", str(res)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    ctx = _context(rb, res)
    assert ctx["verdict"] == "GO" and (ctx["goldens"].checked, ctx["goldens"].changed) == (1, [])
    text = render_text({**ctx, "results_prefix": ".."})
    assert (f"against `{tmp_path / 'goldens' / 'fake__cpu.yaml'}` as it is now, from each run's training.csv: none "
            "changed since the run") in text
    # a run whose training.csv is gone keeps the gate it stored, and the report says it could not check
    (stored,) = ResultStore(res).records()
    (res / stored.out_dir / "training.csv").unlink()
    ctx = _context(rb, res)
    assert ctx["verdict"] == "GO" and ctx["goldens"].not_checked[0].startswith("long_run [default] (")


def test_a_gate_without_a_golden_curve_is_not_counted_as_re_checked(tmp_path):
    """user13: a golden phase run before any curve was blessed read '1 golden gate(s) re-checked at
    report time ...: none changed since the run': there was no curve to re-check it against. A
    runbook copied elsewhere looks for its goldens beside itself: the report named the file alone
    and said 'no golden curve there', as if it existed. It names the path looked for and says
    whether it exists."""
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])]), tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    path = tmp_path / "goldens" / "fake__cpu.yaml"
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE"
    assert (ctx["goldens"].checked, ctx["goldens"].no_golden) == (0, ["long_run [default]"])
    text = render_text({**ctx, "results_prefix": ".."})
    assert "as it is now" not in text
    assert (f"- **Golden curves**: no golden gate re-checked at report time against `{path}`, which does not exist; "
            "no golden curve for: long_run [default]") in text

    other = GoldenFile.for_pair(rb, "fake", "cpu")  # a golden of another hardware class only
    other.put("long_run/default", "nvidia_h100_80gb_hbm3", Curve((3.0, 2.9, 2.8, 2.7)))
    other.save()
    ctx = _context(rb, res)
    assert ctx["verdict"] == "INCOMPLETE"
    assert (f"- **Golden curves**: no golden gate re-checked at report time against `{path}`; no golden curve in it "
            "for: long_run [default]") in render_text({**ctx, "results_prefix": ".."})


def test_a_rechecked_golden_names_its_file_when_and_from_which_run_it_was_blessed(tmp_path):
    """A run failed its golden, its curve was then blessed from that very run, and the report said
    'PASS ... (golden of commit 5038c55d0217 on cpu; re-checked at report time against
    cpu_smoke__cpu.yaml, which changed since the run (then: FAIL))': neither the golden file's path
    (a runbook copied elsewhere has its own), nor when the curve was blessed, nor from which run,
    so a reader could not tell that the run was being compared with itself. Found by blessing a
    failed baseline_ddp run of a copy of cpu_smoke and rendering its report."""
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])]), tmp_path / "res"
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    (stored,) = ResultStore(res).records()
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 0
    goldens = GoldenFile.for_pair(rb, "fake", "cpu")
    curve = goldens.get("long_run/default", "cpu")
    assert curve.run == stored.out_dir
    goldens.put("long_run/default", "cpu", dataclasses.replace(curve, blessed="2026-11-28T05:03:41+00:00"))
    goldens.save()
    [gate] = [g for g in _context(rb, res)["gates"] if g["metric"] == "golden_loss_rel_diff"]
    assert (f"the golden on cpu: commit {curve.commit[:12]}, blessed 2026-11-28 05:03 UTC from {stored.out_dir}; "
            f"re-checked at report time against {goldens.path}, which changed since the run (then: UNMEASURED); "
            "that curve was blessed from this very run, which it matches by construction") in gate["note"], \
        gate["note"]


def test_a_golden_steps_change_alone_is_not_said_to_be_a_golden_file_change(tmp_path):
    """user hH's pass: golden_steps 4 -> 8 re-checked a stored run whose golden file was as at the
    run, and said the file 'changed since the run'; what changed was golden_steps."""
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("long_run", golden_steps=4, gates=[])]), tmp_path / "res"
    main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"])
    main(["bless", "--runbook", str(rb), "--results-dir", str(res)])
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    goldens = GoldenFile.for_pair(rb, "fake", "cpu")
    write_runbook(rb, [train_phase("long_run", golden_steps=8, gates=[])])
    [gate] = [g for g in _context(rb, res)["gates"] if g["metric"] == "golden_loss_rel_diff"]
    assert gate["verdict"] == GateVerdict.UNMEASURED  # the curve holds 4 steps
    assert ("re-checked at report time, as golden_steps changed since the run (it compared steps 1-4, steps 1-8 "
            f"now); {goldens.path} gives the run's steps 1-4 the same result as at the run (then: PASS)") \
        in gate["note"], gate["note"]
    assert "which changed since the run" not in gate["note"]
    # where the file changed as well, both are said
    curve = goldens.get("long_run/default", "cpu")
    goldens.put("long_run/default", "cpu", dataclasses.replace(curve, loss=(3.5, *curve.loss[1:])))
    goldens.save()
    [gate] = [g for g in _context(rb, res)["gates"] if g["metric"] == "golden_loss_rel_diff"]
    assert (f"re-checked at report time against {goldens.path}, which changed since the run, and golden_steps "
            "changed since the run (it compared steps 1-4, steps 1-8 now) (then: PASS)") in gate["note"], gate["note"]


def test_a_sweep_whose_keys_swapped_places_keeps_its_records_and_golden_curves(tmp_path):
    """user hH's pass: swapping the YAML order of a sweep's two keys made all its points NOT RUN,
    noted as 'renamed, removed, or a value no longer swept', and their golden curves not found: a
    point is its values (the store keys it so), not the order the sweep lists them in."""
    sweep = {"train.seq_len": [32, 64], "train.batch_size": [1, 2]}
    rb, res = write_runbook(tmp_path / "rb.yaml", [train_phase("scaling_sweep", golden_steps=4, sweep=sweep)]), \
        tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 0
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 0  # against the curves
    write_runbook(rb, [train_phase("scaling_sweep", golden_steps=4, sweep=dict(reversed(sweep.items())))])
    ctx = _context(rb, res)
    assert ctx["verdict"] == "GO", ctx["status_reason"]
    assert not ctx["stale"] and not ctx["missing"]
    assert "-k \"scaling_sweep and batch_size=1,seq_len=32\"" in ctx["reproduce"][0]["rerun"] or \
        "batch_size=1,seq_len=32" in ctx["reproduce"][0]["rerun"], ctx["reproduce"][0]["rerun"]
    assert (ctx["goldens"].checked, ctx["goldens"].changed) == (4, [])
    # a run of the swapped runbook replaces the records, and a bless moves the curves to the new names
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-report"]) == 0
    assert len(ResultStore(res).records()) == 4
    assert main(["bless", "--runbook", str(rb), "--results-dir", str(res)]) == 0
    assert sorted(GoldenFile.for_pair(rb, "fake", "cpu").curves) == [
        "scaling_sweep/batch_size=1,seq_len=32", "scaling_sweep/batch_size=1,seq_len=64",
        "scaling_sweep/batch_size=2,seq_len=32", "scaling_sweep/batch_size=2,seq_len=64"]
