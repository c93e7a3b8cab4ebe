"""A runbook's phases, sweep points, gates and markers as lines for people
(``nsa-validate phases``)."""
from __future__ import annotations

from nsa.contract import PROFILE_STEPS_ENV
from validation.contract.adapters import format_of
from validation.judge.gates import shown_window
from validation.judge.record import TRAINER_KINDS
from validation.runbook.plan import GOLDEN_RTOL, RESUME_RTOL, expand
from validation.runbook.types import Launcher, Profile, Runbook


def describe(rb: Runbook, prof: Profile, golden_file: str) -> list[str]:
    lines = [f"runbook {rb.name} ({rb.path}); profiles: {', '.join(rb.profiles)}; showing {prof.name}"]
    if rb.trainer is not None:
        t = rb.trainer
        lines.append(f"trainer {t.name}: {' '.join(t.entry)} in {t.root.describe()}, format {format_of(t.adapter)}, "
                     f"phases {', '.join(t.phases)}")
    for phase in rb.phases:
        pts = expand(rb, prof, [phase.name])
        launch = _launch(phase.launcher)
        config = f"config {phase.config}" if rb.trainer is None else f"trainer {rb.trainer.name}"
        # how a runbook's own trainer profiles is its own: the contract asks only for the steps
        profiler = " with torch.profiler" if rb.trainer is None else ""
        what = {"train": f"{launch}, {config}, {phase.steps} steps", "pytest": " ".join(phase.tests),
                "preflight": "git SHA, collect_env, nvidia-smi",
                "profile": f"{launch}, {config}, {phase.steps} steps, {phase.profile_steps} of them profiled{profiler} "
                           f"once steady ({PROFILE_STEPS_ENV}={phase.profile_steps})",
                "resume": f"{launch}, {config}, {phase.steps} steps uninterrupted, and stopped after "
                          f"{phase.resume_after} and resumed"}[phase.kind]
        if phase.repeats > 1:
            what += f", {phase.repeats} repeats of each point"
        lines.append(f"  {phase.name:18s} {phase.kind:9s} {len(pts)} point(s)  timeout {phase.timeout_s:g}s  {what}")
        for g in pts[0].gates():
            thr = "to be measured" if g.threshold is None else f"{g.threshold:g}"
            window = shown_window(g.metric, g.window.describe())
            lines.append(f"      gate: {g.metric} {g.op} {thr}" + (f" ({window})" if window else ""))
        if phase.golden_steps:
            rtol = prof.thresholds.get(GOLDEN_RTOL)
            lines.append(f"      golden: loss of steps 1-{phase.golden_steps} within rel "
                         f"{'to be measured' if rtol is None else f'{rtol:g}'} of {golden_file}")
        if phase.kind == "resume":
            rtol = prof.thresholds.get(RESUME_RTOL)
            lines.append(f"      resume: loss and learning rate per step within rel "
                         f"{'to be measured' if rtol is None else f'{rtol:g}'} of the uninterrupted run, "
                         "the data position continued")
        if phase.kind in TRAINER_KINDS:  # phases that differ only here (a fault each) would read alike
            if phase.overrides:
                lines.append("      overrides: " + " ".join(f"{k}={v}" for k, v in phase.overrides.items()))
            if phase.env:
                lines.append("      env: " + " ".join(f"{k}={v}" for k, v in phase.env.items()))
        if len(pts) > 1:
            lines.append(f"      sweep: {', '.join(p.slug for p in pts)}")
        lines.append(f"      markers: {' '.join(pts[0].markers)}")
    return lines


def _launch(launcher: Launcher) -> str:
    """'python', 'torchrun x2', 'torchrun 2 nodes x1 (c10d localhost:0, join 20s)', 'slurm 2 nodes x4 (c10d on
    the first node, port from the job id, join 60s)'."""
    if launcher.kind == "python":
        return "python"
    if not launcher.nodes:
        return f"torchrun x{launcher.nproc}"
    rdzv = launcher.rdzv
    where = rdzv.endpoint or f"on the first node, port {rdzv.port or 'from the job id'}"
    return f"{launcher.kind} {launcher.nnodes} nodes x{launcher.nproc} (c10d {where}, join {rdzv.join_timeout_s:g}s)"
