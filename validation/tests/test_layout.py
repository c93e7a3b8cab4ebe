"""validation/ is laid out by stage, and its imports say so: each stage imports only the stages
below it, nothing imports the trainer it judges, and the two doors (the CLI and the pytest
plugin) hold no session logic of their own: they reach the work only through the session. A
module split into a package of modules of one job each keeps its own floors: each of them imports
only those below it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from validation import REPO_ROOT

PACKAGE = REPO_ROOT / "validation"
#: bottom to top; a module may import its own stage and the ones before it. The package's own
#: top-level modules (paths, errors, excerpt widths, the machine) are below every stage.
STAGES = ("contract", "judge", "runbook", "launch", "store", "report", "session")
BASE = ("validation", "validation.errors", "validation.excerpt", "validation.machine")
DOORS = ("validation.cli", "validation.pytest_plugin", "validation.__main__")
#: what a door may import: the session and the types it hands out (points, records), and the
#: commands that are not a session (listing a runbook's phases, blessing goldens, checking a
#: directory against the contract)
DOOR_IMPORTS = ("validation.session", "validation.judge.record", "validation.runbook.plan",
                "validation.runbook.describe", "validation.runbook.load",
                "validation.store.bless", "validation.store.goldens", "validation.judge.check_command",
                "validation.contract.adapters", "validation.cli")
#: the packages that were one module, split into modules of one job each, bottom to top (as their
#: __init__.py lists them): a module imports only those before it
SPLIT = {"validation.contract.torchrun_log": ("patterns", "exceptions", "whose", "failure", "attempts", "ranks",
                                             "said"),
         "validation.judge.diagnosis": ("blame", "beats", "collectives", "failed", "nonfinite", "mismatch", "left",
                                        "outofstep", "crash", "stall", "decide")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(REPO_ROOT).with_suffix("")
        if "tests" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (validation/ imports absolutely)"
            mod = node.module or ""
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The validation module an imported name lives in (``validation.judge.gates.check`` ->
    ``validation.judge.gates``), None outside validation/."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def _stage(module: str) -> int:
    """-1 for the base modules, len(STAGES) for the doors, else the stage's position."""
    if module in BASE:
        return -1
    if module in DOORS:
        return len(STAGES)
    parts = module.split(".")
    assert len(parts) >= 3 and parts[1] in STAGES, f"{module} is in no stage folder ({', '.join(STAGES)})"
    return STAGES.index(parts[1])


MODULES = _modules()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_stages(module):
    for line, name in _imports(MODULES[module]):
        assert not (name == "nsa.train" or name.startswith("nsa.train.")), \
            f"{module}:{line} imports {name}: the harness judges trainers by their files, never by importing them"
        target = _target(name, MODULES)
        if target is None or target == module:
            continue
        assert _stage(target) <= _stage(module), (
            f"{module}:{line} imports {target}, a later stage (stages bottom to top: {', '.join(STAGES)})")


def test_no_import_cycle():
    graph = {m: {t for _, n in _imports(p) if (t := _target(n, MODULES)) and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(t):] + [t]))
            if t not in state:
                visit(t, trail + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


@pytest.mark.parametrize("package", sorted(SPLIT))
def test_a_split_packages_modules_import_only_those_below_them(package):
    order = [f"{package}.{name}" for name in SPLIT[package]]
    assert sorted(order) == sorted(m for m in MODULES if m.startswith(f"{package}.")), (
        f"{package}: SPLIT lists its modules, bottom to top")
    for module in order:
        for line, name in _imports(MODULES[module]):
            target = _target(name, MODULES)
            assert target not in order or order.index(target) <= order.index(module), (
                f"{module}:{line} imports {target}, a module above it in {package} (bottom to top: "
                f"{', '.join(SPLIT[package])})")


@pytest.mark.parametrize("door", [d for d in DOORS if d in MODULES])
def test_the_doors_reach_the_work_only_through_the_session(door):
    for line, name in _imports(MODULES[door]):
        target = _target(name, MODULES)
        if target is None or target in BASE:
            continue
        assert target.startswith(DOOR_IMPORTS), (
            f"{door}:{line} imports {target}: session logic belongs in validation/session, which both doors drive")
