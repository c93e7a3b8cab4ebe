"""A point's verdict line: its verdict (PhaseRecord.reason, how the process ended) led by the rank
(and node) its crash or stall finding blames, so that a reader of the first line sees who:
'rank 1 crashed at step 2, stage forward (RuntimeError: boom) — trainer crashed (exit code 1)'.

The rank comes from the finding's own Culprit (culprit.py), never from its text, so the verdict
line and the finding cannot name different ranks. It is derived from the stored record when
shown, as every finding is: the stored reason stays how the process ended, and older stores get
their ranks named too."""
from __future__ import annotations

from validation.judge.findings.culprit import Culprit
from validation.judge.findings.failures import process_crashes, process_stalls
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
    """The record's reason, led by who crashed or hung where a finding says."""
    c = culprit(rec)
    return f"{c.text()} — {rec.reason}" if c is not None else rec.reason
