"""What to do about each kind of finding, in the seed reports' "Recommendations" spirit, saying
only what is true of the trainer that ran (the finding's ``Facts``): this project's config keys
and its halting behaviour only for this project's trainer, collectives only for several ranks,
stack dumps only where some were written, CUDA graphs only on CUDA."""
from __future__ import annotations

import shlex
from typing import Callable

from nsa.contract import ENV_PROFILE, PROFILE_JSON, PROFILE_STEPS_ENV
from validation.judge.findings.finding import Facts, Finding, LogSays, Severity
from validation.judge.findings.nodes import NODE_ADVICE, STOPPED_ADVICE
from validation.judge.misses import Miss
from validation.judge.stability import LossAfter
from validation.judge.unsteady import Cause, stage_name

#: how to have a stack of each rank taken, where none could be
_TAKE_STACKS = ("install py-spy and let it attach (ptrace; a container needs CAP_SYS_PTRACE), or give the trainer a "
                "SIGUSR1 handler (faulthandler.register)")
#: where advice says how to re-run the phases it names: the command that does
#: (``recommendations``' ``rerun``), with this report's runbook, profile and results directory
_RERUN = "re-run only that phase: {rerun}"


def _senders(signal: str | None) -> str:
    """Who may have sent ``signal``: the kernel's out-of-memory killer sends SIGKILL only, a scheduler
    ends a job past its limit or preempted with SIGTERM (SIGKILL after a grace period)."""
    oom = "the kernel's out-of-memory killer: `dmesg` and the host's memory over the run; "
    return f"{oom if signal in (None, 'SIGKILL') else ''}a scheduler's limit or preemption; a person's kill"


def _crash(f: Facts) -> str:
    if f.maybe_left:
        who = " or ".join(f"rank {k}" for k in f.maybe_left)
        return (f"Read what the ranks that exited non-zero printed in the stderr log named in the finding: where they "
                f"say a collective failed (a peer lost), {who} may have exited 0 early before them (torchrun ended it "
                "with SIGTERM, which tells a rank still running from one still exiting no more than its heartbeats "
                "do): look for a stop condition that holds on that rank only; else fix why they exited. Then "
                f"{_RERUN}.")
    if f.killed:  # a signal leaves no traceback of the trainer's (an agent told to stop prints only its own)
        return (f"{f.killed[0].upper()}{f.killed[1:]}, which leaves no traceback of the trainer's: look for who sent "
                f"it ({_senders(f.killed_by)}), fix, then {_RERUN}.")
    if f.silent:
        return (f"{f.silent[0].upper()}{f.silent[1:]}. Read what it printed in the stderr log named in the finding (and "
                f"any log of its own) for why it exited, fix, then {_RERUN}.")
    if f.log_says == LogSays.ONE_LINE:
        return (f"The trainer ended on an error it printed as one line, no traceback (the finding quotes it): fix what "
                f"it names, then {_RERUN}.")
    if f.log_says == LogSays.NOTHING:
        return (f"The trainer exited non-zero with no traceback and no error line in the stderr log named in the finding: "
                f"read what it printed there (and any log of its own) for why it exited, fix, then {_RERUN}.")
    return f"Read the traceback in the stderr log named in the finding, fix, then {_RERUN}."


def _departed(f: Facts) -> str:
    left = ("A rank exited 0 before the steps asked for while the other ranks still needed it (its own files "
            "show nothing wrong)")
    if f.ending:  # torchrun's SIGTERM came while it was still ending: no exit 0 in the log, no error of its own
        left = ("A rank left its loop before the steps asked for while the other ranks still needed it, and was still "
                "ending (an atexit hook, a logger flushing, an upload) when their collective broke on its closed "
                "connections; torchrun's agent then ended it with SIGTERM, as it ends a rank still running")
    if f.ending and f.suspected:  # the others' words, or several ranks stopped behind, leave a running rank possible
        left += (" (suspected, not shown: where the others' error says only that the connection was lost, check the "
                 "network between the hosts; where several ranks are named, their own logs say which stopped)")
    return (f"{left}: look for a stop condition that holds on that rank only (its data running out first, a step "
            "count or a break of its own, sys.exit in one rank's path); every rank must run the same steps. Then "
            f"{_RERUN}.")


#: why a process's exit aborts, and how not to
_TEARDOWN = ("the C++ runtime aborts a process (SIGABRT, 'terminate called without an active exception') that "
             "destroys a thread still running: at an interpreter's exit, those of a process group never destroyed "
             "(gloo's, NCCL's). Destroy it before the process exits (torch.distributed.destroy_process_group(), "
             "after a last barrier every rank reaches), and stop threads of the trainer's own")


def _aborted(f: Facts) -> str:
    return ("A rank aborted itself (the finding quotes the C++ runtime's last word before its SIGABRT): no one sent "
            "it the signal, and it is not the kernel's OOM killer (SIGKILL). The tail of the stderr log named in "
            "the finding says where it aborted (Python's 'Fatal Python error: Aborted' and the frames listed under "
            f"it; none where the interpreter was exiting): {_TEARDOWN}. Then {_RERUN}.")


