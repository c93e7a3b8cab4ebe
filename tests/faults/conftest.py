"""The fault-injection suite's fixtures and its report: every test records one row of the fault
matrix (fault, how it was injected, the outcome, verdict, finding, seconds and bound) through
``record_property``, so rows reach the controller under pytest-xdist too; at session end the
controller writes them as the Markdown table of docs/reliability.md.

    python -m pytest tests/faults -n 2 --reliability-report docs/reliability.md
    NSA_RELIABILITY_REPORT=docs/reliability.md python -m pytest tests/faults -n 2   (same)
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults import _util as U

_ROWS = pytest.StashKey[dict]()
_SKIPPED = pytest.StashKey[dict]()
#: markers of tests that need GPUs: skipped here, they are listed as not run
_GPU_KEYWORDS = {"gpu", "multi_gpu"}
_START = pytest.StashKey[float]()
REPORT_ENV = "NSA_RELIABILITY_REPORT"

#: the order of the matrix (the issue's order); rows of unknown ids go last
ORDER = [
    "stalled rank", "stalled rank, watchdog off", "stalled rank, world of 4", "SIGKILLed rank",
    "SIGKILLed rank, rank 0", "exception on one rank",
    "exception on one rank, teardown that blocks (as NCCL's)", "NaN loss", "inf loss", "out of memory (CPU)",
    "out of memory (CUDA)", "clean stop + resume", "truncated checkpoint", "corrupt checkpoint",
    "hostile checkpoint (pickle)", "checkpoint pointer to a missing file", "truncated training.csv (harness)",
    "corrupt training.csv (harness)", "torn training.csv row on resume", "torn heartbeat line",
    "malformed runbook YAML", "malformed config YAML", "unknown config key", "hostile YAML runbook",
    "hostile YAML config", "gate written as code", "runbook path outside its directory",
    "phase command with shell syntax", "no shell from runbook text", "two harness runs, one results dir",
    "SIGINT during a phase", "SIGINT during report rendering", "resume: data position or RNG broken", "loss spike",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--reliability-report", default=None, metavar="PATH",
                     help=f"write the fault matrix (Markdown) to PATH at session end (or set ${REPORT_ENV})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_ROWS] = {}
    session.config.stash[_SKIPPED] = {}
    session.config.stash[_START] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rows = _CONFIG.stash.get(_ROWS, None) if _CONFIG else None
    if rows is None:
        return
    if report.skipped and report.when == "setup" and _GPU_KEYWORDS & set(report.keywords):
        # a GPU test skipped here (no CUDA, or fewer GPUs than it needs) never started its row:
        # the report lists it as not run, neither a failure nor silently left out
        _CONFIG.stash[_SKIPPED][report.nodeid] = _skip_reason(report)
        return
    for name, value in report.user_properties:
        if name != "fault_matrix":
            continue
        row = json.loads(value)
        key = row_key(row)
        prev = rows.get(key, {})
        row = {**prev, **row}
        if report.when == "call" or report.failed:
            row["result"] = "pass" if report.passed else ("skipped" if report.skipped else "FAILED")
            row["test"] = report.nodeid
        rows[key] = row


def row_key(row: dict[str, Any]) -> str:
    """A row's key: its fault, within its section (the same fault on NCCL is a row of its own)."""
    return f"{row['section']}/{row['fault']}" if row.get("section") else row["fault"]


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


_CONFIG: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _CONFIG
    _CONFIG = config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    path = config.getoption("--reliability-report") or os.environ.get(REPORT_ENV)
    if not path or hasattr(config, "workerinput"):
        return
    rows = config.stash.get(_ROWS, {})
    if not rows:
        return
    wall = time.monotonic() - config.stash.get(_START, time.monotonic())
    workers = getattr(config.option, "numprocesses", None)
    write_matrix(Path(path), rows, wall, workers, config.stash.get(_SKIPPED, {}))


def _rank(fault: str) -> tuple[int, str]:
    return (ORDER.index(fault) if fault in ORDER else len(ORDER), fault)


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "—"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


#: what each section of the matrix is (a section's rows come from tests that start them with it)
SECTIONS = {
    "NCCL, two GPUs": (
        "The rank faults again, with the trainer on two CUDA GPUs (`train.device=cuda`, DDP over **NCCL**, "
        "`torchrun --standalone --nproc_per_node=2`): a faulted rank leaves the other blocked inside an NCCL "
        "collective or a CUDA sync (no gloo 'Connection closed by peer'), so the stall watch, the watchdog and "
        "torchrun's stop of the survivors are what end the run. Same required outcome as on gloo: the faulted "
        "rank named (never the rank that waited for it), its step, the evidence, within the bound, no process "
        "left, the earlier records intact (`tests/faults/test_nccl_faults.py`, marker `multi_gpu`). Regenerate "
        "on a box with two GPUs: `bash bench/gpu/nccl_faults.sh` (writes this section; "
        "`--reliability-report docs/reliability.md` there replaces only this section)."),
}
_SECTION = re.compile(r"<!-- section: (?P<name>[^>]*?) -->\n.*?<!-- /section -->\n?", re.DOTALL)


