"""Points of one report that ran at different commits of the trainer. A selective re-run (one
phase again after a fix) or a run split over several calls keeps the other points' records, so a
report can join runs of several trees: its verdict then speaks for none of them alone, and a GO
may rest on a point that the newest tree never ran. Pytest points (sanity, selection_parity) test
this repository's code at the commit they record, and preflight points record that commit as the
tree they describe (git describe, collect_env, nvidia-smi at this repository's root): both count
where this repository is the trainer, as the points of this project's trainer do. A preflight at
another commit than the trainer's points described another tree than the one judged."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, where
from validation.judge.provenance import DIRTY, short_commit
from validation.judge.record import TRAINER_KINDS, PhaseRecord

#: the kinds that run at this repository's root and record its commit (validation/launch/kinds.py
#: ``pytest_``: its own tests; ``preflight``: the tree it describes), whatever the runbook's trainer
THIS_REPOSITORY_KINDS = ("pytest", "preflight")


def mixed_commits(records: list[PhaseRecord]) -> list[Finding]:
    """One warning when the points that ran the trainer did so at more than one of its commits:
    each commit with its points, the newest (by the latest start) first. Pytest and preflight
    points count where every trainer point ran this project's trainer, whose tree they test and
    describe; beside a runbook's own trainer they record the harness's repository, not the
    trainer's, and are left out."""
    own = all(r.own_trainer for r in records if r.kind in TRAINER_KINDS and r.out_dir)
    kinds = TRAINER_KINDS + (THIS_REPOSITORY_KINDS if own else ())
    groups: dict[str, list[PhaseRecord]] = {}
    for r in records:
        if r.kind in kinds and r.out_dir and r.ran_at:  # a skipped point ran nothing
            groups.setdefault(r.ran_at, []).append(r)
    if len(groups) < 2:
        return []
    order = sorted(groups, key=lambda sha: max(r.started for r in groups[sha]), reverse=True)
    detail = [f"commit {short_commit(sha)}{' (the newest)' if i == 0 else ''}: "
              + ", ".join(where(r) for r in groups[sha]) for i, sha in enumerate(order)]
    if any(sha.endswith(DIRTY) for sha in order):
        detail.append(f"{DIRTY}: the tree had uncommitted changes when the point ran; which ones no record says, so "
                      f"points of one {DIRTY} commit may have run different code: commit the changes and re-run")
    older = [r for sha in order[1:] for r in groups[sha]]
    phases = list(dict.fromkeys(r.phase for r in older))
    return [Finding(Severity.WARNING, ", ".join(phases),
                    f"the points ran at {len(groups)} commits of the trainer: {len(older)} of them not at the newest, "
                    f"{short_commit(order[0])}, so this verdict is not one commit's",
                    detail, "commits", Facts.of(older[0]))]
