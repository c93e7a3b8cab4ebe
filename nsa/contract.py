"""The artifact contract, version 2: what a trainer leaves in its output directory for the
acceptance harness to judge (docs/artifact_contract.md says it for people).

This module is the one schema. ``nsa.train`` writes by it and ``validation/`` checks by it, so
the two cannot drift; it imports nothing (a leaf below both), so the harness reads the schema
without importing the trainer it judges. A trainer of another project does not import it: it
writes the files the documentation describes, and ``nsa-validate check-artifacts`` checks them.

Version 2 adds to version 1: ranks come from ``env.json`` (a heartbeat or stack dump of a rank
at or above ``world_size`` is malformed); ``git_sha`` in ``env.json`` names the trainer's own
commit; steps completed are checked against steps requested; the harness asks for a profile
through ``PROFILE_STEPS_ENV`` and reads ``profile.json``; a trainer may publish its config keys
(``LIST_KEYS_FLAG``) and check a run's config values (``CHECK_CONFIG_FLAG``).
"""
from __future__ import annotations

import re

VERSION = 2

# --- files ---------------------------------------------------------------------------------------

TRAINING_CSV = "training.csv"
#: the header, exactly; column 3 (from 0) is tokens/s, as the seed runbook's snippet reads it
CSV_COLUMNS = ("step", "loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb")
CSV_MEANING = {
    "step": "optimizer step, from 1; the last step the run completed is logged whatever the interval",
    "loss": "training loss of the step (mean over ranks and micro-batches)",
    "lr": "learning rate of the step",
    "toks_per_s": "global tokens per second: all ranks, all micro-batches",
    "step_time_s": "wall time of the whole step (data to optimizer; on a GPU, read after synchronising the device)",
    "grad_norm": "gradient norm before clipping",
    "mem_alloc_gb": "allocated accelerator memory, GiB (the process's resident set on CPU)",
    "mem_reserved_gb": "reserved accelerator memory, GiB (the process's resident set on CPU)",
}
#: columns that measure an amount, never below 0 (nan allowed: not measured); a negative value is malformed
CSV_NON_NEGATIVE = ("toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb")
ENV_JSON = "env.json"
HALT = ".HALT"
PROFILE_JSON = "profile.json"
HEARTBEAT_PATTERN = re.compile(r"^heartbeat_rank(\d+)\.jsonl$")
STACKDUMP_PATTERN = re.compile(r"^stackdump_rank(\d+)\.txt$")


def heartbeat_name(rank: int) -> str:
    return f"heartbeat_rank{rank}.jsonl"


def stackdump_name(rank: int) -> str:
    return f"stackdump_rank{rank}.txt"


# --- JSON files ----------------------------------------------------------------------------------

#: how a non-finite number is written in a trainer's JSON files (env.json, heartbeats, .HALT,
#: profile.json): as one of these strings (what Python's float() reads), since JSON has no NaN or
#: infinity. Python's json module writes the bare NaN / Infinity, which jq, JavaScript's JSON.parse
#: and Go's encoding/json refuse. The harness reads the strings (and a bare NaN / Infinity) as the
#: numbers they name where it expects a number: a .HALT's losses and grad_norm, profile.json's fractions.
JSON_NONFINITE = ("nan", "inf", "-inf")

# --- heartbeat records ---------------------------------------------------------------------------

#: torchrun's node rank of a worker (its agent's place in the rendezvous), in the worker's environment
NODE_RANK_ENV = "GROUP_RANK"
#: fields every heartbeat record carries (progress, stalls, imbalance are read from them)
HEARTBEAT_REQUIRED = ("time", "step")
#: the stages of a record written as a step runs, on entering each: its ``step`` is the step in
#: progress (started, not completed)
HEARTBEAT_STAGES_IN_STEP = ("data", "forward", "backward", "optimizer", "graph")
#: the stages of a record written once a step is done (``step``: the step logged; a checkpoint of
#: it; a profiled window summarised after it): its ``step`` is the step completed
HEARTBEAT_STAGES_AFTER_STEP = ("step", "checkpoint", "profile")
#: the stage of a record a rank writes as the run stops (a non-finite loss, the watchdog): its
#: ``step`` is the step at which it stopped
HEARTBEAT_STAGE_HALT = "halt"
#: what a record's ``step`` means, by its stage
HEARTBEAT_STEP_MEANING = (
    "the optimizer step (from 1): in a record of a stage within a step (" + ", ".join(HEARTBEAT_STAGES_IN_STEP)
    + ") the step in progress, started and not completed; in a record written once a step is done ("
    + ", ".join(HEARTBEAT_STAGES_AFTER_STEP) + ") the step completed; in a `halt` record the step at which "
    "the run stopped")