def write_matrix(path: Path, rows: dict[str, dict[str, Any]], wall_s: float, workers: Any,
                 skipped: dict[str, str] | None = None) -> None:
    """The matrix: the main table (rows without a section: CPU, gloo) and a table per section
    (e.g. NCCL on two GPUs). What this session did not run is kept from the file as it was: a
    GPU run that only ran a section replaces that section, a CPU run keeps the GPU sections of the
    last GPU run. GPU tests skipped here are listed under the main table as not run."""
    existing = path.read_text() if path.exists() else ""
    old_sections = {m["name"]: m.group(0) for m in _SECTION.finditer(existing)}
    old_main = _SECTION.sub("", existing).rstrip("\n")
    main = [r for r in rows.values() if not r.get("section")]
    by_section: dict[str, list[dict[str, Any]]] = {}
    for r in rows.values():
        if r.get("section"):
            by_section.setdefault(r["section"], []).append(r)
    if main:
        text = "\n".join(_main_part(main, wall_s, workers, skipped or {}))
    else:
        text = old_main or "\n".join(_TITLE)
    for name in [*old_sections, *(n for n in by_section if n not in old_sections)]:
        block = _section_part(name, by_section[name], wall_s) if name in by_section else old_sections[name]
        text = text.rstrip("\n") + "\n\n" + block.rstrip("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text.rstrip("\n") + "\n")
    os.replace(tmp, path)


_TITLE = ["# Reliability: the fault matrix", "",
          "<!-- Generated by the fault-injection suite (tests/faults/conftest.py); do not edit by hand. -->", ""]
_HEAD = ["| # | Fault | Injection | Required outcome | Verdict | Finding / message (abridged) | Seconds | Bound (s) | Result |",
         "|---|-------|-----------|------------------|---------|------------------------------|---------|-----------|--------|"]


def _table(rows: list[dict[str, Any]]) -> list[str]:
    ordered = sorted(rows, key=lambda r: _rank(r["fault"]))
    lines = list(_HEAD)
    for i, r in enumerate(ordered, 1):
        finding = _cell(r.get("finding"))
        if len(finding) > 220:
            finding = finding[:217] + "..."
        lines.append(f"| {i} | {_cell(r['fault'])} | {_cell(r.get('injection'))} | {_cell(r.get('expect'))} | "
                     f"{_cell(r.get('verdict'))} | {finding} | {_cell(r.get('elapsed'))} | "
                     f"{_cell(r.get('bound'))} | {_cell(r.get('result', 'not finished'))} |")
    return lines


def _tests_line(rows: list[dict[str, Any]]) -> str:
    return "Tests: " + ", ".join(sorted({f"`{r['test'].split('::')[0]}`" for r in rows if r.get("test")}))


def _gpus() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f", {len(names)} x {names[0]}" if len(set(names)) == 1 else ", GPUs " + ", ".join(names)
    except Exception:  # the report is written whatever the GPU query does
        pass
    return ""


def _main_part(rows: list[dict[str, Any]], wall_s: float, workers: Any, skipped: dict[str, str]) -> list[str]:
    failed = sum(r.get("result") == "FAILED" for r in rows)
    lines = [
        "# Reliability: the fault matrix",
        "",
        "<!-- Generated by the fault-injection suite (tests/faults/conftest.py); do not edit by hand. -->",
        "",
        "Each row is one fault driven through the **real** trainer (`python -m nsa.train`, alone or under "
        "`torchrun --standalone` on gloo) and/or the **real** harness (`python -m validation`), injected "
        "through the trainer's test hook (`NSA_FAULT`, see `nsa/train/faults.py`; off by default, recorded "
        "in env.json when on) or by damaging a real artifact or input. *Seconds* is the time the suite "
        "measured for the fault to resolve (rank faults: from the faulted rank's heartbeat at the injected "
        "step to the run's last write, start-up excluded; watchdog-off stall and OOM: the whole trainer run; "
        "otherwise the whole command); *bound* is the limit the test asserts. Every test also asserts that no "
        "process of the run survives (a /proc scan for the test's unique directory) and that the records, "
        "artifacts and report of the earlier runs are byte-for-byte intact.",
        "",
        "Regenerate (2 cores, about 5 minutes):",
        "",
        "```",
        "python -m pytest tests/faults -n 2 --reliability-report docs/reliability.md",
        "```",
        "",
        f"Last generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on "
        f"{platform.machine()} with {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"pytest workers: {workers or 1}; suite wall time {wall_s:.0f} s; "
        f"{len(rows) - failed} of {len(rows)} faults behaved as required.",
        "",
    ]
    lines += _table(rows)
    lines += ["", _tests_line(rows), ""]
    if skipped:
        lines += [f"Not run here ({len(skipped)} GPU test(s), skipped, no row above): "
                  + "; ".join(f"`{nodeid}` ({reason})" for nodeid, reason in sorted(skipped.items())), ""]
    return lines


def _section_part(name: str, rows: list[dict[str, Any]], wall_s: float) -> str:
    failed = sum(r.get("result") == "FAILED" for r in rows)
    lines = [f"<!-- section: {name} -->", f"## {name}", ""]
    if name in SECTIONS:
        lines += [SECTIONS[name], ""]
    lines += [f"Last generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on "
              f"{platform.machine()} with {os.cpu_count()} cores{_gpus()}, Python {platform.python_version()}; "
              f"suite wall time {wall_s:.0f} s; {len(rows) - failed} of {len(rows)} faults behaved as required.", ""]
    lines += _table(rows)
    lines += ["", _tests_line(rows), "<!-- /section -->", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- fixtures
class Matrix:
    """One row of the fault matrix. ``start`` first (so a test that dies mid-way still shows its
    row, marked FAILED), ``done`` with what was observed."""

    def __init__(self, record_property):
        self._rp = record_property
        self.row: dict[str, Any] = {}

    def start(self, fault: str, injection: str, expect: str, section: str | None = None) -> None:
        """``section``: the row belongs to that section's table (SECTIONS), not the main one."""
        self.row = {"fault": fault, "injection": injection, "expect": expect}
        if section:
            self.row["section"] = section
        self._rp("fault_matrix", json.dumps(self.row))

    def done(self, verdict: str, finding: str, elapsed: float | None, bound: float | None) -> None:
        self.row.update(verdict=verdict, finding=finding, elapsed=None if elapsed is None else round(elapsed, 1),
                        bound=bound)
        self._rp("fault_matrix", json.dumps(self.row))


@pytest.fixture
def matrix(record_property) -> Matrix:
    return Matrix(record_property)


HEALTHY = U.fault_phase("healthy", steps=4)


@pytest.fixture(scope="session")
def baseline(tmp_path_factory) -> Path:
    """A results directory holding one earlier, healthy run (real trainer, real harness) and
    its rendered report: the 'earlier run' each fault must leave intact."""
    root = tmp_path_factory.mktemp("baseline")
    rb = U.write_runbook(root / "faults.yaml", [HEALTHY])
    p = U.harness("run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(root / "results"),
                  "--no-plots", timeout=180)
    assert p.rc == 0, f"healthy baseline run is not GO (exit {p.rc}):\n{p.stderr[-3000:]}"
    return root / "results"


class Seeded:
    """A per-test copy of the baseline store; ``intact()`` checks the earlier run is untouched."""

    def __init__(self, tmp_path: Path, baseline: Path):
        self.root = tmp_path
        self.results = tmp_path / "results"
        shutil.copytree(baseline, self.results)
        self.healthy = U.record(self.results, "healthy")
        self.healthy_dir = self.results / self.healthy.out_dir
        self.digest = U.tree_digest(self.healthy_dir)

    def runbook(self, *phases: dict[str, Any]) -> Path:
        return U.write_runbook(self.root / "faults.yaml", [HEALTHY, *phases])

    def run(self, rb: Path, *phases: str, timeout: float = 240, plots: bool = False,
            env: dict[str, str] | None = None) -> U.Proc:
        """The harness on ``phases`` of ``rb``; env: more environment of the harness and the runs
        it starts (U.clean_env's extra)."""
        args = ["run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(self.results)]
        for ph in phases:
            args += ["--phase", ph]
        return U.harness(*args, *([] if plots else ["--no-plots"]), timeout=timeout,
                         env=U.clean_env(env) if env else None)

    def intact(self) -> None:
        store = U.load_store(self.results)  # parses: never half-written
        assert U.record(self.results, "healthy") == self.healthy, "the earlier run's record changed"
        assert U.tree_digest(self.healthy_dir) == self.digest, "the earlier run's artifacts changed"
        assert store["schema"] == 2
        assert not list(self.results.glob(".results.*.tmp")), "a temp file of the store was left behind"


@pytest.fixture
def seeded(tmp_path, baseline) -> Seeded:
    return Seeded(tmp_path, baseline)
