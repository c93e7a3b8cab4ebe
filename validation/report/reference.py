"""The reference pages, generated from the code's own tables so that they cannot drift:

* docs/artifact_contract.md from nsa/contract.py (the schema the trainer writes and the harness reads),
* docs/runbook_format.md from validation/runbook/keys.py (every key the loader allows) and the
  environment allow-lists of validation/runbook/fields.py,
* docs/metrics.md from the metric catalogue (validation/judge/metrics.py).

    python -m validation.report.reference            # write the pages
    python -m validation.report.reference --check    # exit 1 naming the pages that differ

The test suite runs the check, so a new key, metric or contract field without its page fails CI.
"""
from __future__ import annotations

import argparse
import sys

import jinja2

from nsa import contract
from validation import REPO_ROOT, TEMPLATE_DIR
from validation.contract.stacks import HELPERS_PER_RANK
from validation.judge.clock import CLOCK_FACTOR, MIN_INTERVALS
from validation.judge.metrics import CATALOGUE
from validation.judge.profile_names import BOUNDS
from validation.judge.unsteady import DRIFT, DRIFT_STEPS, GREW, HOLDS, SLOW
from validation.runbook import fields, keys

DOCS = REPO_ROOT / "docs"
#: page -> its template under reports/reference/
PAGES = {"artifact_contract.md": "artifact_contract.md.j2", "runbook_format.md": "runbook_format.md.j2",
         "metrics.md": "metrics.md.j2"}


def _context() -> dict:
    metrics = [{"name": m.name, "description": m.description, "reads": "; ".join(i.describe() for i in m.reads),
                "window": "honours the gate's window" if m.windowed else "the whole run",
                "timing": m.timing.value if m.timing else ""} for m in CATALOGUE]
    return {"contract": contract, "sections": keys.SECTIONS, "metrics": metrics, "clock_factor": CLOCK_FACTOR,
            "clock_intervals": MIN_INTERVALS, "threshold_bounds": BOUNDS,
            "unsteady": {"slow": SLOW, "grew": GREW, "holds": HOLDS, "drift": DRIFT, "drift_steps": DRIFT_STEPS},
            "env_prefixes": fields.ENV_PREFIXES, "env_exact": fields.ENV_EXACT,
            "trainer_env_denied": fields.TRAINER_ENV_DENIED,
            "trainer_env_denied_prefixes": fields.TRAINER_ENV_DENIED_PREFIXES, "helpers_per_rank": HELPERS_PER_RANK}


def render(page: str) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR / "reference"), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(PAGES[page]).render(**_context())


def stale() -> list[str]:
    """The pages whose committed text differs from what the code's tables give now."""
    return [page for page in PAGES if not (DOCS / page).is_file() or (DOCS / page).read_text() != render(page)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m validation.report.reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    args = p.parse_args(argv)
    if args.check:
        out = stale()
        for page in out:
            print(f"docs/{page} differs from what the code's tables give: run python -m validation.report.reference",
                  file=sys.stderr)
        return 1 if out else 0
    for page in PAGES:
        (DOCS / page).write_text(render(page))
        print(f"wrote docs/{page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
