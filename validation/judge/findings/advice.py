"""What to do about each kind of finding, in the seed reports' "Recommendations" spirit."""
from __future__ import annotations

from validation.judge.findings.finding import Finding, Severity
from validation.judge.findings.nodes import NODE_ADVICE

_ADVICE = {
    "crash": "Read the failing rank's traceback (the stderr log named in the finding), fix, then re-run only "
             "that phase: `pytest -m {phase}` with the same --profile and --results-dir.",
    "stall": "The stack dumps show where each rank waited: a rank inside a collective while another is elsewhere "
             "means the ranks' steps diverged (a rank-dependent branch, data or shape); rerun `pytest -m {phase}`.",
    "stall_one_process": "The stack shows where the process waited (a lock, I/O, a data loader, a loop that does not "
                         "end); fix it, then rerun `pytest -m {phase}`.",
    "stall_no_stacks": "No stack could be taken: install py-spy and let it attach (ptrace; a container needs "
                       "CAP_SYS_PTRACE), or give the trainer a SIGUSR1 handler (faulthandler.register); the last "
                       "heartbeats in the finding say how far each process got; rerun `pytest -m {phase}`.",
    "nonfinite": "The loss went non-finite: lower train.lr or keep train.grad_clip on, and check the data of the "
                 "step named; the run halted before the optimizer step, so its last checkpoint is clean.",
    "cliff": "Throughput collapses at a larger shape: compare that point's peak memory and step time with the one "
             "before (allocator thrash or recompilation); run the two points alone with `pytest -m {phase} -k ...`.",
    "host_bound": "Step time does not grow with the batch: keep train.cuda_graphs on (auto on CUDA), or raise "
                  "tokens per step (batch or sequence length) until the GPU sets the pace.",
    "idle": "A rank did no work: check device pinning (CUDA_VISIBLE_DEVICES, LOCAL_RANK) and, under FSDP, that "
            "every block is its own fully_shard unit.",
    "imbalance": "One rank is slower: look for a shared or throttled GPU (nvidia-smi in the preflight record) or "
                 "uneven data per rank.",
    "fallback": "An attention branch ran on a slower backend than 'auto' wanted: the route's reason names what was "
                "missing; install or enable it, or set the branch's backend explicitly.",
    "artifacts": "The trainer broke its output contract (the finding names the file): fix the writer, then re-run "
                 "`pytest -m {phase}`.",
    "regression": "Throughput fell against the baseline: re-run the phase on this commit (`pytest -m {phase}`) to "
                  "rule out noise, then bisect the commits between the baseline's and this one; a drop that is "
                  "intended needs a new baseline directory, not a looser threshold.",
    "gate": "A gate failed: compare the value with the threshold's source (the profile file), and re-run only "
            "`pytest -m {phase}` once the cause is fixed; other points' records stay.",
    **NODE_ADVICE,
}


def recommendations(findings: list[Finding]) -> list[str]:
    """One line of advice per kind of problem found (phases named), critical first."""
    phases: dict[str, list[str]] = {}
    for f in findings:
        if f.kind in _ADVICE and f.severity != Severity.INFO:
            names = phases.setdefault(f.kind, [])
            if f.phase not in names:
                names.append(f.phase)
    return [f"{', '.join(names)}: {_ADVICE[kind].format(phase=names[0])}" for kind, names in phases.items()]