def _quit(f: Facts) -> str:
    return ("A rank's code ended before the steps asked for (its heartbeats stop at the step the finding names, "
            "and its abort came with no Python frame running: the interpreter was exiting), while the other ranks "
            "still needed it: look for a stop condition that holds on that rank only (its data running out first, "
            "a step count or a break of its own, sys.exit in one rank's path); every rank must run the same steps. "
            f"Its exit then aborted, a second fault: {_TEARDOWN}. Then {_RERUN}.")


def _waited(f: Facts) -> str:
    return ("A collective gave up waiting past the process group's timeout for the rank the finding names as hung "
            "(gloo raised in the ranks that waited, or the NCCL watchdog took them down): it was still running, "
            "elsewhere, until torchrun ended it (its SIGTERM leaves no stack). Its last heartbeat says where it was: "
            "look at what that rank does there that the others do not (a loop or retry that never ends, I/O, a lock, "
            "a data loader, a collective of its own); or set the phase's stall_s below the process group's timeout, "
            f"so that the harness takes every rank's stack before the timeout fires. Then {_RERUN}.")


def _left_after(f: Facts) -> str:
    return ("A rank exited 0 after its last step while the other ranks still had a collective with it, and they "
            "failed without it: every rank must take part in the same collectives after the training loop too (a "
            "final barrier, an evaluation or checkpoint save that communicates, the process group's teardown), or "
            f"none does. Then {_RERUN}.")


def _stall(f: Facts) -> str:
    if f.loader:
        return ("The rank named waited for its DataLoader's worker processes, and a worker never delivered its batch: "
                "the worker's stack in the finding (its dump lies beside the rank's, under harness_stacks/) says where "
                "the data is stuck, in the dataset's own code (a read from a file system or the network that never "
                "returns, a lock, a decode that loops). Give the DataLoader a `timeout` so that such a wait raises "
                f"in the rank instead of hanging the run. Then {_RERUN}.")
    if f.stopped:
        who = "The rank" if f.world_size == 1 else "A rank"
        waited = "" if f.world_size == 1 else (", and the ranks waiting for it in their collectives waited on a "
                                               "process that could not come, not on steps that diverged")
        return (f"{who}'s process was stopped when the harness came for its stack (the finding names it): a stopped "
                "process runs nothing, so it wrote no further heartbeat and no stack could be taken of it (py-spy cannot read "
                f"it, its own handler cannot run){waited}. {STOPPED_ADVICE} Then {_RERUN}.")
    if f.no_rank_started and f.no_rank_running:
        where = ("No rank started before the harness stopped the run, so there was no stack to take: the nodes' "
                 "torchrun agents never completed their rendezvous. The node finding says how each agent was when the "
                 "harness stopped it (its process state) and whether one gave up. ")
    elif f.no_rank_running:
        where = ("No rank was running when the harness stopped the run, so there was no stack to take: the ranks had "
                 "ended (or never started) while a launcher kept the run open (torchrun's agent waits at its exit "
                 "barrier for the other nodes' agents, srun for its tasks). The finding says how far each rank got "
                 "and how it ended: start from the rank that ended first. ")
    elif f.alone:
        where = ("The one rank still running when the harness came had outlived the other ranks, which had ended "
                 "(the finding says how): nothing waited for it in a collective. Its stack shows where it was once "
                 "the others were done with it: a save, an evaluation or a teardown of its own, a loop, a lock, I/O, "
                 "a thread it joins that never ends; every rank must end after its last step. ")
    elif not f.stacks:
        where = (f"No stack could be taken: {_TAKE_STACKS}; the last heartbeats in the finding say how far each "
                 "process got. ")
    elif f.restarted_in_init:
        where = ("torchrun started the workers again (--max-restarts) and every rank whose stack was taken waited "
                 "in init_process_group: the restarted workers never met in their process group. With torch's default, "
                 "the rendezvous's TCP store shared with the workers, restarted workers can fail to meet there; set "
                 "`TORCH_DISABLE_SHARE_RDZV_TCP_STORE: 1` in the phase's env to give them a store of their own "
                 "(docs/guides/multi-node.md). The earlier attempts' ends in the finding say what the restart was "
                 "for: fix that first. ")
    elif f.world_size == 1:
        where = ("The stack shows where the process waited (a lock, I/O, a data loader, a loop that does not end); "
                 "fix it. ")
    else:
        shown = ("The stack dumps show where each rank waited" if f.stacks >= f.world_size else
                 f"The stacks of {f.stacks} of {f.world_size} ranks (the finding names them) show where they waited")
        if f.before_first_step and f.importing:  # the rank the others waited for was still starting up
            where = (f"{shown}, before any step: the rank the others waited for in their collective "
                     "(init_process_group, a first barrier) was still importing modules (the finding names the module "
                     "and the trainer's line that imported it). Its start-up outlasted the phase's allowance (startup_s, "
                     "else stall_s): on a busy machine or a cold file cache a first import of torch and its extensions "
                     "takes tens of seconds, and more on one rank than another; raise startup_s to fit, or find why "
                     "that rank imports what the others do not or imports it slower. ")
        elif f.before_first_step:  # no step began: the collective is the process group's start, not a step's
            where = (f"{shown}, before any step: a rank inside a collective (init_process_group, a first barrier) "
                     "while another is elsewhere means that one never got there: what it runs first on that rank "
                     "only (a rank-dependent branch, its data set-up, a download, a lock) holds it. ")
        else:
            where = (f"{shown}: a rank inside a collective while another is elsewhere means the ranks' steps diverged "
                     "(a rank-dependent branch, data or shape), or that one is stuck in code of its own (a loop or "
                     "retry that never ends, I/O or a lock that never returns): its stack shows which. ")
    return where + f"Then {_RERUN}."


