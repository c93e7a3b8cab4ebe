"""The NSA acceptance harness: runbooks as data, phases run as subprocesses, gates, a result
store and GO/NO-GO reports. Layers: runbook -> runner/evidence -> metrics/gates -> store ->
findings/report -> cli / pytest_plugin. Nothing here imports the trainer; it drives it through
the output contract of DESIGN.md ("Trainer outputs")."""
from __future__ import annotations

from pathlib import Path

#: the repository root (runbooks/ and reports/ live there, beside validation/)
REPO_ROOT = Path(__file__).resolve().parent.parent
RUNBOOK_DIR = REPO_ROOT / "runbooks"
PROFILE_DIR = RUNBOOK_DIR / "profiles"
TEMPLATE_DIR = REPO_ROOT / "reports"
DEFAULT_RUNBOOK = "cpu_smoke"
DEFAULT_RESULTS_DIR = REPO_ROOT / "results"