HEARTBEAT_RECOMMENDED = {
    "rank": "the writer's rank (the file name says it too)",
    "pid": "the writer's process id: the harness maps a hung process to its rank by it",
    "stage": "data / forward / backward / optimizer / checkpoint / graph / profile / step / halt: what the rank "
             "was doing, and so whether its `step` is in progress or completed (a record without a stage, or "
             "with one not named here, says neither: a rank whose last record is of the last step is taken to "
             "have completed it; a rank that never writes a record of a step done says by one within the last "
             "step only that it started it)",
    "gpu_util": "GPU utilisation in percent where readable",
    "mem_alloc_gb": "accelerator memory this rank's process holds allocated, GiB: a GPU that reads idle while "
                    "holding as much as a busy rank's is a rank waiting for its peers (an NCCL kernel spinning "
                    "keeps the other GPU's reading up), not an idle one; without it a rank that reads ~0% "
                    "beside one at 50% or more is counted idle",
    "fallbacks": "a mapping of counters: calls routed to a slower backend than wanted",
    "node": f"the writer's node: torchrun's node rank ({NODE_RANK_ENV}), 0 for a single node; the harness groups "
            "ranks by it (stragglers, a node's hang)",
    "host": "the writer's host name: which machine a rank ran on",
}

# --- env.json ------------------------------------------------------------------------------------

ENV_REQUIRED = {"world_size": "processes of the run (an integer >= 1, never fewer than the harness launched: torchrun's nproc x nnodes); every rank-numbered file is below it"}
#: recommended keys, each with what its absence costs the trainer in a report
ENV_RECOMMENDED = {
    "contract_version": "read as version 1 (no rank or provenance checks beyond v1's)",
    "git_sha": "the report takes the commit from the trainer's root, else names none",
    "attention_backends": "backends_recorded is UNMEASURED, the report shows no backends",
    "tokens_per_step": "tokens_per_step is UNMEASURED (the host-bound fit reads it)",
    "env": "the report lists no NSA_*/NCCL_* variables the trainer saw",
    "noop_toggles": "the report cannot say which toggles meant nothing to the trainer",
    "model_flops_per_token": "mfu and model_flops_per_token are UNMEASURED (the model's training FLOPs per "
                             "token: forward and backward, no recomputation; nsa/model/flops.py counts this "
                             "project's)",
    "data_position": "the resume phase judges the data position by the loss curve alone",
    "device_mem_gb": "a rank whose memory keeps growing is named without the step at which it would run out (one "
                     "device's memory in GiB: the accelerator's, or the host's where mem_*_gb is the process's "
                     "resident set)",
}
#: env.json's ``data_position``: ``{"start": P0, "end": P1}``, the data the run had consumed before
#: its first step and after its last, in the trainer's own unit (this project's trainer counts
#: global micro-batches); a resumed run starts where the run it continues ended
DATA_POSITION = "data_position"

# --- .HALT ---------------------------------------------------------------------------------------

HALT_WATCHDOG = "watchdog"
HALT_NONFINITE = "nonfinite"
HALT_FIELDS = {
    "source": f"'{HALT_WATCHDOG}', '{HALT_NONFINITE}' or an operator's own word",
    "step": "the step at which the run stopped",
    "losses": "loss per rank at that step (the non-finite guard); a non-finite one as the string \"nan\", \"inf\" "
              "or \"-inf\"",
    "grad_norm": "gradient norm at that step (the non-finite guard), a number or one of those strings",
    "text": "what the trainer said, for people",
}