def _importing(f: Facts) -> str:
    every = "The process was" if f.world_size == 1 else "Every rank was"
    when = ("Before the first step that is a start-up longer than the phase allows (its startup_s, else stall_s): a "
            "first import of torch and its extensions (Triton, transformers, a compiler's caches) takes tens of "
            "seconds on a busy machine or a cold file cache. Raise the phase's startup_s to fit the start-up (or run "
            "on a quiet machine, where the finding about a busy machine names one); where it stays slow, the module "
            "the finding names is where the time goes" if f.before_first_step else
            "After the steps began, an import that does not return holds the run: a lock another thread holds "
            "(an import from a thread while the main thread imports), a module read from a network file system that "
            "stopped answering, module-level code that waits")
    return (f"{every} still importing modules when the harness stopped the run (the finding names the module each "
            "ran and the trainer's line that imported it), and none waited in a collective for another. "
            f"{when}. Then {_RERUN}.")


def _diverged(f: Facts) -> str:
    return ("Every rank waited in a collective, not all in the same one (the finding names each call site): the "
            "ranks' collectives went out of step, a collective that some ranks call and the others do not (one "
            "inside a rank-dependent branch, a metric or a barrier synced on one rank only, a step or a micro-batch "
            "one rank skips) or the same collectives in another order. Where the finding names a rank off the common "
            "path, start at its call site; where it cannot (two ranks), compare the two call sites. "
            "`TORCH_DISTRIBUTED_DEBUG: DETAIL` in the phase's env has torch check that the ranks call the same "
            "collectives with the same shapes, raising on the first mismatch it sees (it slows every collective: "
            "for this run only). "
            f"Then {_RERUN}.")


def _mismatch(f: Facts) -> str:
    return ("A check of the collectives ended the run: the ranks' collectives did not match (a collective one rank "
            "calls and the others do not, in a rank-dependent branch or a metric synced on one rank only, or one "
            "called with another size or type). The rank the check ended is where it was detected, not the culprit: "
            "gloo's size check aborts whichever rank received the message of the other size. Where the finding "
            "names a rank off the common path, start at its call site; where it cannot (two ranks), compare the call "
            "sites it names. `TORCH_DISTRIBUTED_DEBUG: DETAIL` in the phase's env has torch name each rank's "
            "collective, shape and type at the first mismatch (it slows every collective: for this run only). "
            f"Then {_RERUN}.")


def _out_of_step(f: Facts) -> str:
    did = ("waited in a collective, with no partner left, until the harness stopped the run (a collective without its "
           "partner waits under NCCL, where gloo's fails), " if f.waiting else "failed in a collective ")
    # of the ranks beside one that left and was still ending when torchrun's agent ended it (Facts.ending)
    left = "left (it was still ending when torchrun's agent ended it)" if f.ending else "exited 0"
    head = (f"A rank {did}within a step that another rank had completed before it {left} (the finding names both): "
            f"the {'rank that left' if f.ending else 'exited rank'} had called every collective of that step, so the "
            "ranks' collectives were out of step. ")
    if f.suspected:  # no stack shows the rank in a collective: its heartbeat alone says where it was
        head = ("A rank was still running within a step that another rank had completed before it exited 0, and no "
                "stack of it could be taken (the finding names both): it may have waited in a collective of that step "
                "with no partner left (the ranks' collectives out of step), or hung of its own after its part in that "
                f"step's collectives. Its stack tells which: {_TAKE_STACKS}. Where it waited in a collective: ")
    return (f"{head}Earlier in the run one rank called a collective the others did not, or skipped one they "
            "called; one of the same size pairs silently with the others' next collective, so nothing failed where it "
            "went wrong, and each collective after it met the other rank's next one, so the sums from there on mixed "
            "the ranks' different steps. Look for a "
            "collective called on some ranks only: one inside a rank-conditional branch (a loss or metric all-reduced "
            "again for logging on one rank, `if rank == 0: dist.barrier()`), or a step or micro-batch one rank skips. "
            "`TORCH_DISTRIBUTED_DEBUG: DETAIL` in the phase's env has torch check each collective's op and shapes across "
            "the ranks and raise at the first that differs, naming each rank's (it slows every collective: for this run "
            "only); it does not catch an extra collective of the same op and shape. "
            f"Then {_RERUN}.")


def _silent_rank(f: Facts) -> str:
    return ("A rank's heartbeats stopped while the other ranks went on past its step: the other ranks did not wait "
            "for it (a trainer whose ranks do not synchronise every step, or a loop of that rank's own), so the run "
            "kept making progress around a rank that made none. Its stack in the finding shows where it was: a loop "
            "or retry that never ends, I/O, a lock, a data loader, a collective of its own that no other rank joins. "
            "Where its stack shows it in its training step instead, it trained on and stopped writing its heartbeat "
            "file (a writer turned off, closed or failing on that rank): the contract asks every rank for a record of "
            f"each step it logs. Then {_RERUN}.")


