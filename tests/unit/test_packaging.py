"""The README's main command installs the project without extras and runs the cpu_smoke
runbook, whose test phases run pytest on project test files. Everything those files import must
come with the plain install (a fresh clone once failed its sanity phase: No module named pytest)."""
from __future__ import annotations

import ast
import re
import sys
import tomllib

from validation import REPO_ROOT
from validation.runbook.load import load_runbook

#: import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml"}
PROJECT = {"nsa", "validation", "tests"}


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_smoke_runbooks_test_phases_need_only_the_plain_install():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    files = {REPO_ROOT / "conftest.py"}
    for phase in load_runbook("cpu_smoke").phases:
        if phase.kind == "pytest":
            files |= {REPO_ROOT / t.split("::")[0] for t in phase.tests}
    assert len(files) > 1, "cpu_smoke has no pytest phase: this test checks nothing"
    needed = set().union(*(_imports(f) for f in files)) - PROJECT - set(sys.stdlib_module_names)
    missing = {DIST.get(m, m) for m in needed} - declared
    assert not missing, f"imported by the smoke runbook's tests but not in [project].dependencies: {missing}"


def test_the_suite_collects_without_the_triton_extra():
    """With `pip install -e '.[test]'` (no triton extra) one module's top-level triton import
    failed collection, and pytest stops a whole session on a collection error: every pytest
    command of the repository failed, `pytest -m cpu_profile` (an acceptance run) included. A
    module that needs triton skips instead. Triton is made unimportable in a child process."""
    import subprocess

    code = ("import sys; sys.modules['triton'] = None\n"
            "import pytest; sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
            "'-p', 'no:xdist']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.splitlines()[-1], out.stdout[-3000:]