# --- exit codes ----------------------------------------------------------------------------------

EXIT_OK = 0
"""Done, or stopped by an operator's .HALT."""
EXIT_ERROR = 1
EXIT_INPUT = 2
"""Bad config, data, checkpoint or backend request."""
EXIT_WATCHDOG = 3
EXIT_NONFINITE = 4
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT, the shell's convention)."""
EXIT_TERMINATED = 143
"""Stopped by SIGTERM (a preemption), after the step in flight and its checkpoint: the trainer
ends by SIGTERM itself, which a shell reports as 143 (128 + SIGTERM) and torchrun as signal 15."""
EXIT_MEANING = {EXIT_OK: "done (or an operator's .HALT)", EXIT_ERROR: "unexpected error",
                EXIT_INPUT: "bad config, data, checkpoint or backend request", EXIT_WATCHDOG: "watchdog stall",
                EXIT_NONFINITE: "non-finite loss", EXIT_INTERRUPTED: "Ctrl-C",
                EXIT_TERMINATED: "SIGTERM (preemption), with a checkpoint"}

# --- profiling on request ------------------------------------------------------------------------

#: set by the harness for a profile phase: profile N steps once the run is steady and write
#: PROFILE_JSON; a trainer that ignores it leaves the point UNMEASURED, its profile metrics with it
PROFILE_STEPS_ENV = "CONTRACT_PROFILE_STEPS"
#: env.json's key where a trainer asked for a profile says what came of it: its ``note`` says why
#: it wrote no PROFILE_JSON (this project's trainer: a run that ends before its first steady step)
ENV_PROFILE = "profile"
#: beside PROFILE_JSON: the profiler's table of ops (for people), and on a GPU the profiled window
#: with every device activity interval, from which the harness computes the GPU's busy share and
#: idle gaps itself (a gpu_busy_frac that disagrees with them is an error)
PROFILE_TOP_OPS = "profile_top_ops.txt"
GPU_TIMELINE = "gpu_timeline.json.gz"
PROFILE_FIELDS = {
    "contract_version": "this schema's VERSION",
    "profiled_steps": "steps measured under the profiler (fewer than asked when the run ended or halted first)",
    "first_step": "the first profiled optimizer step (the run is steady from there: warm-up and capture done)",
    "wall_s": "wall time of the profiled window: the steps and a device synchronize at its end",
    "gpu_busy_frac": "share of the profiled wall time during which the GPU ran work (null on CPU)",
    "top_ops": "list of {name, ms_per_step}: the ops with the most device (CPU on CPU) time of their own",
    "nsa_ranges": "names that attribute time to NSA (ranges, custom ops, kernels)",
    "python_overhead_frac": "share of the profiled CPU time outside aten ops (information only)",
    "cuda_graphs": "true when the profiled steps were CUDA-graph replays",
    "device": "'cuda' or 'cpu'",
}

# --- config keys ---------------------------------------------------------------------------------

#: ``<trainer> --list-keys`` prints its config keys as a JSON list of dotted names and exits 0;
#: the harness checks a runbook's overrides against them without importing the trainer
LIST_KEYS_FLAG = "--list-keys"
#: ``<trainer> --check-config`` reads a JSON list of runs from stdin, each ``CHECK_CONFIG_FIELDS``,
#: and prints a JSON list of as many answers and exits 0: null where the trainer would take the
#: run's config, else the one-line error it would stop with. It checks, runs nothing and writes
#: nothing; the harness asks it (of a trainer that publishes its keys) when a runbook loads, so that
#: a value of the wrong type or out of range is refused there, not found as a crash of every point
CHECK_CONFIG_FLAG = "--check-config"
CHECK_CONFIG_FIELDS = {
    "config": "the --config the run is given (a preset name or a YAML file's name)",
    "steps": "the --steps it is given",
    "overrides": "{dotted.key: value}, each value a string as the run's --override gives it (true/false for a boolean)",
    "env": "{NAME: value}: the variables the runbook gives the run (the harness passes on no other NSA_* or CONFIG)",
}