def _halt_stall(f: Facts) -> str:
    return ("A rank did not exit after the trainer's .HALT on the non-finite loss (the finding names where it was), "
            "and the others waited for it in their collective until the harness stopped the run: a rank that halts "
            "must exit (the contract's exit code 4), so that torchrun ends the ranks still waiting; or every rank "
            "checks the same loss (all-reduced) and they halt together. The non-finite loss itself is the finding "
            f"to fix first. Then {_RERUN}.")


def _lower(f: Facts) -> str:
    """What to change of a run whose loss went non-finite: this project's keys only for its trainer."""
    return "lower train.lr or keep train.grad_clip on" if f.own_trainer else \
        "lower the trainer's learning rate or clip its gradients"


def _nonfinite(f: Facts) -> str:
    lower = _lower(f)
    if f.stopped_nonfinite:  # exit 4 is its word that it stopped on the loss; the .HALT would say where
        return (f"The trainer stopped on a non-finite loss (the contract's exit code 4) and wrote no .HALT: the contract "
                "asks for both, the .HALT (source nonfinite) saying the step and each rank's loss, so make it write "
                f"one. Then {lower}, and check the data of the step it stopped at (its last heartbeat's).")
    if not f.halted_nonfinite:
        went_on = {
            LossAfter.RECOVERED: (", yet the losses it logged after the last non-finite one are finite: the weights "
                                  "did not keep non-finite values (that step's update was skipped, or only the loss "
                                  "it logged was not finite). Make it stop on a non-finite loss, or skip such a step "
                                  "on purpose and say so in its log"),
            LossAfter.STAYED: (", and every loss it logged after it is non-finite too: the run trained on non-finite "
                               "values from there, so make it stop on the first"),
            LossAfter.RECURRED: (", and it logged non-finite losses again after finite ones, its last logged loss "
                                 "among them, so make it stop on the first"),
            None: ": make it stop there",
        }[f.loss_after]
        return (f"The loss went non-finite and the trainer did not stop on it (no .HALT){went_on}; {lower}, and "
                "check the data of the step named.")
    if f.own_trainer:
        return (f"The loss went non-finite: {lower}, and check the data of the step named; the run halted before "
                "the optimizer step, so its last checkpoint is clean.")
    return (f"The loss went non-finite: {lower}, and check the data of the step named; whether its last checkpoint "
            "predates the bad step is the trainer's to say.")


def _halted(f: Facts) -> str:
    if f.stopped_nonfinite:  # exit 4: its non-finite guard wrote the .HALT, cut short before its source
        return ("The trainer stopped on a non-finite loss (the contract's exit code 4), and the .HALT its non-finite "
                "guard wrote is cut short before its source (the finding quotes it): make it write the .HALT whole "
                "(to a temporary file, then renamed into place), so that its source, step and each rank's loss are "
                f"read. Then {_lower(f)}, check the data of the step it stopped at, and {_RERUN}.")
    return ("The trainer stopped on a .HALT that neither its watchdog nor its non-finite guard wrote (the finding "
            "quotes it): an operator's stop, or a stop condition of the trainer's own. A run that halts is not the run "
            "asked for, whatever its gates, and a trainer that ran all its steps leaves no .HALT (the contract reads "
            "any as a stop). Read why in the .HALT and the stderr log named in the finding; once the stop's cause is "
            f"gone (or the stop was an operator's, deliberate), {_RERUN}.")


def _short_rank(f: Facts) -> str:
    return ("A rank's heartbeats end before the run's last step, and the run exited 0. Either "
            "the rank exited early and no collective after it left told the others: look for a stop condition that "
            "holds on that rank only (its data running out first, a step count or a break of its own, sys.exit in "
            "one rank's path); every rank must run the same steps. Or it trained on and stopped writing its "
            "heartbeat file (a writer turned off, closed or failing without a word on that rank): the contract asks "
            "every rank for a record of each step it logs, its last one included; ranks that share a collective "
            "every step (DDP) say it is this. The finding says which where the harness saw the rank's process "
            f"(the pid of its heartbeats) exit early. Then {_RERUN}.")


def _csv_ahead(f: Facts) -> str:
    return ("training.csv logs steps that no rank's heartbeats reach, rank 0's (which writes it) included: the "
            "files disagree on how far the run got, and the steps gates read the CSV's. Compare the CSV's step "
            "column with the steps the trainer ran: a logged number that is not the step (a count of micro-batches, "
            "samples or tokens, a step scaled or offset) makes it run ahead; else the ranks' heartbeat writer "
            "stopped while they trained on (the contract asks every rank for a record of each step it logs). Fix "
            f"whichever file is wrong, then {_RERUN}.")


def _short(f: Facts) -> str:
    how = ("check --steps and any stop condition in its log" if f.own_trainer
           else "check that the runbook's `trainer.steps` reaches it, and any stop condition of its own")
    return (f"The trainer exited 0 before the steps asked for, without a .HALT: {how} (stderr log named in the "
            f"finding); then {_RERUN}.")


def _long(f: Facts) -> str:
    how = ("check --steps and any step count in its config" if f.own_trainer
           else "check that the runbook's `trainer.steps` reaches it and that nothing of its own (a step count set in "
                "its code or config, a flag given twice) overrides it")
    return f"The trainer ran past the steps asked for: {how}; then {_RERUN}."


