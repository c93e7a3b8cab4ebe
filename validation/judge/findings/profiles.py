"""Records judged by another profile file than the one they ran with. A store keys a pair by the
profile's name, and a profile file of that name given at a run (`--profile PATH`) may hold other
thresholds than the runbook's built-in profile: a run or report given another `--profile` (the
built-in's name included; without one they keep the store's file) judges every stored record of
the pair by the thresholds of now (store/thresholds.py re-checks the stored values). That is the verdict asked for, but a reader
must see that the thresholds a point ran under are not the ones it is judged by."""
from __future__ import annotations

from validation.judge.findings.finding import Facts, Finding, Severity, where
from validation.judge.record import PhaseRecord


#: points a line names one by one
LISTED = 6


def _listed(records: list[PhaseRecord]) -> str:
    names = [where(r) for r in records]
    return ", ".join(names[:LISTED]) + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def other_profile_files(records: list[PhaseRecord], judged_by: str) -> list[Finding]:
    """One warning naming the records that ran with another profile file than ``judged_by`` (the
    judging profile's name under runbooks/profiles/, or its path), grouped by that file; records
    of harnesses that kept no profile argument say nothing."""
    groups: dict[str, list[PhaseRecord]] = {}
    for r in records:
        if r.profile_arg and r.profile_arg != judged_by:
            groups.setdefault(r.profile_arg, []).append(r)
    if not groups:
        return []
    others = [r for rs in groups.values() for r in rs]
    phases = {r.phase for r in others}
    return [Finding(Severity.WARNING, phases.pop() if len(phases) == 1 else "several",
                    f"{len(others)} point(s) ran with another profile file than this report judges by ({judged_by}): "
                    "their stored values are judged by its thresholds",
                    [f"ran with {arg}: " + _listed(rs) for arg, rs in groups.items()]
                    + [f"to judge them by the file they ran with: nsa-validate report --profile {next(iter(groups))}"],
                    "profile_file", Facts.of(others[0]))]
