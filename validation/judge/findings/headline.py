"""A point's verdict line: its verdict (PhaseRecord.reason, how the process ended) led by the rank
(and node) its crash or stall finding blames, so that a reader of the first line sees who:
'rank 1 crashed at step 2, stage forward (RuntimeError: boom) — trainer crashed (exit code 1)'.

The rank comes from the finding's own Culprit (culprit.py), never from its text, so the verdict
line and the finding cannot name different ranks. It is derived from the stored record when
shown, as every finding is: the stored reason stays how the process ended, and older stores get
their ranks named too.

Of a repeated point, the line names each repeat that failed, the deciding one first, each led by
its own culprit: 'repeat 1 of 3: rank 0 crashed (...) — trainer crashed (exit code 1); repeat 2 of
3: rank 1 crashed (...) — trainer crashed (exit code 1)'."""
from __future__ import annotations

from validation.judge.findings.culprit import Culprit
from validation.judge.findings.failures import process_crashes, process_stalls
from validation.judge.findings.finding import own_reason, process, repeat_part
from validation.judge.record import PhaseRecord, Status


def culprit(rec: PhaseRecord) -> Culprit | None:
    """The rank(s) the point's crash or stall finding blames; None where it names none (or the
    point did not fail so). Of a repeated point, only the repeat its record keeps (and its reason
    names): another repeat's crash is a finding of its own, never this repeat's verdict's cause."""
    if rec.status != Status.FAIL:
        return None
    return next((f.culprit for f in [*process_crashes([rec]), *process_stalls([rec])] if f.culprit is not None),
                None)


def culprit_log(rec: PhaseRecord) -> str | None:
    """Of a launch of several nodes: the log of the node the point's verdict blames (the node of the
    culprit's first rank), whose tail and exception the record shows; which agent ended first, and so
    which log the launch handed over, is a race, and a rank that left early did so on a node of its
    own. None where it names no rank, no node, or one of a single node."""
    c, nodes = culprit(rec), rec.evidence.nodes
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
        c = culprit(rec)
        return c.text() if c is not None else ""
    return "; ".join(f"{part}: {c.text() if r is not None and (c := culprit(r)) is not None else reason}"
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
    c = culprit(rec) if rec is not None else None
    return f"{c.text()} — {reason}" if c is not None else reason