def _cliff(f: Facts) -> str:
    return ("Throughput collapses at a larger shape: compare that point's peak memory and step time with the one "
            "before (allocator thrash or recompilation); run the two points alone with their lines under Reproduce.")


def _host_bound(f: Facts) -> str:
    if f.cuda and f.own_trainer:
        return ("Step time does not grow with the batch: keep train.cuda_graphs on (auto on CUDA), or raise tokens "
                "per step (batch or sequence length) until the GPU sets the pace.")
    return ("Step time does not grow with the batch: a fixed cost per step sets the pace; raise tokens per step "
            "(batch or sequence length), or cut the per-step work that does not grow with it.")


def _idle(f: Facts) -> str:
    pinning = "check device pinning (CUDA_VISIBLE_DEVICES, LOCAL_RANK)" if f.cuda else "check that every rank gets data"
    return f"A rank did no work: {pinning} and, under FSDP, that every block is its own sharded unit."


def _imbalance(f: Facts) -> str:
    shared = ("a shared or throttled GPU (nvidia-smi in the preflight record)" if f.cuda
              else "cores shared with other work")
    return f"One rank is slower: look for {shared} or uneven data per rank."


def _straggler_rank(f: Facts) -> str:
    shared = ("a shared or throttled GPU (nvidia-smi in the preflight record; its clocks and temperature)" if f.cuda
              else "cores shared with other work")
    return (f"One rank comes late to every step; where the others wait for it (the finding says whether its "
            f"heartbeats show it), the whole run goes at its pace: look for {shared}, more or longer data on that "
            "rank, or work only it does (logging, evaluation, a save on rank 0).")


def _fallback(f: Facts) -> str:
    if f.own_trainer:
        return ("An attention branch ran on a slower backend than 'auto' wanted: the route's reason names what was "
                "missing; install or enable it, or set the branch's backend explicitly.")
    return "The trainer counted fallbacks to a slower path: its counters, named in the finding, say which."


def _artifacts(f: Facts) -> str:
    return "The trainer broke its output contract (the finding names the file): fix the writer, then " + _RERUN + "."


_RERUN_POINT = "re-run only that point with the pytest line the finding gives (and the same --results-dir)"


def _not_launched(f: Facts) -> str:
    return ("The point never started: its launch failed before any trainer process ran, so no file of the trainer "
            "is missing and no gate measured it. The finding gives the launcher's command and error, and the files "
            "holding its output: fix what it names (the allocation asked for against what the cluster grants, a "
            "path, the trainer's root or entry), then "
            + _RERUN_POINT + ".")


def _harness_error(f: Facts) -> str:
    return ("The harness itself failed on the point (a defect of the harness, not of the trainer; its processes "
            "were killed): the traceback file named in the finding says where; report it with that file. Once "
            "fixed, " + _RERUN_POINT + ".")


def _tests_failed(f: Facts) -> str:
    return ("Tests of this repository failed (no trainer ran: the point runs a pytest suite): the JUnit XML and "
            "pytest's output named in the finding say which and why. Run them alone with the command the finding "
            "gives, fix the code or the test, then " + _RERUN_POINT + ".")


def _tests_not_run(f: Facts) -> str:
    paths = (" A test path of the phase's `tests:` is not in this checkout (the finding names it): paths are "
             "relative to the repository root; fix the runbook's phase or check out the tree that has them."
             if Miss.TEST_PATHS in f.misses else "")
    return ("pytest could not run the phase's tests (no trainer ran, and no test outcome was counted): the "
            f"finding gives pytest's exit status and its output.{paths} Check the phase's `tests:` and "
            "`pytest_args:` (-k/-m that select at least one test) with the command the finding gives, then "
            + _RERUN_POINT + ".")


def _no_junit(f: Facts) -> str:
    return ("pytest ended without a readable JUnit XML, so no test outcome was counted (no trainer ran): something "
            "ended pytest before it wrote the file (os._exit or sys.exit in a test or conftest, a plugin, a killed "
            "process). pytest's output named in the finding shows how far it got; run the tests alone with the "
            "command the finding gives, then " + _RERUN_POINT + ".")


#: why a preflight command does not finish, and how to find which
_PREFLIGHT_SLOW = ("Run each by hand on this machine to see which: git on a hung or slow filesystem (a network "
                   "mount) or waiting at a prompt; collect_env importing torch on a loaded machine; nvidia-smi on a "
                   "GPU or driver that no longer answers (look for Xid errors in `dmesg`). Raise the phase's "
                   "timeout_s where the command is only slow.")


_PREFLIGHT = {
    Miss.GIT_SHA: "the commit: `git describe` failed in the repository root (not a git checkout, git not installed, or "
                  "a repository git refuses as another user's: `git config --global --add safe.directory <root>`) "
                  "and no SOURCE_SHA stamp names it; run from a clone, or stamp a tree before copying it "
                  "(`git describe --always --dirty --abbrev=40 > SOURCE_SHA` in the clone, nsa/provenance.py)",
    Miss.COLLECT_ENV: "collect_env: `python -m torch.utils.collect_env` failed (its log named in the finding; a "
                      "broken torch install)",
    Miss.NVIDIA_SMI: "nvidia-smi: not installed or failed on a CUDA profile (the driver's tools missing, or no GPU "
                     "visible to this process)",
    Miss.TIMED_OUT: "a command that did not finish within its time (a third of the phase's timeout_s, at least 5 s; "
                    "the finding names it) and was killed, not one that failed: " + _PREFLIGHT_SLOW[0].lower()
                    + _PREFLIGHT_SLOW[1:].rstrip("."),
}


