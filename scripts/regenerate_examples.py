"""Regenerate a runbook's example report under docs/examples/<runbook>/.

Runs the runbook into a temporary results directory (``nsa-validate run``), then copies its
rendered report and the PNG plots it names into docs/examples/<runbook>/. The copy holds no result
store: a link into the store (run directories, results.json) becomes plain text, so every link
left in the copied report resolves where it lies.

    python scripts/regenerate_examples.py cpu_smoke                      # run on this machine, copy
    python scripts/regenerate_examples.py h100_single --profile h100     # on a GPU box
    python scripts/regenerate_examples.py h100_single --profile h100 --from-results /data/results
                                          # copy the report of a run made earlier (a GPU call's store)
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
#: a Markdown link or image: [label](target)
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def copy_report(report: Path, out_dir: Path, results_dir: Path | None = None) -> Path:
    """Copy ``report`` and the images it names into ``out_dir`` (images under ``plots/``). A link
    whose target is not copied (the result store's runs and results.json) keeps its label as
    plain text; an image whose file is missing is dropped with its line. ``results_dir``'s path,
    where the report prints it, becomes ``results``, and this checkout's paths are written from
    its root (``validation/tests/...``, ``.venv/bin/python``). Returns the copied report's path."""
    text = report.read_text()
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = out_dir / "plots"
    shutil.rmtree(plots, ignore_errors=True)
    kept: list[str] = []

    def relink(m: re.Match) -> str:
        image, label, target = m.group(1), m.group(2), m.group(3)
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            return m.group(0)
        src = (report.parent / target).resolve()
        if image:
            if not src.is_file():
                return "\0DROP\0"
            plots.mkdir(exist_ok=True)
            shutil.copy2(src, plots / src.name)
            kept.append(src.name)
            return f"![{label}](plots/{src.name})"
        return label  # a link into the result store, which is not copied

    lines = []
    for line in text.splitlines(keepends=True):
        new = _LINK.sub(relink, line)
        if "\0DROP\0" not in new:
            lines.append(new)
    text = "".join(lines)
    if results_dir is not None:
        text = text.replace(str(results_dir.resolve()), "results").replace(str(results_dir), "results")
    text = text.replace(f"{ROOT}/", "").replace(str(ROOT), ".")  # paths of this checkout, as from its root
    dest = out_dir / report.name
    for old in out_dir.glob("*__*.md"):  # an earlier report of this runbook (another profile too)
        old.unlink()
    dest.write_text(text)
    return dest


def run_runbook(runbook: str, profile: str | None, results_dir: Path) -> int:
    cmd = [sys.executable, "-m", "validation", "run", "--runbook", runbook, "--results-dir", str(results_dir)]
    if profile:
        cmd += ["--profile", profile]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/regenerate_examples.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runbook", help="runbook name under runbooks/ (its example goes to docs/examples/<runbook>/)")
    p.add_argument("--profile", help="hardware profile (default: the runbook's first)")
    p.add_argument("--from-results", type=Path, metavar="DIR",
                   help="copy the report already rendered in this results directory instead of running")
    p.add_argument("--results-dir", type=Path, metavar="DIR",
                   help="run into this results directory and keep it (default: a temporary one, removed after); "
                        "a point that failed for the machine's sake can then be re-run with nsa-validate run "
                        "--phase PHASE --results-dir DIR and the example copied with --from-results DIR")
    p.add_argument("--out", type=Path, default=EXAMPLES, help="examples folder (default: docs/examples)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nsa-example-") as tmp:
        results = args.from_results or args.results_dir or Path(tmp) / "results"
        if args.from_results is None:
            status = run_runbook(args.runbook, args.profile, results)
            if status not in (0, 1, 3):  # GO, NO-GO, INCOMPLETE all render a report
                print(f"nsa-validate run exited {status}: no report to copy", file=sys.stderr)
                return status or 1
        reports = sorted((results / "reports").glob(f"{args.runbook}__{args.profile or '*'}.md"))
        if len(reports) != 1:
            found = ", ".join(r.name for r in reports) or "none"
            print(f"expected one report of {args.runbook} under {results}/reports, found {found} "
                  "(name the profile with --profile)", file=sys.stderr)
            return 2
        dest = copy_report(reports[0], args.out / args.runbook, results)
    print(f"example written: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
