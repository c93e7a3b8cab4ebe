"""The NSA acceptance harness: runbooks as data, phases run as subprocesses, gates, a result
store and GO/NO-GO reports. Stages, each a folder that imports only the ones before it:
contract -> judge -> runbook -> launch -> store -> report -> session, then the two doors
(cli.py, pytest_plugin.py). Nothing here imports the trainer; it drives it through the artifact
contract (nsa/contract.py; docs/design.md, "The artifact contract")."""
from __future__ import annotations

from pathlib import Path

#: the repository root (runbooks/ and reports/ live there, beside validation/)
REPO_ROOT = Path(__file__).resolve().parent.parent
RUNBOOK_DIR = REPO_ROOT / "runbooks"
PROFILE_DIR = RUNBOOK_DIR / "profiles"
TEMPLATE_DIR = REPO_ROOT / "reports"
DEFAULT_RUNBOOK = "cpu_smoke"
DEFAULT_RESULTS_DIR = REPO_ROOT / "results"


def checkout_problem() -> str | None:
    """Why the harness cannot run from where it is installed, or None. It reads runbooks/,
    reports/ and (for test phases) tests/ from a checkout of the repository; a plain
    ``pip install .`` copies only the packages into site-packages."""
    missing = [str(d) for d in (RUNBOOK_DIR, TEMPLATE_DIR) if not d.is_dir()]
    if not missing:
        return None
    return (f"{' and '.join(missing)} not found: nsa-validate runs from a checkout of the repository "
            "(runbooks/, reports/ and tests/ are not installed into site-packages). From a clone, install it "
            "with `pip install -e .` (the README's command) or run `python -m validation` there")