def _tests_timeout(f: Facts) -> str:
    return ("pytest was still running when the phase's timeout_s ran out (no trainer ran: the point runs this "
            "repository's tests), so no test outcome was counted. Its output named in the finding shows how far it "
            "got: run the tests alone with the command the finding gives (add `-v --durations=10` to "
            "see where the time goes). A test that hangs (a lock, a subprocess or socket that never answers, a "
            "GPU that does not) is a defect to fix; a suite that is only slow needs a larger timeout_s in the "
            "runbook's phase. Then " + _RERUN_POINT + ".")


def _preflight_timeout(f: Facts) -> str:
    return ("Preflight was still running when the phase's timeout_s ran out (no trainer ran): one of its commands "
            "(git describe, collect_env, nvidia-smi) did not finish. " + _PREFLIGHT_SLOW + " Then "
            + _RERUN_POINT + ".")


def _preflight(f: Facts) -> str:
    what = "; ".join(_PREFLIGHT[m] for m in dict.fromkeys(f.misses)) or "see the finding"
    return (f"Preflight could not record what it names (no trainer ran): {what}. Fix that on this machine, then "
            + _RERUN_POINT + ".")


def _regression(f: Facts) -> str:
    commits = ("this repository's commits between the baseline's and this one" if f.own_trainer
               else "the trainer's commits between the baseline's and this one (this repository's commits change "
                    "only the harness)")
    return ("Throughput fell against the baseline: re-run the phase ({rerun}) to rule out noise, then "
            f"bisect {commits}; a drop that is intended needs a new baseline directory, not a looser threshold.")


def _not_comparable(f: Facts) -> str:
    return ("This run's numbers and the baseline's do not compare, for the reason the finding names: the runbook "
            "asked the runs differently or over other steps (compare with a baseline run of the runbook as it is "
            "now, the baseline's commit run into a new results directory, or run this commit with the baseline's "
            "runbook), or other work on the machine may explain the drop (re-run both on a quiet machine).")


def _gate(f: Facts) -> str:
    return ("A gate failed: compare the value with its threshold (the profile's where the Gates table names a "
            "profile key beside it, else the runbook's own), and " + _RERUN
            + " once the cause is fixed; other points' records stay.")


#: what a stage's own work is, where advice names the stage that grew
_STAGE_WORK = {"data": "the data loader (its prefetch running dry, reading or tokenizing more for those steps)",
               "checkpoint": "writing the checkpoint (its size, the disk it goes to)",
               "step": "the trainer between steps (logging, printing, evaluation)"}


def _unsteady(f: Facts) -> str:
    """Of a failed toks_per_s_cv gate whose slow steps the heartbeats place: what each cause found
    (judge/unsteady.py ``Cause``) points at, and a re-run of the point wherever a slow step's time is
    not one stage's work (only a re-run tells a one-off from the run's own)."""
    u = f.unsteady
    if u is None:
        return _gate(f)
    if u.drift is not None and u.drift.rho > 0:
        return ("The window's step time rose step after step, not in a few slow steps: something grew through the "
                "run. Look at what grows with the steps in training.csv (mem_alloc_gb and mem_reserved_gb near the "
                "device's limit, where the allocator retries), at a data loader that drains its prefetch, and at the "
                "device's clocks as it heats" + (" (`nvidia-smi -q -d CLOCK,TEMPERATURE`)" if f.cuda else "") + ".")
    if u.drift is not None:
        return ("The window's step time fell step after step: the window still holds the warm-up (compilation, "
                "autotuning, a CUDA graph's capture, caches filling). Run more steps, so that the gate's window "
                "starts after it, or measure where the steps level off in training.csv.")
    said = []
    if Cause.WHOLE_HOST in u.causes:
        said.append("In a slow step every host stage grew at once: the trainer's process, or the machine under it, "
                    "stalled (a garbage collection, another thread holding the GIL, other work on the machine), not "
                    "one stage's work; look for other work on the machine while the point runs (`top`"
                    + (", `nvidia-smi`" if f.cuda else "") + ").")
    for stage in u.stages:
        work = _STAGE_WORK.get(stage, f"the {stage} stage")
        said.append(f"In a slow step {stage_name(stage)} took longer than in the others: look at what {work} does "
                    "in those steps and not in the rest.")
    if Cause.GPU_WAIT in u.causes:
        device = "other work on the GPU (`nvidia-smi`), its clocks or temperature" if f.cuda else "other work on it"
        said.append(f"In a slow step only the wait for the device's work grew: that work took longer ({device}), or "
                    "the host stalled inside that span alone, which heartbeats cannot tell apart.")
    if Cause.UNCLEAR in u.causes or Cause.NO_STAGES in u.causes:
        said.append("The heartbeats place a slow step's time in no one stage.")
    if set(u.causes) - {Cause.STAGE}:
        said.append("Re-run the point (the re-run line in the finding): slow steps that do not come back were a "
                    "one-off of that moment, ones that do are the run's own.")
    return " ".join(said)


