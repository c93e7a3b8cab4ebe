"""Every key a runbook or a hardware profile may hold, with what it means: the one table the
loader reads (which keys a mapping allows, which it requires) and docs/runbook_format.md is
generated from (validation/report/reference.py), so the two cannot drift. The keys of a phase,
of ``defaults:``, of a rendezvous, of a profile's hardware and the runbook's max_parallel are the fields of their
dataclasses (validation/runbook/types.py, declared with validation/runbook/schema.py's ``key``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from validation.judge.profile_names import HARNESS_READ
from validation.runbook.schema import TEXT_ONLY, Key, keys_of
from validation.runbook.types import Hardware, Phase, Rendezvous, Runbook


@dataclass(frozen=True)
class Section:
    """One mapping of a runbook or profile file: where it is and the keys it allows."""

    where: str
    """How the docs and error messages name it ('phases[]', 'trainer.config')."""
    about: str
    keys: tuple[Key, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys if k.required)

    @property
    def nullable(self) -> tuple[str, ...]:
        """Keys whose empty value means something (``Key.empty``) rather than being an error."""
        return tuple(k.name for k in self.keys if k.empty)

    def meaning(self, name: str) -> str:
        return next((k.meaning for k in self.keys if k.name == name), "")

    def key(self, name: str) -> Key:
        return next(k for k in self.keys if k.name == name)

    @property
    def shows_defaults(self) -> bool:
        """Whether the reference page gives the section a column of defaults."""
        return any(k.shown_default for k in self.keys)

    @property
    def shows_staleness(self) -> bool:
        """Whether the reference page says what a change to each key means for a stored record."""
        return any(k.stale is not None for k in self.keys)


#: the keys of ``phases[]``, as the Phase dataclass declares them
_PHASE_KEYS = keys_of(Phase)

RUNBOOK = Section("(top level)", "A runbook: phases to run against a trainer, with the profiles whose thresholds "
                  "its gates read.", (
    Key("name", "the runbook's name (letters, digits, _ . -): reports and results are filed under it", True),
    Key("description", "one line for people", empty=TEXT_ONLY),
    Key("source", "what the runbook follows (cite the seed runbook by its title, not by a path)", empty=TEXT_ONLY),
    Key("profiles", "hardware profiles it runs on, by name (one under runbooks/profiles/, or the name: of a file "
                    "of your own given with --profile PATH); the first is the CLI's default", True),
    *(k for k in keys_of(Runbook) if k.name == "max_parallel"),
    Key("defaults", "values every phase takes unless it sets its own (the keys of `defaults`)"),
    Key("phases", "the phases, in the order they run", True),
    Key("trainer", "the trainer its train phases launch, when not this project's own (`python -m nsa.train`)"),
))

DEFAULTS = Section("defaults", "Values every phase takes unless it sets its own.",
                   tuple(dataclasses.replace(k, meaning=k.defaults, stale=None) for k in _PHASE_KEYS
                         if k.defaults is not None))

PHASE = Section("phases[]", "One phase: a kind, how it launches, what it runs, its sweep and its gates. Each point "
                "of its sweep is one pytest test and one stored record; the last column says what a change to a "
                "key since a point's stored run means for that record (validation/store/stale.py).", _PHASE_KEYS)

LAUNCHER = Section("phases[].launcher", "How a phase starts its trainer (never a shell): python (one process), "
                   "torchrun (nproc per node; with nnodes, one agent per node on this host) or slurm (srun of "
                   "torchrun inside an allocation). Each kind takes only its own keys.", (
    Key("kind", "python, torchrun or slurm"),
    Key("nproc", "python and torchrun: processes per node"),
    Key("module", "this project's trainer module (default nsa.train)"),
    Key("torchrun_args", "python, torchrun and slurm: torchrun options --name=value (not the rendezvous's: rdzv says it)"),
    Key("nnodes", "torchrun: nodes, each an agent started on this host (a one-host test of several nodes)"),
    Key("rdzv", "torchrun with nnodes, and slurm: the c10d rendezvous"),
    Key("nodes", "slurm: nodes of the allocation"),
    Key("nproc_per_node", "slurm: processes per node"),
    Key("srun_args", "slurm: more srun options --name=value (not the ones the harness sets itself)"),
))

RDZV = Section("phases[].launcher.rdzv", "The c10d rendezvous of a launch of several nodes. A node that never joins "
               "is named from the others' rendezvous timeout; join_timeout_s + 10 s must fit in the phase's start-up "
               "allowance (startup_s, else stall_s).", (
    Key("backend", "c10d (the only one)"),
    *keys_of(Rendezvous),
))

GATE = Section("phases[].gates[]", "One gate: `metric op threshold` over a window. No expression is evaluated.", (
    Key("metric", "a metric of the catalogue (docs/metrics.md)", True),
    Key("op", "one of >= > <= < == !=", True),
    Key("threshold", "a number, or {profile: KEY} for the profile's threshold (null there: to be measured, "
                     "UNMEASURED)", True),
    Key("window", "'last N steps' (step numbers, not rows; a run that did not cover it is no data) or 'all'"),
    Key("description", "what the gate guards, for the report", empty=TEXT_ONLY),
))

TRAINER = Section("trainer", "A trainer other than this project's: how to launch it and what it supports. It is "
                  "judged by the files it leaves (docs/artifact_contract.md), never imported.", (
    Key("name", "the trainer's name in reports", True),
    Key("root", "its checkout: a path relative to this repository, or {env: VAR}; its working directory and "
                "PYTHONPATH", True),
    Key("script", "a .py file under the root (or module)"),
    Key("module", "a dotted module name (or script)"),
    Key("args", "arguments; placeholders {steps} {out_dir} {config} {nproc}"),
    Key("config", "a per-point copy of its own YAML config: template and pass_as"),
    Key("steps", "how the step count reaches it: {flag: --x}, {env: X} or {config: dotted.key}"),
    Key("out_dir", "how its output directory reaches it (the same three ways)"),
    Key("params", "every override and sweep key the runbook uses, a dotted lower-case name as the phases' "
                  "overrides take it (train.lr, not lr): {train.lr: {flag|env|config: name}}"),
    Key("env", "variables it reads, of its own naming (not the loader's, the interpreters', PATH or the "
               "harness's own)"),
    Key("requires", "top-level Python packages it imports that a machine may lack, e.g. [fla, transformers]: a "
                    "point whose trainer finds one neither under its root nor installed in the harness's Python is not "
                    "launched (pytest: a skip naming the package; nsa-validate run: exit 2), rather than run to a crash"),
    Key("format", "what its output directory holds, read through the adapter of that name: contract (it writes the "
                  "contract itself; the default), seed (the seed system's files), torchtitan (torchtitan's or flame's "
                  "log, TensorBoard events and flight-recorder dumps) or hf_trainer (a Hugging Face Trainer's output "
                  "folder)"),
    Key("tokens_per_step", "what one rank takes per optimizer step, as factors: params keys (their values in each "
                           "point's overrides) and integers, e.g. [train.batch_size, train.block_size]; times the "
                           "world size, the run's global tokens per step, from which format hf_trainer derives tokens/s (the other "
                           "formats read their own rate, and refuse the key)"),
    Key("phases", "phase kinds it supports (train, profile, resume, preflight); others are SKIP (default [train]; "
                  "an empty list is an error)"),
    Key("metrics", "metrics it provides (default: all its files can carry)"),
    Key("resume", "how it stops after N steps and resumes from its checkpoint (for resume phases)"),
))

TRAINER_ROOT = Section("trainer.root", "The trainer's checkout named by an environment variable the user sets.", (
    Key("env", "the variable", True),
))

TRAINER_CONFIG = Section("trainer.config", "A copy of the trainer's YAML config per point, with the point's keys "
                         "set.", (
    Key("template", "its YAML config, relative to the root", True),
    Key("pass_as", "how the copy's path reaches it: {env: NAME} or {flag: --name}"),
))

TRAINER_RESUME = Section("trainer.resume", "How a runbook's own trainer stops after N steps with a checkpoint, and "
                         "resumes from an earlier run's output directory.", (
    Key("stop_after", "how N reaches it: {flag: --x}, {env: X} or {config: dotted.key}", True),
    Key("from", "how the earlier run's output directory reaches it (the same three ways)", True),
))

PROFILE = Section("(profile file)", "A hardware profile: the minimum hardware and the thresholds gates read by "
                  "name.", (
    Key("name", "the profile's name", True),
    Key("marker", "its pytest marker (`pytest -m h100`)", True),
    Key("description", "one line for people", empty=TEXT_ONLY),
    Key("hardware", "the minimum hardware", True),
    Key("thresholds", "name: number, or null (to be measured: a gate on it is UNMEASURED); the names gates "
                      "refer to, and those the harness reads itself: " + ", ".join(HARNESS_READ) + " (a name this "
                      "close to one of those is refused as its typo)", True),
    Key("notes", "for people", empty=TEXT_ONLY),
))

HARDWARE = Section("hardware", "What a profile's points need; a machine without it skips them.", keys_of(Hardware))

SECTIONS = (RUNBOOK, DEFAULTS, PHASE, LAUNCHER, RDZV, GATE, TRAINER, TRAINER_ROOT, TRAINER_CONFIG, TRAINER_RESUME,
            PROFILE, HARDWARE)
