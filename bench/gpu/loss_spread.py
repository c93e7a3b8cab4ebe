"""Run-to-run spread of the per-step loss of golden points (phases with golden_steps) across
several results directories of the same runbook, profile and commit:

    python bench/gpu/loss_spread.py --runbook h100_single --profile h100 RES1 RES2 RES3

Prints, per point, the largest absolute and relative difference between any two runs over steps
1..golden_steps, and the first step at which they differ; this is the evidence for the profile's
golden_loss_rtol. Exits 2 when a point is missing from a directory or its run did not finish.

    python bench/gpu/loss_spread.py --runbook h100_single --profile h100 --golden-phases

prints the `--phase NAME` options of the runbook's golden phases instead (what
bench/gpu/golden_losses.sh runs)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from validation.contract.files import read_training_csv
from validation.store.goldens import losses, point_id, spread
from validation.runbook.plan import expand
from validation.runbook.load import load_profile, load_runbook
from validation.store.results import ResultStore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runbook", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--golden-phases", action="store_true",
                   help="print the --phase options of the phases with golden_steps and exit")
    p.add_argument("results_dirs", nargs="*", type=Path)
    args = p.parse_args(argv)
    rb, prof = load_runbook(args.runbook), load_profile(args.profile)
    if args.golden_phases:
        print(" ".join(f"--phase {phase.name}" for phase in rb.phases if phase.golden_steps))
        return 0
    if not args.results_dirs:
        p.error("give one or more results directories (or --golden-phases)")
    stores = {d: {r.test_id: r for r in ResultStore(d).records(rb.name, prof.name)} for d in args.results_dirs}
    print(f"{'point':40s} {'runs':>4s} {'steps':>5s} {'max abs diff':>13s} {'max rel diff':>13s}  first differing step")
    for point in (pt for pt in expand(rb, prof) if pt.phase.golden_steps):
        curves = []
        for d, recs in stores.items():
            rec = recs.get(point.test_id)
            if rec is None or not rec.ran or rec.exit_code != 0:
                print(f"{point_id(point)}: no finished run in {d}", file=sys.stderr)
                return 2
            loss = losses(read_training_csv(d / rec.out_dir), point.phase.golden_steps)
            if any(v is None for v in loss):
                print(f"{point_id(point)}: {d / rec.out_dir}/training.csv lacks some of steps "
                      f"1-{point.phase.golden_steps}", file=sys.stderr)
                return 2
            curves.append(loss)
        s = spread(curves)
        print(f"{point_id(point):40s} {s.runs:4d} {s.steps:5d} {s.max_abs:13.3g} {s.max_rel:13.3g}  "
              f"{s.first_step if s.first_step else 'none (identical to the printed 6 digits)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