def _golden(f: Facts) -> str:
    how = ("; for this project's trainer on one H100, bench/gpu/golden_losses.sh runs it three times and prints "
           "the spread") if f.own_trainer else ""
    return ("The loss left its golden curve at the step named, by more than the run-to-run spread the tolerance "
            "allows. The finding names the golden's commit and this run's: where the trainer's numerics changed "
            "on purpose between them (kernels, defaults, data), check that this commit repeats itself (the phase's "
            f"`repeats: 2` gates its runs against each other{how}), then bless a new golden (`nsa-validate bless "
            "{bless}` with the same --runbook, --profile and --results-dir); otherwise bisect the commits "
            "between the two.")


def _commits(f: Facts) -> str:
    return ("Points of this report ran at different commits of the trainer (kept records of earlier runs): re-run "
            "the phases named, which ran at an older commit ({rerun}), so that the verdict is the newest commit's alone.")


def _repeats(f: Facts) -> str:
    keys = (" train.deterministic=true must give identical runs: a difference is a defect of this project's "
            "kernels or trainer (nsa/kernels/, nsa/train/determinism.py).") if f.own_trainer else ""
    return ("Runs of one commit with one seed gave different losses: something in the step is not deterministic "
            "(atomic adds in kernels, an unseeded random number, the data order, a collective's reduction order), "
            f"so no golden curve can hold for it.{keys} Find the first differing step the finding names, then "
            + _RERUN + ".")


def _spike(f: Facts) -> str:
    lr = "lower train.lr or lengthen train.warmup_steps" if f.own_trainer else "lower the learning rate"
    return ("A step's loss or gradient norm jumped far above the steps before it: look at the data of the step "
            f"named (a bad batch); if spikes recur, {lr} and keep gradient clipping on.")


def _level_shift(f: Facts) -> str:
    return ("The loss or gradient norm rose at the step the finding says it began and stayed up over the steps "
            "after it: a lasting change, not one bad batch. Look at what changed at that step: the data (a new shard, "
            "source or mixture), the learning rate or its schedule, the model or its precision, a restart of the "
            "trainer from a checkpoint; the trainer's log and config at that step say which.")


def _resume_shift(f: Facts) -> str:
    return ("The loss or gradient norm rose at the first step after the resume and stayed up, where the "
            "uninterrupted run of the same seed has no such rise: what changed there is the resume, not the data of "
            "that step. The resumed process does not continue the state the run stopped in (the checkpoint's model, "
            "optimizer state, learning-rate schedule position, data position, RNG), or computes its steps "
            "differently from the first half; the resume gates compare the two runs step by step. Then "
            f"{_RERUN}.")


def _diverging(f: Facts) -> str:
    lr = "train.lr, train.warmup_steps and train.grad_clip" if f.own_trainer else "the learning rate, its warm-up and gradient clipping"
    return (f"The loss climbs without going NaN: a run that diverges does not recover by itself; check {lr}, and "
            "that the data does not change under the run, before a long run.")


def _resume(f: Facts) -> str:
    keys = (" (train.resume; the data position and every rank's RNG are in nsa/train/checkpoint.py)" if f.own_trainer
            else "")
    return ("The resumed run left the uninterrupted one at the step named: the checkpoint does not restore all the "
            "state the run had (model, optimizer, learning-rate schedule position, data position, every rank's RNG)"
            f"{keys}. A divergence at the first step after the resume points at the restore; the finding says "
            f"whether the learning rate and the data position continued. Then {_RERUN}.")


def _ran_past_stop(f: Facts) -> str:
    how = "train.run_steps" if f.own_trainer else "the option the runbook's `trainer.resume.stop_after` names"
    return (f"The first half was asked to stop after a step ({how}) and went on: make the trainer stop after that "
            f"step and save its checkpoint there, as a preempted run does. Then {_RERUN}.")


def _not_resumed(f: Facts) -> str:
    how = "train.resume" if f.own_trainer else "the option the runbook's `trainer.resume.from` names"
    return (f"The second half was given the first half's directory ({how}) and trained steps its checkpoint already "
            "held: make the trainer load the checkpoint from there and go on from the step after it, and exit "
            "non-zero where it cannot load it rather than start afresh (the logs named in the finding may say what it "
            "did). A long run restarted from its checkpoint would start over the same way, and where its steps are "
            f"deterministic its loss curve does not show it. Then {_RERUN}.")


def _resumed_in_place(f: Facts) -> str:
    return ("A trainer process started again mid-run from its checkpoint: find in the trainer's log why the one "
            "before it ended (a crash, a killed rank, a requeue) and fix that; a run of days meets it again. Then "
            f"{_RERUN}.")


def _memory_growth(f: Facts) -> str:
    where = ("torch.cuda.memory_summary() or a memory snapshot (torch.cuda.memory._record_memory_history) at two "
             "steps of the growing rank" if f.cuda else "the tensors the growing rank holds alive at two steps")
    return ("Memory kept growing at the rate the finding gives: a run of days meets the step named, where it says "
            "one. Look for what the growing rank keeps from step to step (tensors held with their graph, such as a "
            f"loss summed without .item() or .detach(), lists of per-step values, caches), comparing {where}.")


