"""The options people type are an interface: a new one, a renamed one or a removed one must be a
decision, made here in the same change as the docs (torchtitan's test_no_new_cli_options habit).
When this fails, update the frozen table below and the README / docs that name the option."""
from __future__ import annotations

import argparse

import pytest

from validation.cli import _parser

#: ``nsa-validate`` subcommands -> their options and positional arguments
CLI = {
    "run": {"--hardware-mismatch", "--jobs", "--no-plots", "--no-report", "--phase", "--profile", "--results-dir",
            "--runbook", "--tensorboard"},
    "report": {"--baseline", "--no-plots", "--profile", "--results-dir", "--runbook", "--tensorboard"},
    "phases": {"--profile", "--runbook"},
    "bless": {"--phase", "--point", "--profile", "--results-dir", "--runbook"},
    "check-artifacts": {"--adapter", "--world-size", "dir"},
}
#: the pytest plugin's options (validation/pytest_plugin.py)
PYTEST = {"--runbook", "--profile", "--results-dir", "--hardware-mismatch", "--no-acceptance-report",
          "--progress-every", "--baseline", "--tensorboard"}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_cli_has_exactly_the_frozen_subcommands():
    assert set(_subcommands()) == set(CLI)


@pytest.mark.parametrize("command", sorted(CLI))
def test_each_subcommand_has_exactly_the_frozen_options(command):
    parser = _subcommands()[command]
    got = {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}
    got |= {a.dest for a in parser._actions if not a.option_strings}
    assert got == CLI[command], f"nsa-validate {command}: options changed; new {got - CLI[command]}, gone {CLI[command] - got}"


def test_the_pytest_plugin_has_exactly_the_frozen_options():
    from validation import pytest_plugin

    seen: set[str] = set()

    class Group:
        def addoption(self, *names, **kwargs):
            seen.update(names)

    class Parser:
        def getgroup(self, *args, **kwargs):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    assert seen == PYTEST, f"pytest plugin options changed; new {seen - PYTEST}, gone {PYTEST - seen}"
