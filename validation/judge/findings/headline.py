"""A point's verdict line: its verdict (PhaseRecord.reason, how the process ended) led by the rank
(and node) its crash or stall finding blames, so that a reader of the first line sees who:
'rank 1 crashed at step 2, stage forward (RuntimeError: boom) — trainer crashed (exit code 1)'.

The rank comes from the point's diagnosis (validation/judge/diagnosis/), which its crash or stall
finding renders too, never from a finding's text, so the verdict line and the finding cannot name
different ranks. It is derived from the stored record when
shown, as every finding is: the stored reason stays how the process ended, and older stores get
their ranks named too.

Of a repeated point, the line names each repeat that failed, the deciding one first, each led by
its own culprit: 'repeat 1 of 3: rank 0 crashed (...) — trainer crashed (exit code 1); repeat 2 of
3: rank 1 crashed (...) — trainer crashed (exit code 1)'. Where no rank crashed (one exited 0 while
the others still needed it), the verdict's 'trainer crashed' reads what happened: 'rank 1 exited 0
early (last heartbeat step 5, stage step) — the other ranks failed without it (exit code 1)'."""
from __future__ import annotations

from validation.judge.diagnosis.crash import killed_alone
from validation.judge.diagnosis.decide import diagnose
from validation.judge.findings.culprit import NO_CRASH, failed_without, text
from validation.judge.findings.finding import own_reason, process, repeat_part
from validation.judge.record import PhaseRecord, Status
from validation.judge.verdict import CRASHED


def culprit_log(rec: PhaseRecord) -> str | None:
    """Of a launch of several nodes: the log of the node the point's verdict blames (the node of the
    culprit's first rank), whose tail and exception the record shows; which agent ended first, and so
    which log the launch handed over, is a race, and a rank that left early did so on a node of its
    own. None where it names no rank, no node, or one of a single node."""
    c, nodes = diagnose(rec), rec.evidence.nodes
    if c is None or nodes is None:
        return None
    node = next((n for r in c.ranks if r.rank is not None and (n := nodes.of_rank(r.rank)) is not None), None)
    return node.log if node is not None else None


def verdict_line(rec: PhaseRecord) -> str:
    """The record's reason, led by who crashed or hung where a finding says; of a repeated point,
    each failed repeat's (``failed_repeats``)."""
    if not repeat_part(rec):
        return _led(rec, rec.reason)
    return "; ".join(f"{part}: {_led(r, reason)}" for part, r, reason in failed_repeats(rec))


def blame(rec: PhaseRecord) -> str:
    """Who the point's failure is blamed on, for the report's status line: its culprit's text ('' where
    no finding names a rank); of a repeated point, each failed repeat by name with its culprit, else
    its reason ('repeat 1 of 3: rank 0 crashed (...); repeat 2 of 3: rank 1 crashed (...)')."""
    if not repeat_part(rec):
        c = diagnose(rec)
        return text(c) if c is not None else ""
    return "; ".join(f"{part}: {text(c) if r is not None and (c := diagnose(r)) is not None else reason}"
                     for part, r, reason in failed_repeats(rec))


def failed_repeats(rec: PhaseRecord) -> list[tuple[str, PhaseRecord | None, str]]:
    """Of a repeated point, each repeat that failed (FAIL or ERROR), the deciding one (the record's
    own) first, else the deciding one alone: (its label, the record as that repeat's process, its
    reason). A repeat of an older harness's record kept no evidence of its own: None, its reason
    alone (no rank is named from evidence that is not its own)."""
    others = [(s.label, process(rec, s) if s.evidence is not None else None, s.reason)
              for s in rec.runs if s.name.startswith("repeat") and s.out_dir != rec.out_dir
              and s.status in (Status.FAIL, Status.ERROR)]
    return [(rec.part, rec, own_reason(rec)), *others]


def _led(rec: PhaseRecord | None, reason: str) -> str:
    c = diagnose(rec) if rec is not None else None
    if rec is not None and (killed := killed_alone(rec)) is not None:
        # a signal ended the process the harness launched: its exit code is the signal's, no crash's
        reason = reason.replace(f"{CRASHED} (exit code", f"{killed.sentence()} (exit code", 1)
    if c is None:
        return reason
    if c.kind in NO_CRASH:  # no process crashed: the one blamed exited 0, the others failed without it
        reason = reason.replace(f"{CRASHED} (exit code", f"{failed_without(c)} (exit code", 1)
    return f"{text(c)} — {reason}"