def _slowdown(f: Facts) -> str:
    return ("Tokens/s fell during the run and stayed down: a long run goes on at the later rate. Look at what "
            "changes at the step named: memory near the device's limit (the allocator's retries, fragmentation), "
            "a data loader that drains its prefetch, checkpoints or evaluation that start, another job on the "
            "machine; the per-rank heartbeats say whether one rank fell behind.")


def _timeout(f: Facts) -> str:
    return ("The run was still making steps when the phase's timeout stopped it: raise the phase's timeout_s to fit "
            "its steps at the pace its table shows (or ask for fewer steps), and compare that pace with earlier runs. "
            f"Then {_RERUN}.")


def _clock(f: Facts) -> str:
    sync = (" and synchronise the device before reading the clock (torch.cuda.synchronize(): its kernels still run "
            "after the Python that launched them returned)" if f.cuda else "")
    return ("The trainer's step timer leaves out part of each step, so its tokens/s and step times overstate the run: "
            "time the whole step, from the end of the step before to the end of this one (data, forward, backward, "
            f"optimizer){sync}, and compute toks_per_s from that time. Then {_RERUN}.")


def _timing(f: Facts) -> str:
    return ("Timed points ran at the same time on one machine (another harness process beside this one: a second "
            "`nsa-validate run`, or pytest -n), so their speeds are not comparable: re-run them with no other run "
            "on the machine.")


def _no_profile(f: Facts) -> str:
    return (f"The trainer did not honour the profile request: on {PROFILE_STEPS_ENV}=N in its environment, it "
            f"profiles N steps once the run is steady and writes {PROFILE_JSON} into its output directory "
            "(docs/artifact_contract.md); a trainer that cannot profile says why in env.json's "
            f"`{ENV_PROFILE}` note. Then {_RERUN}.")


def _not_profiled(f: Facts) -> str:
    return ("The trainer says why it profiled nothing (the finding quotes it): where the run ends before its first "
            f"steady step, give the phase more `steps` than the trainer's warm-up, then {_RERUN}.")


def _busy_machine(f: Facts) -> str:
    return ("Other processes kept the machine's cores busy while these timed points ran, so their speeds measure "
            "that work too: re-run them on a quiet machine (no other test run or job beside them; `uptime`'s load "
            "below the number of cores).")


_ADVICE: dict[str, Callable[[Facts], str]] = {
    "crash": _crash, "aborted": _aborted, "quit": _quit, "departed": _departed, "waited": _waited, "left_after": _left_after, "stall": _stall,
    "timeout": _timeout, "silent_rank": _silent_rank, "diverged": _diverged, "mismatch": _mismatch,
    "out_of_step": _out_of_step, "importing": _importing,
    "nonfinite": _nonfinite, "halt_stall": _halt_stall,
    "halted": _halted, "short_run": _short, "long_run": _long, "short_rank": _short_rank, "csv_ahead": _csv_ahead, "cliff": _cliff,
    "host_bound": _host_bound, "idle": _idle, "imbalance": _imbalance, "straggler_rank": _straggler_rank, "fallback": _fallback,
    "artifacts": _artifacts, "not_launched": _not_launched, "harness_error": _harness_error,
    "tests_failed": _tests_failed, "tests_not_run": _tests_not_run, "no_junit": _no_junit, "preflight": _preflight,
    "tests_timeout": _tests_timeout, "preflight_timeout": _preflight_timeout, "regression": _regression,
    "not_comparable": _not_comparable,
    "gate": _gate, "unsteady": _unsteady, "golden": _golden, "repeats": _repeats, "commits": _commits, "timing": _timing,
    "busy_machine": _busy_machine, "no_profile": _no_profile, "not_profiled": _not_profiled, "clock": _clock, "spike": _spike, "level_shift": _level_shift,
    "resume_shift": _resume_shift,
    "diverging": _diverging, "resume": _resume, "slowdown": _slowdown,
    "ran_past_stop": _ran_past_stop, "not_resumed": _not_resumed,
    "resumed_in_place": _resumed_in_place, "memory_growth": _memory_growth,
    # a node's advice says the same for any trainer (nodes of one launch are torchrun's, not its)
    **{kind: (lambda f, text=text: text) for kind, text in NODE_ADVICE.items()},
}


def same_options(phases: list[str]) -> str:
    """How advice re-runs ``phases`` where the report's runbook and store are not known."""
    return f"`pytest -m {shlex.quote(' or '.join(phases))}` with the same --runbook, --profile and --results-dir"


def recommendations(findings: list[Finding], rerun: Callable[[list[str]], str] = same_options) -> list[str]:
    """One line of advice per kind of problem and what is true of its runs (phases named),
    critical first; findings whose facts give the same advice share its line. ``rerun``: the
    command (Markdown) that re-runs the phases given, every one of them: the report's has its
    runbook, profile and results directory (without --runbook, ``pytest -m PHASE`` runs the
    default runbook's phase of that name, or none)."""
    phases: dict[str, list[str]] = {}
    for f in findings:
        if f.kind in _ADVICE and f.severity != Severity.INFO:
            names = phases.setdefault(_ADVICE[f.kind](f.facts), [])
            for name in f.phase.split(", "):  # a finding across phases names them all
                if name not in names:
                    names.append(name)
    return [f"{', '.join(names)}: " + advice.replace("{rerun}", rerun(names)).replace(
        "{bless}", " ".join(f"--phase {n}" for n in names)) for advice, names in phases.items()]
