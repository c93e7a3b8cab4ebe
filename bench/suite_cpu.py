"""Where the test suite's CPU time goes: a pytest plugin that writes each test's CPU seconds (its
worker's own, and that of the processes the test started and waited for: trainers, torchrun
agents and ranks, inner pytest and harness runs), and a summary of such a file by folder, file
and test.

On CI's two cores the suite is bound by CPU, not by waiting (its wall time grows with more xdist
workers), so its CPU seconds, which do not depend on how many tests share the cores, say what a
change to the suite saves. A process a test leaves running, or one whose parent never waits for
it, is not counted.

    PYTHONPATH=bench python -m pytest -n 3 -p suite_cpu --suite-cpu-log /tmp/cpu.jsonl
    python bench/suite_cpu.py /tmp/cpu.jsonl --top 25
"""
from __future__ import annotations

import argparse
import json
import resource
from collections import defaultdict
from pathlib import Path

import pytest


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_addoption(parser) -> None:
    parser.addoption("--suite-cpu-log", metavar="PATH", default=None,
                     help="append each test's CPU seconds (own, children) to PATH as JSON lines (bench/suite_cpu.py)")


def pytest_configure(config) -> None:
    path = config.getoption("--suite-cpu-log")
    if path:
        config.pluginmanager.register(_Recorder(Path(path)), "suite_cpu_recorder")


class _Recorder:
    def __init__(self, path: Path):
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        own0, children0 = _cpu_s()
        yield
        own1, children1 = _cpu_s()
        line = json.dumps({"test": item.nodeid, "own_s": round(own1 - own0, 3),
                           "children_s": round(children1 - children0, 3)})
        with self.path.open("a") as f:  # one short append per test: xdist workers' lines do not mix
            f.write(line + "\n")


def _group(test: str, by: str) -> str:
    path = test.split("::")[0]
    if by == "test":
        return test
    if by == "file":
        return path
    parts = path.split("/")
    return "/".join(parts[:-1]) or parts[0]


def summary(path: Path, by: str, top: int) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no test recorded (was the run given -p suite_cpu --suite-cpu-log {path}?)")
    own, children, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for r in rows:
        key = _group(r["test"], by)
        own[key] += r["own_s"]
        children[key] += r["children_s"]
        count[key] += 1
    total = sum(own.values()) + sum(children.values())
    lines = [f"{len(rows)} tests, {total:.0f} CPU s ({sum(own.values()):.0f} in the workers, "
             f"{sum(children.values()):.0f} in the processes they started)",
             f"| {by} | tests | CPU s | share | workers' own s | started processes' s |", "|---|---:|---:|---:|---:|---:|"]
    for key in sorted(own, key=lambda k: -(own[k] + children[k]))[:top]:
        cpu = own[key] + children[key]
        lines.append(f"| {key} | {count[key]} | {cpu:.1f} | {cpu / total:.1%} | {own[key]:.1f} | {children[key]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="the file a run wrote with --suite-cpu-log")
    ap.add_argument("--by", choices=("folder", "file", "test"), default="folder")
    ap.add_argument("--top", type=int, default=20, help="rows to print (default 20)")
    args = ap.parse_args()
    if not args.log.is_file():
        raise SystemExit(f"{args.log}: no such file")
    print(summary(args.log, args.by, args.top))


if __name__ == "__main__":
    main()
