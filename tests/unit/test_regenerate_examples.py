"""scripts/regenerate_examples.py copies a rendered report into docs/examples/<runbook>/ with the
plots it names and no result store: every link left in the copy resolves where it lies."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "regenerate_examples.py"


def _module():
    spec = importlib.util.spec_from_file_location("regenerate_examples", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_copy_keeps_its_plots_and_no_link_into_the_store(tmp_path):
    results = tmp_path / "results"
    (results / "reports" / "plots").mkdir(parents=True)
    (results / "reports" / "plots" / "rb__cpu__long_run.png").write_bytes(b"\x89PNG")
    report = results / "reports" / "rb__cpu.md"
    report.write_text(
        "# Report\n"
        "| long_run | [training.csv](../runs/rb/cpu/long_run/default/abc/training.csv) |\n"
        "![long_run](plots/rb__cpu__long_run.png)\n"
        "![gone](plots/rb__cpu__gone.png)\n"
        f"Reproduce: nsa-validate run --results-dir {results}\n"
        f"Process: {ROOT}/.venv/bin/python -m pytest {ROOT}/validation/tests/test_acceptance.py\n"
        "See [the paper](https://arxiv.org/abs/2502.11089).\n")
    out = tmp_path / "examples" / "rb"
    out.mkdir(parents=True)
    (out / "README.md").write_text("kept\n")  # not a report: left alone
    dest = _module().copy_report(report, out, results)
    text = dest.read_text()
    assert dest == out / "rb__cpu.md" and (out / "README.md").is_file()
    assert "| long_run | training.csv |" in text and "../runs" not in text
    assert "![long_run](plots/rb__cpu__long_run.png)" in text and "gone" not in text
    assert "--results-dir results" in text and str(results) not in text
    assert "Process: .venv/bin/python -m pytest validation/tests/test_acceptance.py" in text
    assert "[the paper](https://arxiv.org/abs/2502.11089)" in text
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert target.startswith("https://") or (out / target).is_file(), target


def test_the_script_answers_help():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout and "--from-results" in r.stdout


def test_every_example_has_its_row_naming_the_harness_that_rendered_it_and_its_links_resolve():
    """docs/examples/README.md's table has a row per folder, naming the runbook and profile of its
    one report and the harness that rendered it (an example in older wording is left as the tool
    wrote it, never edited to look current, and its row says whose wording it is); every link
    left in a copied report resolves in its folder."""
    examples = ROOT / "docs" / "examples"
    rows = {}
    for line in (examples / "README.md").read_text().splitlines():
        m = re.match(r"\| `([^`/]+)/` \| `([^`]+)`, `([^`]+)` \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3), [c.strip() for c in m.group(4).split("|")])
    assert sorted(rows) == sorted(p.name for p in examples.iterdir() if p.is_dir())
    for folder, (runbook, profile, (made_on, rendered_by)) in rows.items():
        assert made_on and rendered_by, folder
        reports = sorted(p.name for p in (examples / folder).glob("*__*.md"))
        assert reports == [f"{runbook}__{profile}.md"], folder
        text = (examples / folder / reports[0]).read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            assert re.match(r"[a-z]+://", target) or target.startswith("#") or (examples / folder / target).is_file(), \
                (folder, target)
