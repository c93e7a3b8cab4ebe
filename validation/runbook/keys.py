"""Every key a runbook or a hardware profile may hold, with what it means: the one table the
loader reads (which keys a mapping allows, which it requires) and docs/runbook_format.md is
generated from (validation/report/reference.py), so the two cannot drift."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Key:
    name: str
    meaning: str
    required: bool = False
    empty: str = ""
    """What the key written with nothing after it (YAML's null) means; "" (most keys): an error
    naming the file and key, since the user meant a value or keys to follow (validation/runbook/empty.py)."""


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


#: what an empty text for people means
TEXT_ONLY = "no text (a key for people only: nothing the harness does depends on it)"

RUNBOOK = Section("(top level)", "A runbook: phases to run against a trainer, with the profiles whose thresholds "
                  "its gates read.", (
    Key("name", "the runbook's name (letters, digits, _ . -): reports and results are filed under it", True),
    Key("description", "one line for people", empty=TEXT_ONLY),
    Key("source", "what the runbook follows (cite the seed runbook by its title, not by a path)", empty=TEXT_ONLY),
    Key("profiles", "hardware profiles it runs on (names under runbooks/profiles/); the first is the CLI's "
                    "default", True),
    Key("max_parallel", "untimed single-process points (pytest, preflight) the CLI may run at once; a timed point "
                        "(train, profile) always runs alone (default 1)"),
    Key("defaults", "values every phase takes unless it sets its own (the keys of `defaults`)"),
    Key("phases", "the phases, in the order they run", True),
    Key("trainer", "the trainer its train phases launch, when not this project's own (`python -m nsa.train`)"),
))

DEFAULTS = Section("defaults", "Values every phase takes unless it sets its own.", (
    Key("launcher", "see `phases[].launcher`"),
    Key("config", "this project's trainer: a preset name or YAML path (default tiny)"),
    Key("overrides", "dotted config keys and values, merged under each phase's own"),
    Key("env", "environment variables, merged under each phase's own"),
    Key("steps", "optimizer steps (default 20)"),
    Key("timeout_s", "hard limit of a point in seconds (default 600)"),
    Key("stall_s", "see `phases[].stall_s`"),
    Key("startup_s", "see `phases[].startup_s`"),
    Key("min_gpus", "GPUs a point needs at least (default 0)"),
))

PHASE = Section("phases[]", "One phase: a kind, how it launches, what it runs, its sweep and its gates. Each point "
                "of its sweep is one pytest test and one stored record.", (
    Key("name", "the phase's name; it is a pytest marker too (`pytest -m NAME`)", True),
    Key("kind", "train (the trainer), profile (a train run asked for profile.json), resume (an uninterrupted run "
                "against one stopped and resumed from its checkpoint), pytest (this project's own tests) or preflight "
                "(git SHA, collect_env, nvidia-smi)", True),
    Key("description", "one line for people", empty=TEXT_ONLY),
    Key("markers", "more pytest markers, each registered in pytest.ini"),
    Key("launcher", "how the trainer starts: python, or torchrun with nproc processes"),
    Key("config", "this project's trainer: a preset name or YAML path"),
    Key("overrides", "dotted config keys of the trainer (checked against its --list-keys, or a runbook trainer's "
                     "params)"),
    Key("env", "environment variables (names starting NSA_, NCCL_, TORCH_, PYTORCH_, CUDA_, OMP_, MKL_, TRITON_, "
               "or CONFIG)"),
    Key("steps", "optimizer steps the trainer is asked for; a run that completes fewer is a FAIL"),
    Key("timeout_s", "hard limit of the point in seconds: the harness takes stacks, kills the tree, records FAIL"),
    Key("stall_s", "train and profile phases: no new step for this long after the first is a stall (stacks of "
                   "every rank, the tree killed, FAIL); default a quarter of timeout_s"),
    Key("startup_s", "train and profile phases: no first step this long after the launch is a stall too "
                     "(imports, compilation, graph capture); default stall_s"),
    Key("sweep", "parameters to sweep: {dotted.key: [values]} or {env.NAME: [values]}; the points are their "
                 "cartesian product in YAML order"),
    Key("gates", "checks of the point's metrics against thresholds"),
    Key("tests", "pytest phases: test paths inside this repository"),
    Key("pytest_args", "pytest phases: allowed extra arguments (-k, -m, -x, -q, -v, --maxfail=N, "
                       "--hypothesis-seed=N)"),
    Key("min_gpus", "GPUs a point needs at least (a CUDA profile's point needs one per process too)"),
    Key("golden_steps", "train phases: compare the loss of steps 1..N with the golden curve within the profile's "
                        "golden_loss_rtol"),
    Key("profile_steps", "profile phases: steps the trainer profiles once steady (1..steps), asked through the "
                         "contract's CONTRACT_PROFILE_STEPS"),
    Key("resume_after", "resume phases: the step after which the interrupted run stops (1..steps-1); it resumes "
                        "from its checkpoint for the rest and is compared step by step with an uninterrupted run"),
    Key("repeats", "train phases: runs of each point (default 1); the report shows the mean with its 95% "
                   "confidence interval, and a best setting or a regression only where the intervals separate; with "
                   "golden_steps, the runs' losses are also gated against each other (repeat_loss_rel_diff <= "
                   "golden_loss_rtol)"),
))

LAUNCHER = Section("phases[].launcher", "How a phase starts its trainer (never a shell): python (one process), "
                   "torchrun (nproc per node; with nnodes, one agent per node on this host) or slurm (srun of "
                   "torchrun inside an allocation). Each kind takes only its own keys.", (
    Key("kind", "python, torchrun or slurm"),
    Key("nproc", "python and torchrun: processes per node"),
    Key("module", "this project's trainer module (default nsa.train)"),
    Key("torchrun_args", "python and torchrun: torchrun options --name=value (not the rendezvous's: rdzv says it)"),
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
    Key("endpoint", "torchrun: host:port on this host (localhost or 127.x; port 0: a free one at launch)"),
    Key("port", "slurm: the port on the first node (default: from the job id, 20000-28999)"),
    Key("join_timeout_s", "seconds the nodes wait for each other", True),
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
    Key("adapter", "native (it writes the contract), seed (the seed system's format) or hf_trainer (a Hugging Face "
                   "Trainer's output folder)"),
    Key("tokens_per_step", "what one rank takes per optimizer step, as factors: params keys (their values in each "
                           "point's overrides) and integers, e.g. [train.batch_size, train.block_size]; times the "
                           "world size, the run's global tokens per step (for an adapter that derives tokens/s)"),
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
    Key("thresholds", "name: number, or null (to be measured: a gate on it is UNMEASURED)", True),
    Key("notes", "for people", empty=TEXT_ONLY),
))

HARDWARE = Section("hardware", "What a profile's points need; a machine without it skips them.", (
    Key("accelerator", "cuda or cpu", True),
    Key("min_gpus", "GPUs at least"),
    Key("min_gpu_mem_gb", "memory per GPU at least"),
    Key("gpu_name", "a substring of the GPU's name (H100): another GPU runs and is reported, or skips with "
                    "--hardware-mismatch=skip"),
    Key("peak_bf16_tflops", "the GPU's dense bf16 peak in TFLOP/s, from its data sheet: mfu divides by it "
                            "(without it mfu is UNMEASURED)"),
))

SECTIONS = (RUNBOOK, DEFAULTS, PHASE, LAUNCHER, RDZV, GATE, TRAINER, TRAINER_ROOT, TRAINER_CONFIG, TRAINER_RESUME,
            PROFILE, HARDWARE)
