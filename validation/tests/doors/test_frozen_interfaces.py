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
    "check-artifacts": {"--adapter", "--world-size", "--tokens-per-step", "dir"},
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


#: every key a runbook or profile may hold, by section (validation/runbook/keys.py)
RUNBOOK_KEYS = {
    "(top level)": {"name", "description", "source", "profiles", "max_parallel", "defaults", "phases", "trainer"},
    "defaults": {"launcher", "config", "overrides", "env", "steps", "timeout_s", "stall_s", "startup_s", "min_gpus"},
    "phases[]": {"name", "kind", "description", "markers", "launcher", "config", "overrides", "env", "steps",
                 "timeout_s", "stall_s", "startup_s", "sweep", "gates", "tests", "pytest_args", "min_gpus",
                 "golden_steps", "profile_steps", "resume_after", "repeats"},
    "phases[].launcher": {"kind", "nproc", "module", "torchrun_args", "nnodes", "rdzv", "nodes", "nproc_per_node",
                          "srun_args"},
    "phases[].launcher.rdzv": {"backend", "endpoint", "port", "join_timeout_s"},
    "phases[].gates[]": {"metric", "op", "threshold", "window", "description"},
    "trainer": {"name", "root", "script", "module", "args", "config", "steps", "out_dir", "params", "env", "format",
                "phases", "metrics", "resume", "tokens_per_step", "requires"},
    "trainer.root": {"env"},
    "trainer.config": {"template", "pass_as"},
    "trainer.resume": {"stop_after", "from"},
    "(profile file)": {"name", "marker", "description", "hardware", "thresholds", "notes"},
    "hardware": {"accelerator", "min_gpus", "min_gpu_mem_gb", "gpu_name", "peak_bf16_tflops"},
}


def test_the_runbook_keys_are_exactly_the_frozen_ones():
    from validation.runbook.keys import SECTIONS

    got = {s.where: set(s.names) for s in SECTIONS}
    assert got == RUNBOOK_KEYS, {w: (got.get(w, set()) ^ RUNBOOK_KEYS.get(w, set())) for w in set(got) | set(RUNBOOK_KEYS)
                                 if got.get(w) != RUNBOOK_KEYS.get(w)}


def test_the_reference_pages_say_what_the_code_does():
    """docs/artifact_contract.md, docs/runbook_format.md and docs/metrics.md are generated from the
    contract, the runbook keys and the metric catalogue; a change to one without its page fails."""
    from validation.report.reference import stale

    assert stale() == [], "run: python -m validation.report.reference"
